"""Tensor- and pipeline-parallel groups as a worker sees them (``get_tp_group``, ``get_pp_group``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GroupCoordinator:
    rank_in_group: int
    world_size: int


_tp: GroupCoordinator | None = None
_pp: GroupCoordinator | None = None


def initialize_model_parallel(tp_rank: int, tp_size: int, pp_rank: int = 0, pp_size: int = 1) -> None:
    """What vLLM's worker start-up establishes before the connector is built."""
    global _tp, _pp
    _tp = GroupCoordinator(tp_rank, tp_size)
    _pp = GroupCoordinator(pp_rank, pp_size)


def get_tp_group() -> GroupCoordinator:
    assert _tp is not None, "tensor model parallel group is not initialized"
    return _tp


def get_pp_group() -> GroupCoordinator:
    assert _pp is not None, "pipeline model parallel group is not initialized"
    return _pp
