"""The scheduler connector's bookkeeping without a sidecar (the lookup client is a stand-in
whose answers the test releases), mirroring test/unit/connector.test.ts."""

from __future__ import annotations

import pytest

from kvtier_vllm.connector_types import ConnectorOutput, ConnectorRequest, RequestEnd, ScheduledRequest
from kvtier_vllm.errors import ClosedError, InvalidArgumentError
from kvtier_vllm.hashing import hash_chunks
from kvtier_vllm.rank_lookup import RankLookup
from kvtier_vllm.scheduler import SchedulerConnector

BLOCK, CHUNK = 4, 16
BPC = CHUNK // BLOCK


class FakeLookup:
    def __init__(self):
        self.answers, self.calls, self.forgotten, self.canceled, self.closed = {}, [], [], [], False

    def lookup(self, lookup_id, hashes, counts, namespaces=None):
        self.calls.append((lookup_id, bytes(hashes), list(counts), namespaces))
        return self.answers.pop(lookup_id, None)

    def forget(self, lookup_id):
        self.forgotten.append(lookup_id)

    def cancel(self, lookup_id):
        self.canceled.append(lookup_id)

    def close(self):
        self.closed = True


def prompt(rid, n, salt=None):
    return ConnectorRequest(rid, [(i * 7919 + 13) % 50000 for i in range(n)], cache_salt=salt)


def table(n, base=100):
    return [base + 3 * i for i in range(n)]


@pytest.fixture
def f():
    lk = FakeLookup()
    return lk, SchedulerConnector(lk, BLOCK, CHUNK)


def matched(f, req, computed, hit):
    lk, sc = f
    assert sc.get_num_new_matched_tokens(req, computed) == (None, False)
    lk.answers[lk.calls[-1][0]] = hit
    return sc.get_num_new_matched_tokens(req, computed)


def test_pending_then_claim_cached_answer(f):
    lk, sc = f
    req = prompt("a", 100)
    assert sc.get_num_new_matched_tokens(req, 0) == (None, False)
    assert sc.get_num_new_matched_tokens(req, 0) == (None, False)
    assert lk.calls[0][0] == lk.calls[1][0] == "a#1"
    lk.answers["a#1"] = 64
    assert sc.get_num_new_matched_tokens(req, 0) == (64, True)
    n = len(lk.calls)
    assert sc.get_num_new_matched_tokens(req, 0) == (64, True)
    assert len(lk.calls) == n, "the answer is cached"


def test_looks_up_full_chunks_before_the_last_token(f):
    lk, sc = f
    req = prompt("a", 64, salt="tenant-1")
    sc.get_num_new_matched_tokens(req, 0)
    _, hashes, counts, _ = lk.calls[0]
    assert counts == [16, 16, 16]
    expected = hash_chunks(req.prompt_token_ids, chunk_size=CHUNK, salt="tenant-1")
    assert hashes == b"".join(c.hash for c in expected[:3])


def test_claims_are_capped_and_rounded(f):
    assert matched(f, prompt("a", 64), 0, 64) == (48, True)
    assert matched(f, prompt("b", 100), 0, 37) == (32, True)
    assert matched(f, prompt("c", 100), 0, 12) == (0, False)


