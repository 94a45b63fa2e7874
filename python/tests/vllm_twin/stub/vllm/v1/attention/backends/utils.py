"""``get_kv_cache_layout``: the KV cache layout the attention backends build their caches in.

An override a backend sets (``set_kv_cache_layout``), else ``VLLM_KV_CACHE_LAYOUT``, else what
the connector helper answers. ``None`` (current revision, no connector requirement) means the
backend's own default, NHD for FlashAttention and FlashInfer.
"""

from __future__ import annotations

import os

from vllm.distributed.kv_transfer.kv_connector.utils import get_kv_connector_cache_layout

_override: str | None = None


def get_kv_cache_layout() -> str | None:
    if _override is not None:
        return _override
    env = os.environ.get("VLLM_KV_CACHE_LAYOUT")
    if env:
        assert env in ("NHD", "HND"), env
        return env
    return get_kv_connector_cache_layout()


def set_kv_cache_layout(layout: str | None) -> None:
    global _override
    _override = layout
