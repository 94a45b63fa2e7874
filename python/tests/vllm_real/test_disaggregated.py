"""Disaggregated prefill under vLLM's own scheduler (docs/fleet.md "Disaggregated prefill"): a
producer engine (``kv_role: kv_producer``) and a consumer engine (``kv_consumer``) on two
sidecars, which share a directory (an ``fs`` tier) or are each other's peer tier.

As vLLM's disaggregated proxy does: the prompt goes to the producer with ``max_tokens=1``; the
``kv_transfer_params`` of its output go into the consumer's request. The producer keeps the
request's blocks after it finished (vLLM's delayed free) until its workers report the saves over
(``finished_sending``); the consumer's lookup waits for the producer's chunks (also when its
request arrives before they are saved), loads them into other blocks, and its first token is
computed from KV byte-exact to the producer's. Bad parameters are logged and looked up plainly.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

import pytest

import tests.conftest as base
from kvtier_vllm.client import KvtierClient
from kvtier_vllm.handoff import HandoffRole
from kvtier_vllm.hashing import hash_chunks
from tests.conftest import Sidecar
from tests.vllm_real.harness.helpers import offered, prompt, step_until

CPU = {"name": "cpu", "type": "local-cpu", "capacityBytes": 64 * 1024 * 1024}
CHUNK = 32  # EngineSpec's chunk_size


def _pair_fs():
    shared = Path(tempfile.mkdtemp(prefix="kvtier-disagg-fs-"))
    tiers = [CPU, {"name": "shared", "type": "fs", "path": str(shared)}]
    p = Sidecar(config={"tiers": tiers})
    c = Sidecar(config={"tiers": tiers})
    return p, c, shared


def _pair_peers(monkeypatch):
    ports = [base.free_port(), base.free_port()]
    peers = [{"name": n, "endpoint": f"tcp://127.0.0.1:{port}"} for n, port in zip("pc", ports)]
    made = []
    for name, port in zip("pc", ports):
        monkeypatch.setattr(base, "free_port", lambda port=port: port)
        tier = {"name": "peers", "type": "peer", "self": name, "peers": peers, "timeoutMs": 5000, "probeIntervalMs": 200}
        made.append(Sidecar(config={"tiers": [CPU, tier]}))
    monkeypatch.undo()
    return made[0], made[1], None


@pytest.fixture(params=["fs", "peers"])
def sidecars(request, monkeypatch):
    p, c, shared = _pair_fs() if request.param == "fs" else _pair_peers(monkeypatch)
    try:
        yield p, c
    finally:
        p.close()
        c.close()
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)


def _add(engine, rid: str, tokens: list[int], max_tokens: int, params: dict | None):
    """``RealEngine.add_request`` with ``kv_transfer_params`` (where vLLM's API server puts them)."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    sp = SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, extra_args=None if params is None else {"kv_transfer_params": params}
    )
    req = Request(
        request_id=rid, prompt_token_ids=list(tokens), sampling_params=sp, pooling_params=None,
        block_hasher=engine._block_hasher,
    )
    engine.scheduler.add_request(req)
    return req


def _params_of(engine, rid: str):
    outs = [o for o in engine.outputs if o.request_id == rid and o.finish_reason is not None]
    assert len(outs) == 1
    return outs[0].kv_transfer_params


def _awaits(sidecar) -> dict:
    client = KvtierClient(sidecar.endpoint, request_timeout_ms=30000)
    try:
        return client.stats()["lookupAwaits"]
    finally:
        client.close()


def _written_through(sidecar, timeout_s: float = 60.0) -> None:
    """Waits until the sidecar's write-through queue is empty."""
    client = KvtierClient(sidecar.endpoint, request_timeout_ms=30000)
    try:
        deadline = time.monotonic() + timeout_s
        while client.stats()["writeThrough"]["depth"] > 0:
            assert time.monotonic() < deadline, "write-through did not drain"
            time.sleep(0.01)
    finally:
        client.close()


def _engines(engine, sidecars, **consumer_extra):
    p_sc, c_sc = sidecars
    producer = engine(sidecar=p_sc, kv_role="kv_producer")
    consumer = engine(
        sidecar=c_sc, kv_role="kv_consumer", model_id=producer.spec.model_id,
        extra={"handoff_producers": [p_sc.endpoint], **consumer_extra},
    )
    return producer, consumer


def _same_kv(producer, p_rid, consumer, c_rid, tokens):
    """Both ranks' KV of the first ``tokens`` tokens, read from each engine's own blocks."""
    a = producer.gather(p_rid, tokens)
    b = consumer.gather(c_rid, tokens)
    assert len(a) == len(b) == 2
    for ra, rb in zip(a, b):
        assert ra.tobytes() == rb.tobytes(), "the consumer's KV is byte-exact to the producer's"


