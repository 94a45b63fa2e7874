"""kvtier for vLLM: the protocol client of the kvtier sidecar, its chunk hasher and namespace
derivation (docs/protocol.md), and vLLM's KV connector (``kvtier_vllm.connector``).

Importing this package needs pyzmq only; torch and vLLM are imported lazily where needed.
"""

__version__ = "0.1.0"
