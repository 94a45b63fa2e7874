"""KV cache events as ``vllm/distributed/kv_events.py`` defines them (the fields of the current
revision; vLLM's are msgspec structs, these dataclasses compare and hash the same way), and the
container a connector's workers report them in (``KVConnectorKVEvents``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


class KVCacheEvent:
    """Base class of the events."""


@dataclass(frozen=True)
class BlockStored(KVCacheEvent):
    block_hashes: list
    parent_block_hash: Any
    token_ids: list
    block_size: int
    lora_id: Any
    medium: Any
    lora_name: Any = None
    extra_keys: Any = None
    group_idx: Any = None

    def __hash__(self) -> int:
        return hash((tuple(self.block_hashes), self.parent_block_hash, tuple(self.token_ids), self.block_size, self.medium))


@dataclass(frozen=True)
class BlockRemoved(KVCacheEvent):
    block_hashes: list
    medium: Any
    group_idx: Any = None

    def __hash__(self) -> int:
        return hash((tuple(self.block_hashes), self.medium))


@dataclass(frozen=True)
class AllBlocksCleared(KVCacheEvent):
    pass


@dataclass
class KVEventBatch:
    ts: float
    events: list = field(default_factory=list)
    data_parallel_rank: Any = None


class KVConnectorKVEvents(ABC):
    """A connector's events of one step, as a worker reports them; vLLM's output aggregator merges
    the workers' with ``add_events`` and ``increment_workers``."""

    @abstractmethod
    def add_events(self, events: list) -> None: ...

    @abstractmethod
    def aggregate(self) -> "KVConnectorKVEvents": ...

    @abstractmethod
    def increment_workers(self, count: int = 1) -> None: ...

    @abstractmethod
    def get_all_events(self) -> list: ...

    @abstractmethod
    def get_number_of_workers(self) -> int: ...

    @abstractmethod
    def clear_events(self) -> None: ...

    def merge(self, other: "KVConnectorKVEvents") -> "KVConnectorKVEvents":
        self.add_events(other.get_all_events())
        return self
