"""``KVConnectorBase_V1`` and its companions, with the contract vLLM's base class states.

Abstract: ``start_load_kv``, ``wait_for_layer_load``, ``save_kv_layer``, ``wait_for_save``,
``get_num_new_matched_tokens``, ``update_state_after_alloc``, ``build_connector_meta``; the
other hooks have the base class's defaults. The current revision adds ``get_transfer_results``,
whose default wraps ``get_finished``.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from vllm import _twin


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024 - an opaque base, as in vLLM
    """What the scheduler-side connector ships to the workers each step."""


class SupportsHMA(ABC):
    """Marks a connector that works with the hybrid KV cache manager: the scheduler then calls
    ``request_finished_all_groups`` with one block list per KV cache group."""

    @abstractmethod
    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, dict | None]:
        raise NotImplementedError


def supports_hma(connector: Any) -> bool:
    if isinstance(connector, type):
        return issubclass(connector, SupportsHMA)
    return isinstance(connector, SupportsHMA)


@dataclass
class KVConnectorTransferResults:
    """A worker's finished transfers for one step (current revision). Failed loads are also in
    ``finished_recving``; ``failed_recving`` names them."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)


class KVConnectorBase_V1(ABC):
    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return False

    @property
    def requires_kv_delivery(self) -> bool:
        return self._kv_transfer_config.is_kv_producer

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any) -> None:
        self._connector_metadata: KVConnectorMetadata | None = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    # worker side
    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches: dict) -> None:
        return

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        return

    @abstractmethod
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None: ...

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def wait_for_save(self) -> None: ...

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        if not _twin.is_current():
            raise AttributeError("get_transfer_results does not exist at the fixture revision")
        sending, recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(set(sending or ()), set(recving or ()))

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set()

    def shutdown(self) -> None:
        return None

    def get_kv_connector_stats(self) -> Any:
        return None

    def build_connector_worker_meta(self) -> Any:
        return None

    # scheduler side
    @abstractmethod
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]: ...

    @abstractmethod
    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None: ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata: ...

    def update_connector_output(self, connector_output: Any) -> None:
        return

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        return False, None

    def take_events(self):
        return ()

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be called on the abstract base class")
        return None

    def get_finished_count(self) -> int | None:
        return None

    def reset_cache(self) -> bool | None:
        return None
