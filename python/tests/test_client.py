"""The client against a live sidecar (every message type, real server errors, deadlines with the
sidecar frozen by SIGSTOP, a sidecar killed and restarted mid-run), and against a scripted ROUTER
socket for what a well-behaved server never does (replies out of order, late, malformed, stale).
"""

from __future__ import annotations

import os
import struct
import threading
import time

import pytest
import zmq

from kvtier_vllm import protocol as P
from kvtier_vllm.client import KvtierClient, MultiLookupClient, Pending
from kvtier_vllm.errors import (
    ClosedError,
    InvalidArgumentError,
    KvtierError,
    NotFoundError,
    ProtocolError,
    RequestTimeoutError,
    TooLargeError,
)
from kvtier_vllm.hashing import hash_chunks, pack_hashes
from kvtier_vllm.namespace import derive_namespace

WAIT_S = 20.0  # upper bound of any wait in these tests; exceeding it fails, never hangs


def ns_for(name: str) -> bytes:
    return derive_namespace(
        model_id=f"test/{name}", dtype="float16", num_layers=2, num_kv_heads=2, head_dim=8, block_size=4
    ).id


def chunks_for(seed: int, n: int, chunk_size: int = 16):
    return hash_chunks([seed * 100_000 + i for i in range(n * chunk_size)], chunk_size=chunk_size)


def until_answered(client: KvtierClient, lookup_id: str, hashes, counts, namespaces, **kw) -> int:
    deadline = time.monotonic() + WAIT_S
    while True:
        a = client.lookup(lookup_id, hashes, counts, namespaces, **kw)
        if a is not None:
            return a
        assert time.monotonic() < deadline, f"lookup {lookup_id} not answered"
        client.poll(5)


def put_chunks(client: KvtierClient, ns: bytes, chunks, payload: bytes = b"p" * 64) -> None:
    pend = [client.send_put(ns, c.hash, c.tokens, payload) for c in chunks]
    for p in pend:
        assert p.wait().outcome in ("stored", "exists")


# ---------------------------------------------------------------------------------------------
# round trips


def test_ping_stats_clear(sidecar, client_factory):
    c = client_factory(sidecar.endpoint)
    info = c.ping()
    assert info["protocolVersion"] == 1 and info["dataPlane"] is not None
    assert [t["name"] for t in info["tiers"]] == ["cpu"]
    stats = c.stats()
    assert "tiers" in stats and "lookups" in stats
    epoch = c.clear().epoch
    assert epoch == info["epoch"] + 1 and c.max_epoch == epoch
    assert c.clear([ns_for("a"), ns_for("b")]).epoch == epoch + 1


def test_put_get_lookup_cancel(sidecar, client_factory):
    c = client_factory(sidecar.endpoint)
    ns = ns_for("put")
    chunks = chunks_for(1, 3)
    payload = bytes(range(256)) * 4
    assert c.put(ns, chunks[0].hash, 16, payload).outcome == "stored"
    assert c.put(ns, chunks[0].hash, 16, payload).outcome == "exists"
    put_chunks(c, ns, chunks[1:2], payload)
    got = c.get(ns, chunks[0].hash)
    assert got == P.GetResult(True, 16, payload)
    assert c.get(ns, chunks[2].hash) == P.GetResult(False, 0, b"")
    hashes, counts = pack_hashes(chunks), [16, 16, 16]
    # non-blocking: None first, then the number (two chunks ready: a prefix of 32 tokens)
    assert c.lookup("L1", hashes, counts, [ns]) is None
    assert until_answered(c, "L1", hashes, counts, [ns]) == 32
    # the whole reply, with the tier breakdown
    rep = c.send_lookup("L2", hashes, counts, [ns]).wait()
    assert rep == P.LookupResult("L2", "ok", c.max_epoch, 32, 2, [P.TierTokens("cpu", 32)])
    # L2 holds pins: CANCEL finds it once, then not
    assert c.send_cancel("L2").wait() == P.CancelResult(True)
    assert c.send_cancel("L2").wait() == P.CancelResult(False)
    # prefetch/pin off are accepted
    assert until_answered(c, "L3", hashes, counts, [ns], pin=False, prefetch=False) == 32
    assert c.send_cancel("L3").wait().found is False  # pin off: nothing held
    # a lookup over two namespaces counts what both have
    ns2 = ns_for("put2")
    put_chunks(c, ns2, chunks[:1])
    assert until_answered(c, "L4", hashes, counts, [ns, ns2]) == 16


