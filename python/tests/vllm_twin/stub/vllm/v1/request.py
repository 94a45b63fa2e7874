"""``Request`` and ``RequestStatus``: the request state the scheduler and the connector share."""

from __future__ import annotations

import enum
from typing import Any


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # everything after PREEMPTED is a finished state
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: "RequestStatus") -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH_CAPPED: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
            RequestStatus.FINISHED_IGNORED: "length",
            RequestStatus.FINISHED_ERROR: "error",
        }.get(status)


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        cache_salt: str | None = None,
        lora_request: Any = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(self.prompt_token_ids)
        self.max_tokens = max_tokens
        self.cache_salt = cache_salt
        self.lora_request = lora_request
        self.mm_features: list = []
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.kv_transfer_params: dict | None = None

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self._output_token_ids

    def append_output_token_ids(self, token_id: int) -> None:
        self._output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> str | None:
        return RequestStatus.get_finished_reason(self.status)

    def __repr__(self) -> str:
        return f"Request({self.request_id}, {self.status.name}, computed={self.num_computed_tokens}/{self.num_tokens})"
