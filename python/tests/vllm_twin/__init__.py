"""A twin of vLLM's engine loop for kvtier's connector, for the vLLM revisions whose code the
tests cannot run (python/tests/vllm_real runs vLLM's own code at the vendored commit; the
scenarios that do not depend on the revision live there).

``stub/vllm`` is a stand-in for the vLLM modules the connector touches, at vLLM's module paths;
``twin`` is an engine built on it the way vLLM builds one: a scheduler that calls the connector
on vLLM's code paths with vLLM's assertions raised, and tensor-parallel worker processes that
build the connector through vLLM's factory and call it in the model runner's order on
shared-memory KV caches. The modelled vLLM revisions are named in ``stub/vllm/_twin.py``.
The scenarios (``test_*.py``) run against a real kvtier sidecar.
"""