def _kv_file(path, size: int, fill: bytes | None = None) -> str:
    data = fill if fill is not None else os.urandom(size)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


# 2 layers x (K, V), 2 heads x 8 dims of float16 = 32 bytes per token per layer; 4-token blocks of
# 128 bytes; 16 blocks per region; 8-token chunks (2 blocks each).
BLOCK_BYTES = 128
NUM_BLOCKS = 16
REGION_BYTES = NUM_BLOCKS * BLOCK_BYTES


def registration(engine_id: str, path: str, **extra) -> dict:
    layers = [
        {"k": {"path": path, "offsetBytes": (2 * i) * REGION_BYTES}, "v": {"path": path, "offsetBytes": (2 * i + 1) * REGION_BYTES}}
        for i in range(2)
    ]
    reg = {
        "engineId": engine_id,
        "device": "host",
        "modelId": "test/dataplane",
        "dtype": "float16",
        "numKvHeads": 2,
        "headDim": 8,
        "tpSize": 1,
        "tpRank": 0,
        "mla": False,
        "numBlocks": NUM_BLOCKS,
        "blockSize": 4,
        "blockStrideBytes": BLOCK_BYTES,
        "chunkSize": 8,
        "layers": layers,
    }
    reg.update(extra)
    return reg


def block_of(data: bytes, region: int, block: int) -> bytes:
    off = region * REGION_BYTES + block * BLOCK_BYTES
    return data[off : off + BLOCK_BYTES]


def test_data_plane_round_trip(sidecar, client_factory, tmp_path):
    c = client_factory(sidecar.endpoint)
    a_path = _kv_file(tmp_path / "a.kv", 4 * REGION_BYTES)
    b_path = _kv_file(tmp_path / "b.kv", 4 * REGION_BYTES, bytes(4 * REGION_BYTES))
    reg_a = c.register(registration("engine-a", a_path))
    reg_b = c.register(registration("engine-b", b_path))
    expected_ns = derive_namespace(
        model_id="test/dataplane", dtype="float16", num_layers=2, num_kv_heads=2, head_dim=8, block_size=4
    )
    # The sidecar says the in-block order it copies: NHD, the registration naming none.
    assert reg_a == P.RegisterResult("engine-a", expected_ns.id, 8, 4, "NHD")
    assert reg_b.namespace == expected_ns.id
    chunks = hash_chunks(list(range(16)), chunk_size=8)  # 2 chunks of 8 tokens
    hashes = pack_hashes(chunks)
    assert c.save("engine-a", "req-a", 0, [0, 1, 2, 3], hashes) == P.SaveResult(2, 0, 0)
    assert c.save("engine-a", "req-a", 0, [0, 1, 2, 3], hashes) == P.SaveResult(0, 2, 0)
    assert c.request_finished("engine-a", "req-a", "finished").released is True

    # LOAD into other blocks of engine B: byte-exact
    assert until_answered(c, "look-1", hashes, [8, 8], [reg_b.namespace]) == 16
    assert c.load("engine-b", "req-b", "look-1", [8, 9, 10, 11], hashes) == P.LoadResult(16, [])
    a, b = open(a_path, "rb").read(), open(b_path, "rb").read()
    for r in range(4):
        for src, dst in zip([0, 1, 2, 3], [8, 9, 10, 11]):
            assert block_of(b, r, dst) == block_of(a, r, src)

    # skip_blocks: the engine already has chunk 0's first block; 3 blocks are written
    assert until_answered(c, "look-2", hashes, [8, 8], [reg_b.namespace]) == 16
    rep = c.load("engine-b", "req-b2", "look-2", [12, 13, 14], hashes, skip_blocks=1, deadline_ms=5000)
    assert rep == P.LoadResult(12, [])
    b = open(b_path, "rb").read()
    for r in range(4):
        assert block_of(b, r, 12) == block_of(a, r, 1)
        assert block_of(b, r, 14) == block_of(a, r, 3)
        assert block_of(b, r, 15) == bytes(BLOCK_BYTES)

    # an unknown lookup: nothing loaded, every block invalid
    assert c.load("engine-b", "req-b3", "nope", [4, 5, 6, 7], hashes) == P.LoadResult(0, [4, 5, 6, 7])

    # HOLD moves pins to the request; REQUEST_FINISHED releases them
    assert until_answered(c, "look-3", hashes, [8, 8], [reg_b.namespace]) == 16
    assert c.hold("engine-b", "req-b4", "look-3") == P.HoldResult(2)
    assert c.hold("engine-b", "req-b4", "unknown-lookup") == P.HoldResult(0)
    assert c.request_finished("engine-b", "req-b4", "preempted") == P.RequestFinishedResult(False)
    assert c.request_finished("engine-b", "req-b4", "aborted") == P.RequestFinishedResult(True)

    assert c.heartbeat("engine-b") == P.HeartbeatResult(True)
    assert c.unregister("engine-b") == P.UnregisterResult(True)
    assert c.unregister("engine-b") == P.UnregisterResult(False)
    assert c.heartbeat("engine-b") == P.HeartbeatResult(False)
    with pytest.raises(NotFoundError) as info:
        c.load("engine-b", "req-b5", "look-3", [0], hashes[:32])
    assert info.value.code == "KVT_NOT_FOUND"