def test_handoff_through_vllms_disaggregated_flow(engine, sidecars):
    producer, consumer = _engines(engine, sidecars)
    p = prompt(41, 100)
    _add(producer, "pre", p, 1, {"do_remote_decode": True})
    step_until(producer, lambda: "pre" in producer.finished)
    params = _params_of(producer, "pre")
    assert params["kvtier"]["chunks"] == 3 and params["kvtier"]["sidecar"] == sidecars[0].endpoint
    assert "pre" in producer.scheduler.requests, "finished; its blocks kept (delayed free) while saves may read them"
    _add(consumer, "dec", p, 3, params)
    step_until(consumer, lambda: (r := consumer.scheduler.requests.get("dec")) is not None and r.num_output_tokens >= 1)
    assert offered(consumer, "dec") == [96], "three chunks from the producer, never the last prompt token"
    _same_kv(producer, "pre", consumer, "dec", 96)
    producer.run()
    assert "pre" not in producer.scheduler.requests, "freed once its workers reported the saves over"
    consumer.run()
    assert consumer.stats.loaded_blocks_compared == 2 * 6, "both ranks' six loaded blocks were read by attention"
    assert consumer.scheduler.connector._scheduler.handoff_stats()["awaited"] == 1
    assert producer.scheduler.connector._scheduler.handoff_stats()["params_sent"] == 1


def test_consumer_request_waits_for_a_save_not_made_yet(engine, sidecars):
    """The decode request arrives first (its parameters are what the producer will name): its
    lookup stays pending, step after step, until the producer's chunks are there."""
    producer, consumer = _engines(engine, sidecars)
    p = prompt(42, 100)
    # The parameters the producer will name (same model: the same namespace and hashes).
    role: HandoffRole = producer.scheduler.connector._scheduler._handoff
    params = role.params("pre", [c.hash for c in hash_chunks(p, chunk_size=CHUNK)][:3])
    _add(consumer, "dec2", p, 2, params)
    before = _awaits(sidecars[1])
    for _ in range(10):
        consumer.step()
    assert "dec2" in consumer.scheduler.requests and not offered(consumer, "dec2"), "waiting for the producer"
    assert _awaits(sidecars[1])["waiting"] >= 1
    _add(producer, "pre", p, 1, None)
    producer.run()
    consumer.run()
    assert offered(consumer, "dec2") == [96]
    # One lookup per KV rank (TP 2), both on the consumer's sidecar.
    assert _awaits(sidecars[1])["arrived"] == before["arrived"] + 2
    _same_kv_of_finished = consumer.stats.loaded_blocks_compared
    assert _same_kv_of_finished == 2 * 6


def test_wait_is_bounded_then_the_request_computes(engine, sidecars):
    producer, consumer = _engines(engine, sidecars, handoff_wait_ms=300)
    p = prompt(43, 100)
    role: HandoffRole = producer.scheduler.connector._scheduler._handoff
    params = role.params("never", [c.hash for c in hash_chunks(p, chunk_size=CHUNK)][:3])
    before = _awaits(sidecars[1])
    _add(consumer, "dec", p, 2, params)
    consumer.run()
    assert offered(consumer, "dec") == [0], "nothing arrived within the bound: computed"
    assert _awaits(sidecars[1])["timedOut"] == before["timedOut"] + 2, "one lookup per KV rank, each counted"


def test_bad_params_are_logged_and_looked_up_plainly(engine, sidecars, caplog):
    # Without the prefill-rate rule a plain lookup claims every hit (with it, a tiny model's
    # prefill may beat fetching from the shared tier, and the plain lookup declines it).
    producer, consumer = _engines(engine, sidecars, prefill_tokens_per_s="off")
    p = prompt(44, 100)
    _add(producer, "pre", p, 1, None)
    producer.run()
    # A plain lookup does not wait for the producer's write-through (to the shared directory,
    # or PEER_PUT to the chunks' homes): let it finish first.
    _written_through(sidecars[0])
    good = _params_of(producer, "pre")["kvtier"]
    bad = {
        "other-ns": {"kvtier": {**good, "namespace": "00" * 16}},
        "other-sidecar": {"kvtier": {**good, "sidecar": "tcp://10.9.9.9:5555"}},
        "other-prompt": {"kvtier": {**good, "last_hash": "ab" * 32}},
        "malformed": {"kvtier": {**good, "chunks": "three"}},
        "not-a-dict": {"kvtier": [1, 2]},
    }
    caplog.set_level(logging.ERROR, logger="kvtier_vllm.handoff")
    for i, (name, params) in enumerate(bad.items()):
        _add(consumer, name, p + [i + 1], 2, params)
    consumer.run()
    for name in bad:
        assert consumer.finished[name] is not None
        assert any(
            "kv_transfer_params are refused" in r.getMessage() and f"request {name}:" in r.getMessage()
            for r in caplog.records
        ), name
    assert sum(sum(offered(consumer, name)) for name in bad) >= 96, "plain lookups found the producer's chunks"
    assert consumer.scheduler.connector._scheduler.handoff_stats()["refused_params"] == len(bad)
