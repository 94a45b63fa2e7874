"""Disaggregated prefill (docs/fleet.md "Disaggregated prefill"): what a producer engine
(``kv_role: kv_producer``) names in a finished request's ``kv_transfer_params``, and how a consumer
engine (``kv_consumer``) reads them.

vLLM's disaggregated flow: the proxy sends the prompt to the producer with ``max_tokens=1``; the
producer's scheduler returns the connector's ``request_finished`` parameters with the request's
output; the proxy copies them into the decode request sent to the consumer, where they arrive as
``Request.kv_transfer_params``. kvtier's parameters name the producer's sidecar, the namespace,
the chunk size, how many leading chunks were saved and the last one's hash (so the consumer knows
the parameters belong to this prompt, salt and model), and a save id for logs::

    {"kvtier": {"version": 1, "sidecar": "tcp://10.0.0.5:5555", "namespace": "<32 hex>",
                "chunk_size": 256, "chunks": 12, "last_hash": "<64 hex>", "save_id": "..."}}

The consumer's lookup then waits (bounded by ``handoff_wait_ms``) for those chunks to appear in a
tier its sidecar reads: a shared store the producer's sidecar writes through to, or the producer's
sidecar itself through the peer tier. Parameters that do not fit are logged and ignored: the
request looks up as any other.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

__all__ = ["HandoffRole", "PARAMS_KEY", "PARAMS_VERSION"]

_log = logging.getLogger("kvtier_vllm.handoff")

#: The key of kvtier's part of ``kv_transfer_params``.
PARAMS_KEY = "kvtier"
PARAMS_VERSION = 1
_MAX_CHUNKS = 1 << 20


class HandoffRole:
    """One engine's side of the handoff.

    :param produces: a producer: finished requests name what they saved.
    :param namespace: the namespace id (16 bytes) of the engine's first KV rank.
    :param chunk_size: tokens per stored chunk.
    :param sidecar: the endpoint of this engine's sidecar (named in a producer's parameters).
    :param engine_id: names the engine in save ids.
    :param wait_ms: a consumer's bound on waiting for a producer's chunks (0: no wait).
    :param producers: a consumer takes only parameters naming one of these sidecars (empty: any).
    """

    def __init__(
        self,
        *,
        produces: bool,
        namespace: bytes,
        chunk_size: int,
        sidecar: str,
        engine_id: str = "vllm",
        wait_ms: int = 0,
        producers: Sequence[str] = (),
    ) -> None:
        self.produces = bool(produces)
        self.namespace = bytes(namespace).hex()
        self.chunk_size = int(chunk_size)
        self.sidecar = str(sidecar)
        self.engine_id = str(engine_id)
        self.wait_ms = int(wait_ms)
        self.producers = tuple(str(p) for p in producers)

    def params(self, request_id: str, saved: Sequence[bytes]) -> dict:
        """A producer's ``kv_transfer_params`` for a finished request whose first
        ``len(saved)`` chunks (their hashes) were saved."""
        return {
            PARAMS_KEY: {
                "version": PARAMS_VERSION,
                "sidecar": self.sidecar,
                "namespace": self.namespace,
                "chunk_size": self.chunk_size,
                "chunks": len(saved),
                "last_hash": bytes(saved[-1]).hex(),
                "save_id": f"{self.engine_id}/{request_id}",
            }
        }

    def awaited_chunks(self, params: Any, request_id: str, hashes: Sequence[bytes]) -> int | None:
        """The leading chunks a consumer's request waits for: 0 when ``params`` carry no kvtier
        part (another connector's, or the proxy's own flags), None when kvtier's part is refused
        (logged once, with why and what the request does instead)."""
        if not isinstance(params, Mapping):
            return self._refuse(request_id, f"kv_transfer_params must be an object, got {type(params).__name__}")
        p = params.get(PARAMS_KEY)
        if p is None:
            return 0
        if not isinstance(p, Mapping):
            return self._refuse(request_id, f"kv_transfer_params.{PARAMS_KEY} must be an object, got {p!r}")
        if p.get("version") != PARAMS_VERSION:
            return self._refuse(request_id, f"version {p.get('version')!r} is not {PARAMS_VERSION}")
        sidecar = p.get("sidecar")
        if not isinstance(sidecar, str) or not sidecar:
            return self._refuse(request_id, f"sidecar must name the producer's sidecar endpoint, got {sidecar!r}")
        if self.producers and sidecar not in self.producers:
            return self._refuse(
                request_id, f"sidecar {sidecar} is not one of this engine's producers (handoff_producers {list(self.producers)})"
            )
        if p.get("namespace") != self.namespace:
            return self._refuse(
                request_id,
                f"namespace {p.get('namespace')!r} is not this engine's {self.namespace} (another model, dtype, "
                "TP size or layout)",
            )
        if p.get("chunk_size") != self.chunk_size:
            return self._refuse(request_id, f"chunk_size {p.get('chunk_size')!r} is not this engine's {self.chunk_size}")
        n = p.get("chunks")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= _MAX_CHUNKS:
            return self._refuse(request_id, f"chunks must be an integer in [1, {_MAX_CHUNKS}], got {n!r}")
        last = p.get("last_hash")
        if n > len(hashes) or not isinstance(last, str) or bytes(hashes[n - 1]).hex() != last.lower():
            return self._refuse(
                request_id, f"chunk {n - 1}'s hash is not this request's (another prompt, cache salt or LoRA)"
            )
        return n

    def _refuse(self, request_id: str, why: str) -> None:
        _log.error(
            "kvtier: request %s: its kv_transfer_params are refused (%s); it is looked up without waiting for a producer",
            request_id,
            why,
        )
        return None