# ---------------------------------------------------------------------------------------------
# real server errors, each mapped to its class


def test_server_errors_map_to_classes(sidecar, client_factory, tmp_path):
    c = client_factory(sidecar.endpoint)
    ns = ns_for("errors")
    # an empty lookup id (the encoder refuses it, so send the raw body)
    body = struct.pack("<H", 0) + b"\x01" + ns + struct.pack("<II", 0, 0)
    with pytest.raises(InvalidArgumentError) as info:
        c.send_frame(P.MsgType.LOOKUP, body).wait()
    assert info.value.code == "KVT_INVALID_ARGUMENT" and "empty" in info.value.message
    # a token count of 0
    h = chunks_for(2, 1)
    with pytest.raises(InvalidArgumentError, match="token count"):
        c.send_lookup("bad-count", pack_hashes(h), [0], [ns]).wait()
    # the non-blocking lookup answers 0 for an error and remembers why
    assert until_answered(c, "bad-count-2", pack_hashes(h), [0], [ns]) == 0
    assert isinstance(c.last_lookup_error, InvalidArgumentError)
    # more chunks than the server's limit (8192; the wire allows 65536)
    many = 8193
    with pytest.raises(TooLargeError) as info:
        c.send_lookup("too-many", bytes(32) * many, [1] * many, [ns]).wait()
    assert info.value.code == "KVT_TOO_LARGE"
    # PUT with an empty payload
    with pytest.raises(InvalidArgumentError, match="empty"):
        c.put(ns, h[0].hash, 16, b"")
    # trailing bytes and an unknown request type
    with pytest.raises(ProtocolError) as info:
        c.send_frame(P.MsgType.PING, b"x").wait()
    assert info.value.code == "KVT_PROTOCOL"
    with pytest.raises(ProtocolError, match="unknown request type"):
        c.send_frame(0x33).wait()
    # data plane: unknown engine, bad registration, bad block ids
    with pytest.raises(NotFoundError):
        c.save("no-such-engine", "r", 0, [0], h[0].hash)
    with pytest.raises(NotFoundError):
        c.hold("no-such-engine", "r", "l")
    with pytest.raises(InvalidArgumentError, match="numBlocks"):
        c.register(registration("e-bad", str(tmp_path / "x.kv"), numBlocks=0))
    with pytest.raises(InvalidArgumentError):
        c.register(registration("e-bad", str(tmp_path / "missing.kv")))  # the file does not exist
    path = _kv_file(tmp_path / "e.kv", 4 * REGION_BYTES)
    c.register(registration("e-ok", path))
    two = pack_hashes(hash_chunks(list(range(16)), chunk_size=8))
    with pytest.raises(InvalidArgumentError):
        c.save("e-ok", "r", 0, [0, 1, 2], two[:32])  # 3 blocks do not fit 1 chunk of 2
    with pytest.raises(InvalidArgumentError):
        c.save("e-ok", "r", 0, [0, NUM_BLOCKS], two[:32])  # block id out of range
    with pytest.raises(InvalidArgumentError):
        c.load("e-ok", "r", "l", [3, 3], two[:32])  # a block twice
    with pytest.raises(InvalidArgumentError):
        c.load("e-ok", "r", "l", [0, 1], two[:32], skip_blocks=2)  # skip must be < blocks per chunk
    # the server keeps serving after errors
    assert c.ping()["protocolVersion"] == 1


