"""``KVConnectorOutput`` and ``ModelRunnerOutput`` (the fields the connector path uses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVConnectorOutput:
    finished_sending: set[str] | None = None
    finished_recving: set[str] | None = None
    kv_connector_stats: Any = None
    kv_connector_worker_meta: Any = None
    #: The connector's KV cache events of the step (``get_kv_connector_kv_cache_events``).
    kv_cache_events: Any = None
    #: Blocks of externally computed tokens that failed to load; their requests recompute them.
    invalid_block_ids: set[int] = field(default_factory=set)
    #: Current revision only: loads that failed (also in ``finished_recving``).
    failed_recving: set[str] = field(default_factory=set)
    expected_finished_count: int = 0


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]] = field(default_factory=list)
    kv_connector_output: KVConnectorOutput | None = None
