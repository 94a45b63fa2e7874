"""``SchedulerOutput``, ``NewRequestData`` and ``CachedRequestData`` (the fields the connector
and the twin's model runner read)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int] | None
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    lora_request: Any = None
    mm_features: list = field(default_factory=list)

    @classmethod
    def from_request(cls, request: Any, block_ids: tuple[list[int], ...]) -> "NewRequestData":
        return cls(
            req_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            block_ids=block_ids,
            num_computed_tokens=request.num_computed_tokens,
            lora_request=request.lora_request,
        )


@dataclass
class CachedRequestData:
    req_ids: list[str]
    #: For these ids ``new_block_ids`` replaces the request's block ids instead of extending them.
    resumed_req_ids: set[str]
    new_token_ids: list[list[int]]
    #: Token ids of requests not scheduled in the previous step.
    all_token_ids: dict[str, list[int]]
    new_block_ids: list[tuple[list[int], ...] | None]
    num_computed_tokens: list[int]
    num_output_tokens: list[int]

    @classmethod
    def make_empty(cls) -> "CachedRequestData":
        return cls([], set(), [], {}, [], [], [])


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]
    preempted_req_ids: set[str] | None = None
    kv_connector_metadata: Any = None