# ---------------------------------------------------------------------------------------------
# many in flight


def test_many_requests_in_flight(shared_sidecar, client_factory):
    c = client_factory(shared_sidecar.endpoint)
    ns = ns_for("inflight")
    chunks = chunks_for(3, 64)
    payloads = {ch.hash: os.urandom(100 + i) for i, ch in enumerate(chunks)}
    puts = [c.send_put(ns, ch.hash, ch.tokens, payloads[ch.hash]) for ch in chunks]
    pings = [c.send_ping() for _ in range(50)]
    gets = [c.send_get(ns, ch.hash) for ch in chunks]  # may run before their PUT: found or not
    assert c.pending_requests == len(puts) + len(pings) + len(gets)
    deadline = time.monotonic() + WAIT_S
    while c.pending_requests:
        c.poll(10)
        assert time.monotonic() < deadline
    assert all(p.done for p in puts + pings + gets)
    assert all(p.result().outcome == "stored" for p in puts)
    for ch, g in zip(chunks, gets):
        r = g.result()
        assert not r.found or r.payload == payloads[ch.hash]
    # every lookup of a batch gets its own answer: lookup i asks for the first i chunks
    hashes = pack_hashes(chunks)
    ids = [f"inflight-{i}" for i in range(1, 65)]
    answers: dict[str, int] = {}
    for i, lid in enumerate(ids, 1):
        assert c.lookup(lid, hashes[: 32 * i], [16] * i, [ns]) is None
    while len(answers) < len(ids):
        for i, lid in enumerate(ids, 1):
            if lid not in answers:
                a = c.lookup(lid, hashes[: 32 * i], [16] * i, [ns])
                if a is not None:
                    answers[lid] = a
        assert time.monotonic() < deadline
        c.poll(5)
    assert answers == {lid: 16 * i for i, lid in enumerate(ids, 1)}
    for lid in ids:
        c.cancel(lid)


def test_request_ids_wrap_and_skip_zero(shared_sidecar, client_factory):
    c = client_factory(shared_sidecar.endpoint)
    c._rid = 0xFFFF_FFFE
    ps = [c.send_ping() for _ in range(3)]
    assert [p.request_id for p in ps] == [0xFFFF_FFFF, 1, 2]
    assert all(p.wait()["protocolVersion"] == 1 for p in ps)


def test_multi_lookup_client_takes_the_minimum(sidecar, shared_sidecar, client_factory):
    # one sidecar per rank (lookup ids are per server: one server hosting both ranks would be
    # asked once with both namespaces instead)
    c1 = client_factory(shared_sidecar.endpoint)
    c2 = client_factory(sidecar.endpoint)
    rank0, rank1 = ns_for("multi-r0"), ns_for("multi-r1")
    chunks = chunks_for(4, 4)
    put_chunks(c1, rank0, chunks[:3])
    put_chunks(c2, rank1, chunks[:2])
    multi = MultiLookupClient([c1, c2], [[rank0], [rank1]])
    hashes, counts = pack_hashes(chunks), [16] * 4
    deadline = time.monotonic() + WAIT_S
    assert multi.lookup("m1", hashes, counts) is None
    while (a := multi.lookup("m1", hashes, counts)) is None:
        assert time.monotonic() < deadline
        c1.poll(5)
    assert a == 32
    # a 0 from any server answers 0 at once and releases the others
    multi2 = MultiLookupClient([c1, c2], [[rank0], [ns_for("multi-empty")]])
    while (a := multi2.lookup("m2", hashes, counts)) is None:
        assert time.monotonic() < deadline
        c2.poll(5)
    assert a == 0
    with pytest.raises(InvalidArgumentError):
        MultiLookupClient([], [])
    with pytest.raises(InvalidArgumentError):
        MultiLookupClient([c1], [])


# ---------------------------------------------------------------------------------------------
# deadlines: the sidecar frozen with SIGSTOP