def test_partial_chunk_claims(f):
    lk, sc = f
    # Local prefix of 5 blocks ends inside chunk 1: claim the rest of chunk 1 and chunks 2..3.
    req = prompt("a", 100)
    assert matched(f, req, 20, 64) == (44, True)
    sc.update_state_after_alloc(req, table(25), 44)
    (load,) = sc.build_connector_meta().loads
    assert (load.first_chunk, load.skip_blocks, load.num_tokens) == (1, 1, 44)
    assert list(load.block_ids) == table(25)[BPC + 1 : 4 * BPC]
    assert len(load.chunk_hashes) == 3 * 32
    # Not block-aligned: nothing, and no lookup.
    n = len(lk.calls)
    assert sc.get_num_new_matched_tokens(prompt("b", 100), 21) == (0, False)
    assert len(lk.calls) == n
    # A failed load inside the partial chunk un-stores from that chunk.
    sc.update_connector_output(ConnectorOutput(finished_recving={"a"}, invalid_block_ids={load.block_ids[2]}))
    meta = sc.build_connector_meta([ScheduledRequest(req, table(25), 20, 80)])
    assert [(s.first_chunk, len(s.block_ids) // BPC) for s in meta.saves] == [(1, 5)]


def test_beyond_the_local_prefix_and_release(f):
    assert matched(f, prompt("a", 100), 32, 80) == (48, True)
    lk = FakeLookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK)
    assert matched((lk, sc), prompt("b", 100), 48, 48) == (0, False)
    assert lk.canceled == ["b#1"], "nothing to load: pins released"


def test_update_state_after_alloc_replace_clear_refuse(f):
    lk, sc = f
    req = prompt("a", 100)
    assert matched(f, req, 16, 64) == (48, True)
    sc.update_state_after_alloc(req, table(20), 48)
    sc.update_state_after_alloc(req, table(20, 500), 48)
    (load,) = sc.build_connector_meta().loads
    assert list(load.block_ids) == table(20, 500)[BPC : 4 * BPC]
    b = prompt("b", 100)
    matched(f, b, 0, 32)
    sc.update_state_after_alloc(b, table(8), 32)
    sc.update_state_after_alloc(b, table(8), 0)
    assert sc.build_connector_meta().loads == ()
    for blocks, tokens in ((table(8), 48), (table(8), 20), (table(7), 32)):
        with pytest.raises(InvalidArgumentError):
            sc.update_state_after_alloc(b, blocks, tokens)


def test_saves_skip_stored_chunks_and_partial_tails(f):
    lk, sc = f
    req = prompt("a", 100)
    matched(f, req, 0, 32)
    blocks = table(25)
    sc.update_state_after_alloc(req, blocks, 32)
    assert len(sc.build_connector_meta().loads) == 1
    s1 = sc.build_connector_meta([ScheduledRequest(req, blocks, 32, 28)]).saves
    assert [(s.first_chunk, list(s.block_ids)) for s in s1] == [(2, blocks[2 * BPC : 3 * BPC])]
    s2 = sc.build_connector_meta([ScheduledRequest(req, blocks, 60, 40)]).saves
    assert [(s.first_chunk, len(s.block_ids)) for s in s2] == [(3, 3 * BPC)]
    assert sc.build_connector_meta([ScheduledRequest(req, blocks, 100, 1)]).saves == ()


def test_finished_vs_preempted(f):
    lk, sc = f
    a = prompt("a", 100)
    matched(f, a, 0, 32)
    assert sc.request_finished(ConnectorRequest(a.request_id, a.prompt_token_ids, aborted=True), []) == (False, None)
    assert lk.canceled == ["a#1"]
    b = prompt("b", 100)
    sc.get_num_new_matched_tokens(b, 0)
    assert sc.request_finished(b, []) == (False, None)
    assert lk.forgotten == ["b#1"]
    c = prompt("c", 100)
    matched(f, c, 0, 32)
    sc.update_state_after_alloc(c, table(25), 32)
    first = sc.build_connector_meta()
    # Loading: vLLM keeps the blocks itself until finished_recving names the request.
    assert sc.request_finished(c, []) == (False, None)
    d = prompt("d", 100)
    matched(f, d, 0, 0)
    sc.update_state_after_alloc(d, table(25), 0)
    second = sc.build_connector_meta([ScheduledRequest(d, table(25), 0, 100)])
    assert second.saves
    assert sc.request_finished(d, []) == (True, None), "saves may still read the blocks"
    assert list(first.finished) + list(second.finished) + list(sc.build_connector_meta().finished) == [
        RequestEnd("a", "aborted", False),
        RequestEnd("b", "finished", False),
        RequestEnd("c", "finished", False),
        RequestEnd("d", "finished", True),
    ]
    assert sc.tracked_requests == 0
    # Preemption drops an unsent load; the next ask looks up afresh (the request's own saved
    # chunks count too) and the old answer's pins go once the new one is in.
    p = prompt("p", 100)
    matched(f, p, 0, 32)
    sc.update_state_after_alloc(p, table(25), 32)
    sc.request_preempted(p)
    meta = sc.build_connector_meta()
    assert meta.loads == () and meta.preempted() == ["p"]
    assert sc.get_num_new_matched_tokens(p, 0) == (None, False)
    assert lk.calls[-1][0] == "p#2" and "p#1" not in lk.canceled, "the old pins stay while the new lookup runs"
    lk.answers["p#2"] = 48
    assert sc.get_num_new_matched_tokens(p, 0) == (48, True)
    assert "p#1" in lk.canceled


def test_asked_again_after_admission_looks_up_afresh(f):
    """vLLM may ask about a preempted request before build_connector_meta tells the connector
    of the preemption: an ask after an admission is a new admission."""
    lk, sc = f
    r = prompt("r", 100)
    matched(f, r, 0, 0)
    sc.update_state_after_alloc(r, table(25), 0)
    assert sc.get_num_new_matched_tokens(r, 0) == (None, False)
    assert lk.calls[-1][0] == "r#2"


def test_a_failed_load_is_not_offered_again_and_failures_pause_offers():
    lk = FakeLookup()
    now = [100.0]
    sc = SchedulerConnector(lk, BLOCK, CHUNK, clock=lambda: now[0])
    f = (lk, sc)

    def fail_load(rid, hit):
        req = prompt(rid, 100)
        assert matched(f, req, 0, hit) == (hit, True)
        blocks = table(25, base=1000 + 100 * len(lk.calls))
        sc.update_state_after_alloc(req, blocks, hit)
        sc.build_connector_meta()
        # chunk 1 fails: its blocks and the later ones are invalid
        sc.update_connector_output(ConnectorOutput(finished_recving={rid}, invalid_block_ids=set(blocks[BPC:])))
        return req

    x = fail_load("x", 48)
    assert not sc.offers_paused, "one failure does not pause offers"
    # asked again (vLLM recomputes from the failed block): chunks from the failed one are never offered
    assert sc.get_num_new_matched_tokens(x, 0) == (None, False)
    lk.answers[lk.calls[-1][0]] = 48
    assert sc.get_num_new_matched_tokens(x, 0) == (16, True)
    fail_load("y", 32)
    assert sc.offers_paused, "two failed loads in a row pause offers"
    z = prompt("z", 100)
    assert sc.get_num_new_matched_tokens(z, 0) == (0, False)
    now[0] += 1.5
    assert not sc.offers_paused
    assert sc.get_num_new_matched_tokens(z, 0) == (None, False)


def test_after_a_load_a_preempted_request_looks_up_afresh_and_reset(f):
    lk, sc = f
    req = prompt("a", 100)
    matched(f, req, 0, 32)
    sc.update_state_after_alloc(req, table(25), 32)
    sc.build_connector_meta()
    sc.update_connector_output(ConnectorOutput(finished_recving={"a"}))
    sc.request_preempted(req)
    assert sc.get_num_new_matched_tokens(req, 0) == (None, False)
    assert lk.calls[-1][0] == "a#2"
    b = prompt("b", 100)
    matched(f, b, 0, 32)
    assert sc.reset_cache() is True
    assert "b#1" in lk.canceled
    assert sc.get_num_new_matched_tokens(b, 0) == (None, False)


def test_close_and_options():
    lk = FakeLookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK)
    sc.close()
    sc.close()
    assert lk.closed
    with pytest.raises(ClosedError):
        sc.get_num_new_matched_tokens(prompt("a", 100), 0)
    with pytest.raises(InvalidArgumentError):
        SchedulerConnector(lk, 16, 40)
    with pytest.raises(InvalidArgumentError):
        SchedulerConnector(lk, 0)


def test_rank_lookup_minimum_and_release():
    a, b = FakeLookup(), FakeLookup()
    rl = RankLookup([(a, b"\x01" * 16, "@r0"), (b, b"\x02" * 16, "@r1")])
    sc = SchedulerConnector(rl, BLOCK, CHUNK)
    req = prompt("x", 100)
    assert sc.get_num_new_matched_tokens(req, 0) == (None, False)
    assert [c[0] for c in a.calls + b.calls] == ["x#1@r0", "x#1@r1"]
    assert a.calls[0][3] == [b"\x01" * 16]
    a.answers["x#1@r0"] = 64
    assert sc.get_num_new_matched_tokens(req, 0) == (None, False), "rank 1 has not answered"
    b.answers["x#1@r1"] = 32
    assert sc.get_num_new_matched_tokens(req, 0) == (32, True)
    sc.request_finished(req, [])
    assert a.canceled == ["x#1@r0"] and b.canceled == ["x#1@r1"]
