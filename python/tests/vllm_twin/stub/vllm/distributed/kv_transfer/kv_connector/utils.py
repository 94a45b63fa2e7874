"""The connector layout helper and the aggregation of the workers' connector outputs."""

from __future__ import annotations

from typing import Any

from vllm import _twin
from vllm.config import get_current_vllm_config_or_none
from vllm.v1.outputs import KVConnectorOutput

from .factory import KVConnectorFactory


def get_kv_connector_cache_layout(vllm_config: Any = None) -> str | None:
    """The layout the configured connector requires; else ``"NHD"`` (fixture revision) or
    ``None`` (current revision)."""
    if vllm_config is None:
        vllm_config = get_current_vllm_config_or_none()
    fallback = None if _twin.is_current() else "NHD"
    if vllm_config is None or vllm_config.kv_transfer_config is None:
        return fallback
    cls = KVConnectorFactory.get_connector_class(vllm_config.kv_transfer_config)
    required = cls.get_required_kvcache_layout(vllm_config)
    return required if required is not None else fallback


class KVOutputAggregator:
    """Merges the workers' outputs into rank 0's: a request id counts as finished sending or
    receiving once every worker has reported it; invalid blocks are the union."""

    def __init__(self, expected_finished_count: int) -> None:
        self._recv: dict[str, int] = {}
        self._send: dict[str, int] = {}
        self._failed_pending: set[str] = set()
        self._expected = expected_finished_count

    def aggregate(self, outputs: list, output_rank: int = 0) -> Any:
        def count(ids, remaining: dict[str, int], done: set[str]) -> None:
            for rid in ids or ():
                left = remaining.get(rid, self._expected) - 1
                if left == 0:
                    done.add(rid)
                    remaining.pop(rid, None)
                else:
                    remaining[rid] = left

        sending: set[str] = set()
        recving: set[str] = set()
        invalid: set[int] = set()
        events = None
        for out in outputs:
            kv = out.kv_connector_output
            if not kv:
                continue
            # The first worker's events accumulate the others', as vLLM combines them.
            if events is None:
                events = kv.kv_cache_events
            elif kv.kv_cache_events:
                events.add_events(kv.kv_cache_events.get_all_events())
                events.increment_workers(1)
            count(kv.finished_sending, self._send, sending)
            count(kv.finished_recving, self._recv, recving)
            invalid |= set(kv.invalid_block_ids)
            if _twin.is_current():
                self._failed_pending |= set(kv.failed_recving)
        out = outputs[output_rank]
        extra = {}
        if _twin.is_current():
            failed = self._failed_pending & recving
            self._failed_pending -= failed
            extra["failed_recving"] = failed
        out.kv_connector_output = KVConnectorOutput(
            finished_sending=sending or None,
            finished_recving=recving or None,
            invalid_block_ids=invalid,
            kv_cache_events=events or None,
            expected_finished_count=self._expected,
            **extra,
        )
        return out

    def pending(self) -> tuple[dict[str, int], dict[str, int]]:
        """Ids some but not all workers reported (sending, recving): the twin's leak check."""
        return dict(self._send), dict(self._recv)
