"""The state-machine scenarios of test/unit/sim-conformance.test.ts, replayed against the Python
connectors over a real sidecar and shared-memory KV caches, plus partial-chunk claims, eviction
between lookup and load, a sidecar restart and two ranks. Every loaded block is checked byte for
byte."""

from __future__ import annotations

import pytest

from kvtier_vllm.connector_types import ConnectorRequest, ScheduledRequest
from tests.support.rig import Rig, tokens

BLOCK, CHUNK = 4, 16


@pytest.fixture
def rig(sidecar):
    r = Rig(sidecar.endpoint, block=BLOCK, chunk=CHUNK)
    yield r
    r.close()


def load_into_new_blocks(rig: Rig, req: ConnectorRequest, computed: int = 0, local_table=None):
    """A reader: asks, allocates other blocks (from the other end of the pool), records the load."""
    n, load_async = rig.ask(req, computed)
    assert load_async == (n > 0)
    total = computed + n
    table = list(local_table or []) + rig.alloc(-(-len(req.prompt_token_ids) // BLOCK) - len(local_table or []), reverse=True)
    rig.scheduler.update_state_after_alloc(req, table, n)
    return n, table


def test_full_prompt_hit_the_last_token_is_still_computed(rig):
    w1, w2 = tokens(61, 128), tokens(62, 129)
    rig.save_prompt("W1", w1)
    rig.save_prompt("W2", w2)
    r1, r2 = ConnectorRequest("R1", w1), ConnectorRequest("R2", w2)
    n1, t1 = load_into_new_blocks(rig, r1)
    n2, t2 = load_into_new_blocks(rig, r2)
    assert (n1, n2) == (112, 128), "exactly 8 chunks: 7 load; 8 chunks and a token: all 8"
    meta = rig.step()
    assert [(l.request_id, l.first_chunk, len(l.block_ids)) for l in meta.loads] == [("R1", 0, 28), ("R2", 0, 32)]
    rig.idle()
    rig.finished()
    assert rig.mismatched(w1, t1, 0, 28) == []
    assert rig.mismatched(w2, t2, 0, 32) == []


def test_partial_chunk_claim_loads_the_rest_of_the_chunk_byte_exact(rig):
    w = tokens(71, 100)
    rig.save_prompt("W", w)
    # The engine's own prefix cache holds 5 blocks (20 tokens): chunk 1 is half local.
    local = rig.alloc(5, reverse=True)
    rig.compute(w, local + [0] * 20, 0, 20)
    rig.scribble([])
    req = ConnectorRequest("X", w)
    n, table = load_into_new_blocks(rig, req, computed=20, local_table=local)
    assert n == 96 - 20, "the rest of chunk 1 and chunks 2..5 (the 6th chunk ends at the last token)"
    rig.scribble(table[5:])
    meta = rig.step()
    (load,) = meta.loads
    assert (load.first_chunk, load.skip_blocks, len(load.block_ids)) == (1, 1, 24 - 5)
    out = rig.until_recving("X")
    assert set(out.invalid_block_ids) == set()
    assert rig.mismatched(w, table, 0, 24) == []


def test_partial_chunk_claim_needs_a_block_aligned_prefix(rig):
    w = tokens(72, 100)
    rig.save_prompt("W", w)
    assert rig.ask(ConnectorRequest("X", w), 21) == (0, False)


def test_update_state_after_alloc_twice_the_second_call_decides(rig):
    ws = [tokens(41 + i, 160) for i in range(3)]
    for i, w in enumerate(ws):
        rig.save_prompt(f"W{i}", w)
    xs = [ConnectorRequest(f"X{i}", w + tokens(50 + i, 40)) for i, w in enumerate(ws)]
    tables = []
    for x, second in zip(xs, (lambda t: t, lambda t: t - CHUNK, lambda t: 0)):
        n, table = load_into_new_blocks(rig, x)
        assert n == 160
        rig.scheduler.update_state_after_alloc(x, table, second(n))
        tables.append(table)
    meta = rig.step()
    assert {l.request_id: l.num_tokens for l in meta.loads} == {"X0": 160, "X1": 144}
    for rid in ("X0", "X1"):
        rig.until_recving(rid)
    assert rig.mismatched(xs[0].prompt_token_ids, tables[0], 0, 40) == []
    assert rig.mismatched(xs[1].prompt_token_ids, tables[1], 0, 36) == []


def test_preempted_then_resumed_through_a_kvtier_load(rig):
    prompt = tokens(12, 160)
    req = ConnectorRequest("B", prompt)
    assert rig.ask(req) == (0, False)
    table = rig.alloc(40)
    rig.scheduler.update_state_after_alloc(req, table, 0)
    rig.step([ScheduledRequest(req, table, 0, 160)], [(prompt, table, 0, 160)])
    # Preempted: the engine frees the blocks; the workers wait for the saves still reading them.
    rig.scheduler.request_preempted(req)
    meta = rig.step()
    assert meta.preempted() == ["B"]
    assert all(r.worker.in_flight() == 0 for r in rig.rank_list), "handle_preemptions waited for the saves"
    rig.scribble(table)
    rig.free(table)
    assert rig.scheduler.reset_cache()
    n, new_table = load_into_new_blocks(rig, req)
    assert n == 144, "the 9 chunks before the last token"
    rig.step()
    rig.until_recving("B")
    assert rig.mismatched(prompt, new_table, 0, 36) == []
    delay, params = rig.scheduler.request_finished(req, new_table)
    assert (delay, params) == (True, None), "saves may still read the blocks; vLLM gets no parameters"


def test_aborted_while_loading_is_freed_by_vllm_on_finished_recving(rig, sidecar):
    """vLLM keeps the blocks of a request aborted while loading until a worker reports the load
    in finished_recving; the connector must not delay the free as well (vLLM would then meet
    the id in finished_sending after dropping it)."""
    w = tokens(21, 160)
    rig.save_prompt("W", w)
    x = ConnectorRequest("X", w + tokens(22, 40), aborted=True)
    n, table = load_into_new_blocks(rig, x)
    assert n == 160
    rig.step()  # the LOAD is sent
    delay, _ = rig.scheduler.request_finished(x, table)
    assert delay is False, "vLLM delays the free of a loading request itself"
    meta = rig.step()
    assert [(e.request_id, e.kind, e.delay_free) for e in meta.finished] == [("X", "aborted", False)]
    seen_recving, seen_sending = [], []
    for _ in range(2000):
        out = rig.finished({"X"})
        seen_recving += list(out.finished_recving)
        seen_sending += list(out.finished_sending)
        if seen_recving:
            break
        rig.rank_list[0].worker._client.poll(timeout_ms=10)
    assert seen_recving == ["X"] and seen_sending == [], "reported once, as a finished load only"
    later = rig.finished({"X"})
    assert not later.finished_sending and not later.finished_recving, "each id is reported once"
    assert rig.scheduler.tracked_requests == 0


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_eviction_between_lookup_and_load_gives_invalid_blocks_never_wrong_bytes(rig, policy):
    w = tokens(31, 160)
    rig.save_prompt("W", w)
    x = ConnectorRequest("X", w + tokens(32, 40))
    n, table = load_into_new_blocks(rig, x)
    assert n == 160
    rig.scribble(table)
    # Evicted between lookup and load: pins released, chunks dropped.
    rig.admin.cancel("X#1")
    rig.admin.clear([rig.rank_list[0].namespace])
    rig.step()
    out = rig.until_recving("X")
    assert set(out.invalid_block_ids) == set(table[:40]), "every block of the failed load"
    # Nothing was written into the blocks: they still hold the garbage, never someone's KV.
    assert rig.mismatched(w, table, 0, 40) == list(range(40))
    if policy == "fail":
        delay, _ = rig.scheduler.request_finished(x, table)  # vLLM finishes the request as failed
        assert delay is False, "the failed load settled and nothing was saved"
        assert rig.scheduler.tracked_requests == 0
        return
    # recompute: the engine recomputes from the first invalid block; the failed chunks are saved again.
    meta = rig.step([ScheduledRequest(x, table, 0, 200)], [(x.prompt_token_ids, table, 0, 200)])
    assert [(s.first_chunk, len(s.block_ids) // rig.bpc) for s in meta.saves] == [(0, 12)]
    rig.idle()
    assert rig.mismatched(x.prompt_token_ids, table, 0, 50) == []


def test_reset_prefix_cache_during_loads_the_loads_complete(rig):
    w1, w2 = tokens(31, 160), tokens(32, 160)
    rig.save_prompt("W1", w1)
    rig.save_prompt("W2", w2)
    x1 = ConnectorRequest("X1", w1 + tokens(33, 40))
    x2 = ConnectorRequest("X2", w2 + tokens(34, 40))
    n1, t1 = load_into_new_blocks(rig, x1)
    n2, t2 = load_into_new_blocks(rig, x2)
    assert rig.scheduler.reset_cache(), "a reset while the loads are recorded keeps them"
    meta = rig.step()
    assert len(meta.loads) == 2
    rig.until_recving("X1")
    rig.until_recving("X2")
    rig.idle()
    assert rig.mismatched(x1.prompt_token_ids, t1, 0, 40) == []
    assert rig.mismatched(x2.prompt_token_ids, t2, 0, 40) == []
