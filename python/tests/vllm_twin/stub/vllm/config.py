"""The configuration objects the connector and the layout helpers read (``vllm/config``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVTransferConfig:
    kv_connector: str | None = None
    kv_connector_module_path: str | None = None
    kv_role: str = "kv_both"
    engine_id: str | None = None
    kv_load_failure_policy: str = "recompute"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")


@dataclass
class ModelConfig:
    model: str
    dtype: Any
    num_hidden_layers: int
    num_kv_heads: int
    head_size: int
    use_mla: bool = False
    max_model_len: int = 4096

    def get_total_num_hidden_layers(self) -> int:
        return self.num_hidden_layers

    def get_total_num_kv_heads(self) -> int:
        return self.num_kv_heads

    def get_head_size(self) -> int:
        return self.head_size


@dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    num_gpu_blocks: int | None = None


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    rank: int = 0


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    disable_hybrid_kv_cache_manager: bool = False


@dataclass
class VllmConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    parallel_config: ParallelConfig
    scheduler_config: SchedulerConfig
    kv_transfer_config: KVTransferConfig | None = None


_current: VllmConfig | None = None


@contextlib.contextmanager
def set_current_vllm_config(config: VllmConfig):
    """vLLM sets the config being built while engines and workers are constructed."""
    global _current
    old, _current = _current, config
    try:
        yield
    finally:
        _current = old


def get_current_vllm_config() -> VllmConfig:
    if _current is None:
        raise RuntimeError("no current vLLM config (set_current_vllm_config)")
    return _current


def get_current_vllm_config_or_none() -> VllmConfig | None:
    return _current