def test_lookup_deadline_answers_zero_and_cancels(sidecar, client_factory):
    c = client_factory(sidecar.endpoint, lookup_timeout_ms=300)
    ns = ns_for("deadline")
    chunks = chunks_for(5, 2)
    hashes, counts = pack_hashes(chunks), [16, 16]
    put_chunks(c, ns, chunks)
    # control: an answered lookup holds pins, which a CANCEL finds
    assert until_answered(c, "ctl", hashes, counts, [ns]) == 32
    assert c.send_cancel("ctl").wait().found is True

    sidecar.pause()
    try:
        t0 = time.monotonic()
        assert c.lookup("slow", hashes, counts, [ns]) is None
        calls = 0
        while (a := c.lookup("slow", hashes, counts, [ns])) is None:
            calls += 1
            assert time.monotonic() - t0 < WAIT_S
            c.poll(5)
        waited = time.monotonic() - t0
        assert a == 0 and 0.25 <= waited < 5
        assert isinstance(c.last_lookup_error, RequestTimeoutError)
        # lookup() never blocked: each call returned at once
        t1 = time.perf_counter()
        assert c.lookup("slow-2", hashes, counts, [ns]) is None
        assert c.lookup("slow-2", hashes, counts, [ns]) is None
        assert time.perf_counter() - t1 < 0.05
        c.forget("slow-2")
    finally:
        sidecar.resume()
    # The server now runs the LOOKUP (pinning both chunks), then the client's CANCEL, which
    # releases them; its late LOOKUP_RESULT is ignored by the client.
    assert c.ping()["protocolVersion"] == 1
    deadline = time.monotonic() + WAIT_S
    while c.unmatched_replies < 2:  # the late LOOKUP_RESULT and the CANCEL_RESULT
        c.poll(5)
        assert time.monotonic() < deadline
    assert c.send_cancel("slow").wait().found is False, "the deadline's CANCEL released the pins"
    cpu = c.stats()["tiers"][0]
    assert cpu["pinnedChunks"] == 0
    # and the next lookup works
    assert until_answered(c, "after", hashes, counts, [ns]) == 32


def test_unanswered_liveness_ping_fails_requests_at_once_until_the_sidecar_answers(sidecar, client_factory):
    """A frozen sidecar costs one liveness delay, not every request's own deadline."""
    c = client_factory(sidecar.endpoint, lookup_timeout_ms=60_000, request_timeout_ms=60_000, liveness_timeout_ms=200)
    ns = ns_for("liveness")
    chunks = chunks_for(8, 2)
    hashes, counts = pack_hashes(chunks), [16, 16]
    put_chunks(c, ns, chunks)
    assert c.reachable
    sidecar.pause()
    try:
        t0 = time.monotonic()
        assert c.lookup("frozen", hashes, counts, [ns]) is None
        stats = c.send_stats()
        while (a := c.lookup("frozen", hashes, counts, [ns])) is None:
            assert time.monotonic() - t0 < WAIT_S
            c.poll(5)
        waited = time.monotonic() - t0
        assert a == 0 and waited < 5, "answered by the liveness probe, far before the 60 s deadline"
        assert not c.reachable and c.outages == 1
        assert stats.done
        with pytest.raises(RequestTimeoutError) as info:
            stats.result()
        assert "treated as down" in str(info.value)
        # while down, a new lookup answers 0 at once instead of waiting
        assert c.lookup("while-down", hashes, counts, [ns]) == 0
        assert c.pending_requests <= 1  # at most the probe
    finally:
        sidecar.resume()
    deadline = time.monotonic() + WAIT_S
    while not c.reachable:
        assert time.monotonic() < deadline, "the sidecar was never found back"
        c.poll(5)
    assert until_answered(c, "after", hashes, counts, [ns]) == 32
    assert c.outages == 1


def test_blocking_request_times_out(sidecar, client_factory):
    c = client_factory(sidecar.endpoint, request_timeout_ms=200)
    sidecar.pause()
    try:
        p = c.send_ping()
        with pytest.raises(RequestTimeoutError) as info:
            p.wait()
        assert info.value.code == "KVT_TIMEOUT" and p.done
        q = c.send_stats()
        with pytest.raises(RequestTimeoutError):
            q.wait(timeout_ms=20)  # wait's own limit: the request stays pending
        assert not q.done
    finally:
        sidecar.resume()
    assert c.ping(timeout_ms=5000)["protocolVersion"] == 1


