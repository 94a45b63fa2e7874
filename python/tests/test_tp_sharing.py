"""KV shared across tensor-parallel sizes through the connectors: an engine at TP 2 saves a
prompt; engines of the same model at TP 1 and TP 4, whose lookups also ask about the covers of
their heads, claim it, load it, and every head of every loaded block is compared with what the
TP 2 rank holding that head saved. Without covers a TP 1 engine finds nothing (its heads'
namespace differs)."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier_vllm.connector_types import ConnectorRequest
from tests.support.rig import Rig, tokens

HEADS = 4


def _load(rig: Rig, rid: str, prompt: list[int]) -> tuple[int, list[int]]:
    req = ConnectorRequest(rid, prompt)
    n, _ = rig.ask(req)
    table = rig.alloc(-(-len(prompt) // rig.block), reverse=True)
    rig.scribble(table)
    rig.scheduler.update_state_after_alloc(req, table, n)
    rig.step()
    rig.until_recving(rid)
    return n, table


@pytest.mark.parametrize("tp", [1, 4])
def test_what_a_tp2_engine_saves_loads_at_another_tp_head_for_head(sidecar, tp):
    saver = Rig(sidecar.endpoint, block=4, chunk=16, ranks=2, heads=HEADS)
    loader = Rig(sidecar.endpoint, block=4, chunk=16, ranks=tp, heads=HEADS, model_id=saver.model_id, covers=True)
    try:
        w = tokens(71 + tp, 100)
        saved = saver.save_prompt("W", w)
        n, table = _load(loader, "X", w)
        assert n == 96, "six full chunks, assembled from the TP 2 ranks' head shards"
        assert not loader.invalid_seen
        per = HEADS // tp
        for j in range(n // loader.block):
            for r in loader.rank_list:
                for layer in range(loader.layers):
                    for kv in range(2):
                        got = loader._arr(r, layer, kv, table[j])
                        for h in range(per):
                            g = r.index * per + h
                            src = saver._arr(saver.rank_list[g // 2], layer, kv, saved[j])
                            assert np.array_equal(got[:, h, :], src[:, g % 2, :]), (
                                f"TP {tp} rank {r.index} block {j} layer {layer} kv {kv} head {g}"
                            )
    finally:
        loader.close()
        saver.close()


def test_without_covers_another_tp_size_finds_nothing(sidecar):
    saver = Rig(sidecar.endpoint, block=4, chunk=16, ranks=2, heads=HEADS)
    loader = Rig(sidecar.endpoint, block=4, chunk=16, ranks=1, heads=HEADS, model_id=saver.model_id)
    try:
        w = tokens(79, 100)
        saver.save_prompt("W", w)
        n, _ = loader.ask(ConnectorRequest("X", w))
        assert n == 0
    finally:
        loader.close()
        saver.close()
