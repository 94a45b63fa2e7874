"""Save fences (kvtier_vllm.save_fence, docs/protocol.md 4.9) against a real sidecar: a worker
cancels a SAVE the sidecar has not read, at once and whatever the sidecar does, and the sidecar
then stores nothing of it; a SAVE unanswered past ``save_timeout_s`` is cancelled and reported
as not saved; the words and tickets of the state file."""

from __future__ import annotations

import os
import time

import pytest

from kvtier_vllm.client import KvtierClient
from kvtier_vllm.connector_types import ConnectorMeta, RequestEnd, SaveIntent
from kvtier_vllm.hashing import hash_chunks
from kvtier_vllm.save_fence import SaveFences
from tests.support.rig import Rig, tokens


def test_tickets_slots_and_cancel_words(tmp_path):
    f = SaveFences(str(tmp_path), slots=2)
    a = f.arm()
    b = f.arm()
    assert a is not None and b is not None and a[0] != b[0]
    assert f.arm() is None, "two slots, two saves in flight"
    assert f.word(a[0]) == a[1] and a[1] & 3 == 1
    f.cancel(*a)
    assert f.word(a[0]) == a[1] | 3, "the cancel leaves a word that is not the ticket"
    c = f.arm()
    assert c is not None and c[0] == a[0] and c[1] not in (a[1], a[1] | 3), "a reused slot gets a new ticket"
    f.release(b[0])
    assert f.free_slots == 1
    path = f.path
    f.close()
    assert not os.path.exists(path)


def _saved(rig: Rig, prompt: list[int]) -> int:
    """Chunks of ``prompt`` the sidecar holds for rank 0 (a lookup that pins nothing)."""
    chunks = hash_chunks(prompt, chunk_size=rig.chunk)
    ns = rig.rank_list[0].namespace
    res = rig.admin.send_lookup("probe", b"".join(c.hash for c in chunks), [rig.chunk] * len(chunks), [ns], pin=False).wait()
    return res.hit_tokens // rig.chunk


def _save_meta(rig: Rig, rid: str, prompt: list[int], table: list[int]) -> ConnectorMeta:
    chunks = hash_chunks(prompt, chunk_size=rig.chunk)
    return ConnectorMeta(saves=(SaveIntent(rid, 0, tuple(table[: len(chunks) * rig.bpc]), b"".join(c.hash for c in chunks)),))


def _handled_saves(endpoint: str) -> tuple[int, int]:
    c = KvtierClient(endpoint, request_timeout_ms=5000)
    try:
        dp = c.stats()["dataPlane"]
        return dp["saves"], dp["cancelledSaves"]
    finally:
        c.close()


@pytest.fixture
def rig(sidecar):
    r = Rig(sidecar.endpoint, fences=True, request_timeout_ms=60_000, save_timeout_s=0.3)
    try:
        yield r
    finally:
        sidecar.resume()
        r.close()


def test_preemption_with_the_sidecar_frozen_returns_at_once_and_nothing_is_stored(rig, sidecar):
    w = rig.rank_list[0].worker
    assert w.fenced, "the sidecar's PONG lists saveFence"
    prompt = tokens(1, 2 * rig.chunk)
    table = rig.alloc(2 * rig.bpc)
    rig.compute(prompt, table, 0, len(prompt))
    w.start_load_kv(_save_meta(rig, "r", prompt, table))
    sidecar.pause()
    w.wait_for_save()  # the SAVE waits in the frozen sidecar's socket
    t0 = time.monotonic()
    assert w.handle_preemptions(["r"], timeout_s=60.0), "the saves were cancelled, not given up on"
    waited = time.monotonic() - t0
    assert waited < 30.0, f"handle_preemptions did not wait out the save's not-after time (took {waited:.3f} s)"
    rig.scribble(table)  # the engine reuses the blocks for another request
    sidecar.resume()
    deadline = time.monotonic() + 30
    while _handled_saves(sidecar.endpoint)[0] < 1:
        assert time.monotonic() < deadline, "the thawed sidecar never handled the SAVE"
        time.sleep(0.05)
    assert _handled_saves(sidecar.endpoint)[1] == 1, "the sidecar saw the cancel"
    assert _saved(rig, prompt) == 0, "nothing of the reused blocks was stored"
    assert w.stats().saves_cancelled == 1


def test_a_save_unanswered_past_its_timeout_is_cancelled_and_reported(rig, sidecar):
    w = rig.rank_list[0].worker
    prompt = tokens(2, 2 * rig.chunk)
    table = rig.alloc(2 * rig.bpc)
    rig.compute(prompt, table, 0, len(prompt))
    meta = _save_meta(rig, "r", prompt, table)
    w.start_load_kv(ConnectorMeta(saves=meta.saves, finished=(RequestEnd("r", "finished", True),)))
    sidecar.pause()
    w.wait_for_save()
    deadline = time.monotonic() + 30
    while True:
        sending, _ = w.get_finished()
        if "r" in sending:
            break  # the delayed free is over: vLLM frees the blocks
        assert time.monotonic() < deadline, "the save was never cancelled"
        time.sleep(0.02)
    assert w.take_failed_saves() == {"r": 0}, "its chunks count as not saved"
    rig.scribble(table)
    sidecar.resume()
    deadline = time.monotonic() + 30
    while _handled_saves(sidecar.endpoint)[0] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _saved(rig, prompt) == 0


def test_a_save_answered_in_time_is_stored(sidecar):
    # "In time" on a busy machine: a SAVE may take longer than the other tests' 0.3 s there.
    rig = Rig(sidecar.endpoint, fences=True, request_timeout_ms=60_000, save_timeout_s=30.0)
    try:
        _save_answered_in_time(rig)
    finally:
        rig.close()


def _save_answered_in_time(rig):
    w = rig.rank_list[0].worker
    prompt = tokens(3, 2 * rig.chunk)
    table = rig.alloc(2 * rig.bpc)
    rig.compute(prompt, table, 0, len(prompt))
    w.start_load_kv(_save_meta(rig, "r", prompt, table))
    w.wait_for_save()
    assert w.wait_idle(30.0)
    assert _saved(rig, prompt) == 2
    assert w.take_failed_saves() == {}
    assert w.stats().saves_cancelled == 0