def test_poll_checks_the_socket_once_per_round(sidecar, client_factory):
    """1,000 pending lookups asked about once each (one scheduler step) drain the socket once."""
    c = client_factory(sidecar.endpoint, lookup_timeout_ms=60_000)
    ns = ns_for("rounds")
    h = pack_hashes(chunks_for(6, 1))
    sidecar.pause()
    try:
        ids = [f"r{i}" for i in range(1000)]
        for lid in ids:
            assert c.lookup(lid, h, [16], [ns]) is None
        for _ in range(3):
            gen = c._gen
            t0 = time.perf_counter()
            assert all(c.lookup(lid, h, [16], [ns]) is None for lid in ids)
            step = time.perf_counter() - t0
            assert c._gen == gen + 1
        assert step < 0.05  # generous; bench/ measures it
        gen = c._gen
        c.poll()  # an explicit poll per step makes the lookups skip their own check
        assert all(c.lookup(lid, h, [16], [ns]) is None for lid in ids)
        assert c._gen == gen + 1
        for lid in ids:
            c.forget(lid)
    finally:
        sidecar.resume()


# ---------------------------------------------------------------------------------------------
# sidecar killed and restarted mid-run


@pytest.mark.sidecar_options(disk=True)
def test_sidecar_restart_mid_run(sidecar, client_factory):
    c = client_factory(sidecar.endpoint, lookup_timeout_ms=500, request_timeout_ms=1000)
    ns = ns_for("restart")
    chunks = chunks_for(7, 4)
    hashes, counts = pack_hashes(chunks), [16] * 4
    put_chunks(c, ns, chunks)
    # the disk tier has them before the kill (write-through is asynchronous)
    deadline = time.monotonic() + WAIT_S
    while c.stats()["tiers"][1]["chunks"] < 4:
        assert time.monotonic() < deadline
    assert until_answered(c, "before", hashes, counts, [ns]) == 64

    sidecar.pause()  # the lookups below are in flight when the process dies
    ids = [f"lost-{i}" for i in range(20)]
    for lid in ids:
        assert c.lookup(lid, hashes, counts, [ns]) is None
    ping = c.send_ping()
    sidecar.kill()
    t0 = time.monotonic()
    answers = {}
    while len(answers) < len(ids):
        for lid in ids:
            if lid not in answers:
                a = c.lookup(lid, hashes, counts, [ns])
                if a is not None:
                    answers[lid] = a
        c.poll(5)
        assert time.monotonic() - t0 < WAIT_S
    assert set(answers.values()) == {0}
    with pytest.raises(RequestTimeoutError):
        ping.wait()
    assert time.monotonic() - t0 < 5

    sidecar.restart()
    # the same client (its DEALER reconnected) goes on working; the disk tier kept the chunks.
    # A fresh sidecar on a busy machine may answer its first lookup (a disk prefetch) after the
    # client's 500 ms deadline: that is a miss (recompute), so ask again until it hits.
    assert c.ping(timeout_ms=10_000)["uptimeMs"] < 60_000
    deadline = time.monotonic() + WAIT_S
    while (after := until_answered(c, "after", hashes, counts, [ns])) != 64:
        assert after == 0 and time.monotonic() < deadline, f"after the restart: {after} tokens"
    assert after == 64
    assert c.pending_requests == 0


# ---------------------------------------------------------------------------------------------
# a scripted server, for what the sidecar never does


class ScriptedServer:
    """A ROUTER socket the test drives by hand: collect requests, answer as it likes."""

    def __init__(self) -> None:
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"

    def recv(self, n: int) -> list[tuple[bytes, int, int, bytes]]:
        """n requests as (identity, type, request id, frame)."""
        out = []
        deadline = time.monotonic() + WAIT_S
        while len(out) < n:
            assert self.sock.poll(int((deadline - time.monotonic()) * 1000)), "no request came"
            ident, frame = self.sock.recv_multipart()
            out.append((ident, frame[3], struct.unpack_from("<I", frame, 4)[0], frame))
        return out

    def send(self, ident: bytes, frame: bytes) -> None:
        self.sock.send_multipart([ident, frame])

    def close(self) -> None:
        self.sock.close(0)


@pytest.fixture
def scripted():
    s = ScriptedServer()
    yield s
    s.close()


