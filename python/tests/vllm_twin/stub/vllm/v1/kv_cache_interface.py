"""KV cache specs and the engine's KV cache config (groups of layers sharing one spec)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any
    sliding_window: int | None = None


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    pass


@dataclass(frozen=True)
class SlidingWindowSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any
    sliding_window: int = 0


@dataclass(frozen=True)
class MambaSpec:
    block_size: int
    shapes: tuple = ()
    dtypes: tuple = ()


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: Any


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list = field(default_factory=list)
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)