def test_poll_with_a_timeout_blocks_for_the_first_reply_and_takes_in_all_that_wait(client_factory):
    """poll(timeout_ms) waits for a reply (a blocking receive) and then takes in every reply
    already queued, not only the first; with none it returns 0 once the timeout is over. An
    inproc ROUTER makes the replies queued the moment it has sent them."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"inproc://kvtier-poll-{os.getpid()}-{time.monotonic_ns()}"
    router.bind(endpoint)
    try:
        c = client_factory(endpoint, context=ctx)
        t0 = time.monotonic()
        assert c.poll(30) == 0
        assert time.monotonic() - t0 >= 0.025
        pings = [c.send_ping() for _ in range(3)]
        for _ in pings:
            assert router.poll(int(WAIT_S * 1000)), "no request came"
            ident, frame = router.recv_multipart()
            router.send_multipart([ident, _pong(struct.unpack_from("<I", frame, 4)[0], b'{"n":1}')])
        assert c.poll(int(WAIT_S * 1000)) == 3
        assert [p.result() for p in pings] == [{"n": 1}] * 3
        assert c.poll(5) == 0
    finally:
        router.close(0)


def _lookup_result(rid: int, lookup_id: str, hit: int, epoch: int = 5, status: int = 0) -> bytes:
    lid = lookup_id.encode()
    return P.encode_header(0x81, rid) + struct.pack("<H", len(lid)) + lid + struct.pack("<BIIIB", status, epoch, hit, 1, 0)


def _pong(rid: int, info: bytes = b"{}") -> bytes:
    return P.encode_header(0x84, rid) + struct.pack("<I", len(info)) + info


def test_replies_out_of_order(scripted, client_factory):
    c = client_factory(scripted.endpoint)
    lids = [f"o{i}" for i in range(10)]
    for lid in lids:
        assert c.lookup(lid, b"", [], [bytes(16)]) is None
    pings = [c.send_ping() for _ in range(5)]
    reqs = scripted.recv(15)
    # answer in reverse order, each lookup with its own number
    for ident, typ, rid, frame in reversed(reqs):
        if typ == P.MsgType.LOOKUP:
            lid = frame[10 : 10 + frame[8]].decode()
            scripted.send(ident, _lookup_result(rid, lid, 100 + int(lid[1:])))
        else:
            scripted.send(ident, _pong(rid, b'{"rid":%d}' % rid))
    got = {}
    deadline = time.monotonic() + WAIT_S
    while len(got) < 10:
        c.poll(5)
        for lid in lids:
            if lid not in got and (a := c.lookup(lid, b"", [], [bytes(16)])) is not None:
                got[lid] = a
        assert time.monotonic() < deadline
    assert got == {lid: 100 + i for i, lid in enumerate(lids)}
    assert [p.wait()["rid"] for p in pings] == [p.request_id for p in pings]


def test_epoch_rule_and_status(scripted, client_factory):
    c = client_factory(scripted.endpoint)
    ns = [bytes(16)]
    for lid in ("a", "b", "c", "d"):
        c.lookup(lid, b"", [], ns)
    clear = c.send_clear()
    reqs = {frame[10 : 10 + frame[8]].decode() if typ == 1 else "clear": (ident, rid) for ident, typ, rid, frame in scripted.recv(5)}
    ident, rid = reqs["clear"]
    scripted.send(ident, P.encode_header(0x83, rid) + struct.pack("<I", 10))
    assert clear.wait() == P.ClearResult(10) and c.max_epoch == 10
    scripted.send(reqs["a"][0], _lookup_result(reqs["a"][1], "a", 64, epoch=9))  # before the clear
    scripted.send(reqs["b"][0], _lookup_result(reqs["b"][1], "b", 64, epoch=10))
    scripted.send(reqs["c"][0], _lookup_result(reqs["c"][1], "c", 64, epoch=11, status=1))  # canceled
    scripted.send(reqs["d"][0], _lookup_result(reqs["d"][1], "d", 64, epoch=12))  # a newer epoch is fine
    answers = {}
    deadline = time.monotonic() + WAIT_S
    while len(answers) < 4:
        c.poll(5)
        for lid in "abcd":
            if lid not in answers and (a := c.lookup(lid, b"", [], ns)) is not None:
                answers[lid] = a
        assert time.monotonic() < deadline
    assert answers == {"a": 0, "b": 64, "c": 0, "d": 64}
    assert c.max_epoch == 12


def test_malformed_late_and_mismatched_replies(scripted, client_factory):
    clock = [100.0]
    c = client_factory(scripted.endpoint, clock=lambda: clock[0], lookup_timeout_ms=1000)
    ns = [bytes(16)]
    assert c.lookup("bad", b"", [], ns) is None
    ping = c.send_ping()
    stats = c.send_stats()
    late = c.lookup("late", b"", [], ns)
    assert late is None
    (i1, _, r1, _), (i2, _, r2, _), (i3, _, r3, _), (i4, _, r4, _) = scripted.recv(4)
    scripted.send(i1, _lookup_result(r1, "bad", 5) + b"\x00")  # trailing byte
    scripted.send(i2, P.encode_header(0x87, r2) + struct.pack("<I", 2) + b"{}")  # STATS_RESULT to a PING
    scripted.send(i3, b"kv\x01\x87" + struct.pack("<I", r3) + struct.pack("<I", 5) + b"{")  # truncated
    scripted.send(i1, b"junk")  # undecodable, matches nothing
    deadline = time.monotonic() + WAIT_S
    while not (ping.done and stats.done) or c.malformed_replies < 3:
        c.poll(5)
        assert time.monotonic() < deadline
    assert c.lookup("bad", b"", [], ns) == 0 and isinstance(c.last_lookup_error, ProtocolError)
    with pytest.raises(ProtocolError, match="reply type 0x87"):
        ping.result()
    with pytest.raises(ProtocolError):
        stats.result()
    # "late": its deadline passes (injected clock), then the answer arrives and is ignored
    clock[0] += 1.5
    assert c.lookup("late", b"", [], ns) == 0
    cancel = scripted.recv(1)[0]
    assert cancel[1] == P.MsgType.CANCEL and cancel[3][10:] == b"late"  # the deadline's CANCEL
    before = c.unmatched_replies
    scripted.send(i4, _lookup_result(r4, "late", 99))
    while c.unmatched_replies == before:
        c.poll(5)
        assert time.monotonic() < deadline
    # a new lookup with the same id is a new request
    assert c.lookup("late", b"", [], ns) is None


def test_forget_cancel_close(scripted, client_factory):
    c = client_factory(scripted.endpoint)
    ns = [bytes(16)]
    c.lookup("f", b"", [], ns)
    c.forget("f")
    c.cancel("g")
    c.forget("never-asked")  # unknown: nothing sent
    frames = scripted.recv(3)
    assert [f[1] for f in frames] == [P.MsgType.LOOKUP, P.MsgType.CANCEL, P.MsgType.CANCEL]
    assert [f[3][10:] for f in frames[1:]] == [b"f", b"g"]
    # the forgotten lookup's answer is ignored; a new lookup with the id starts over
    scripted.send(frames[0][0], _lookup_result(frames[0][2], "f", 7))
    assert c.lookup("f", b"", [], ns) is None
    with pytest.raises(InvalidArgumentError):
        c.cancel("")
    p = c.send_ping()
    c.close()
    c.close()  # idempotent
    assert c.closed and p.done
    with pytest.raises(ClosedError):
        p.result()
    assert c.lookup("x", b"", [], ns) == 0
    with pytest.raises(ClosedError):
        c.send_ping().result()


def test_bad_arguments_raise_before_sending(scripted, client_factory):
    c = client_factory(scripted.endpoint)
    with pytest.raises(InvalidArgumentError):
        c.lookup("", b"", [], [bytes(16)])
    with pytest.raises(TooLargeError):
        c.lookup("x" * 257, b"", [], [bytes(16)])
    with pytest.raises(InvalidArgumentError):
        c.lookup("x", bytes(32), [], [bytes(16)])
    with pytest.raises(InvalidArgumentError):
        c.send_request_finished("e", "r", "done")
    with pytest.raises(InvalidArgumentError):
        KvtierClient(scripted.endpoint, lookup_timeout_ms=0)
    assert c.pending_requests == 0
    assert not scripted.sock.poll(50)


def test_pending_result_before_done(scripted, client_factory):
    c = client_factory(scripted.endpoint)
    p = c.send_ping()
    assert isinstance(p, Pending) and not p.done
    with pytest.raises(RuntimeError, match="still pending"):
        p.result()
    (ident, _, rid, _), = scripted.recv(1)

    def answer():
        time.sleep(0.05)
        scripted.send(ident, _pong(rid, b'{"ok":true}'))

    t = threading.Thread(target=answer)
    t.start()
    try:
        assert p.wait(timeout_ms=5000) == {"ok": True}
    finally:
        t.join()
    assert p.exception() is None and p.result() == {"ok": True}
