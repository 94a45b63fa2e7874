"""The client's side of "never slower than recomputing" against a live sidecar: a lookup that names
the engine's prefill rate (``compute_tokens_per_s``) keeps its whole answer for
:meth:`KvtierClient.lookup_details` (tiers, bytes per token, each tier's rate and decision), a
disk tier that cannot beat the engine is declined, ``timeout_ms`` shortens a lookup's deadline,
and :class:`MultiLookupClient` passes all of it through. No time is asserted: the rates are
chosen so that any tier wins (one token a second) or none does (10^15 tokens a second).
"""

from __future__ import annotations

import math
import struct
import time

import pytest
import zmq

from kvtier_vllm import protocol as P
from kvtier_vllm.client import KvtierClient, LookupDetails, MultiLookupClient, admitted_tokens, lookup_wait_ms
from kvtier_vllm.lookup_rule import worth_a_step
from kvtier_vllm.errors import InvalidArgumentError
from kvtier_vllm.hashing import hash_chunks, pack_hashes
from kvtier_vllm.namespace import derive_namespace

WAIT_S = 20.0
#: The clients' lookup deadline: a busy machine may take seconds over a lookup that reads disk.
SLOW_OK = {"lookup_timeout_ms": int(WAIT_S * 1000)}
NEVER_WINS = 1e15  # tokens/s no engine computes: any measured tier loses
ALWAYS_WINS = 1.0  # one token a second: any tier wins
PAYLOAD = bytes(range(256)) * 4  # 1 KiB over 16 tokens: 64 bytes per token


def ns_for(name: str) -> bytes:
    return derive_namespace(
        model_id=f"test/{name}", dtype="float16", num_layers=2, num_kv_heads=2, head_dim=8, block_size=4
    ).id


def chunks_for(seed: int, n: int):
    return hash_chunks([seed * 100_000 + i for i in range(n * 16)], chunk_size=16)


def put(c: KvtierClient, ns: bytes, chunks) -> None:
    for p in [c.send_put(ns, ch.hash, ch.tokens, PAYLOAD) for ch in chunks]:
        assert p.wait().outcome in ("stored", "exists")


def answered(c, lookup_id: str, chunks, ns, **kw) -> int:
    hashes, counts = pack_hashes(chunks), [ch.tokens for ch in chunks]
    deadline = time.monotonic() + WAIT_S
    while True:
        a = c.lookup(lookup_id, hashes, counts, [ns], **kw)
        if a is not None:
            return a
        assert time.monotonic() < deadline, f"lookup {lookup_id} not answered"
        c.poll(5)


def test_details_of_a_lookup_that_named_the_rate(sidecar, client_factory):
    c = client_factory(sidecar.endpoint, **SLOW_OK)
    ns = ns_for("details")
    chunks = chunks_for(1, 3)
    put(c, ns, chunks)
    assert answered(c, "d", chunks, ns, compute_tokens_per_s=12_577.5) == 48
    d = c.lookup_details("d")
    assert d == LookupDetails("ok", 48, [P.TierTokens("cpu", 48)], 64, [P.TierRate("cpu", "none", 0, 0, 0)])
    assert c.lookup_details("d") is None, "given once"
    assert admitted_tokens(d) == 48
    # without the rate: the same number, no details kept
    assert answered(c, "plain", chunks, ns) == 48
    assert c.lookup_details("plain") is None
    # the blocking form returns them in the reply
    rep = c.send_lookup("blocking", pack_hashes(chunks), [16] * 3, [ns], compute_tokens_per_s=1000).wait()
    assert rep.hit_tokens == 48 and rep.bytes_per_token == 64 and [t.tier for t in rep.tier_rates] == ["cpu"]
    assert c.send_lookup("old", pack_hashes(chunks), [16] * 3, [ns]).wait().tier_rates is None


def test_rate_and_timeout_are_checked_before_anything_is_sent(sidecar, client_factory):
    c = client_factory(sidecar.endpoint, **SLOW_OK)
    ns = ns_for("bad")
    for bad in (0, -1.0, math.nan, math.inf, "1000", True):
        with pytest.raises(InvalidArgumentError, match="compute_tokens_per_s"):
            c.lookup("x", b"", [], [ns], compute_tokens_per_s=bad)
    for bad in (0, -5, "10", False):
        with pytest.raises(InvalidArgumentError, match="timeout_ms"):
            c.lookup("y", b"", [], [ns], timeout_ms=bad)
    assert c.pending_requests == 0
    with pytest.raises(InvalidArgumentError):
        lookup_wait_ms(256, 0)
    assert lookup_wait_ms(256, 1000) == 256 and lookup_wait_ms(1, 1e9) == 1


@pytest.mark.sidecar_options(disk=True)
def test_a_disk_tier_the_engine_outruns_is_declined(sidecar, client_factory):
    c = client_factory(sidecar.endpoint, **SLOW_OK)
    ns = ns_for("disk")
    first, second = chunks_for(2, 2), chunks_for(3, 2)
    put(c, ns, first + second)
    deadline = time.monotonic() + WAIT_S
    while c.stats()["tiers"][1]["chunks"] < 4:  # written through to the disk tier
        assert time.monotonic() < deadline
    c.close()
    sidecar.restart()  # host memory empty, the disk tier warm
    c = client_factory(sidecar.endpoint, **SLOW_OK)
    deadline = time.monotonic() + WAIT_S
    while c.stats()["tiers"][1]["chunks"] < 4:  # the restarted disk tier has read its index
        assert time.monotonic() < deadline, "the disk tier did not come back with its chunks"
        time.sleep(0.05)
    # The disk tier is not measured yet: its hits are fetched, which measures it.
    assert answered(c, "a", first, ns, compute_tokens_per_s=NEVER_WINS) == 32
    d = c.lookup_details("a")
    assert d.status == "ok" and d.tiers == [P.TierTokens("disk", 32)]
    disk = next(r for r in d.tier_rates if r.tier == "disk")
    assert disk.decision == "load" and disk.read_bytes_per_sec > 0
    assert c.stats()["tiers"][1]["readRate"]["source"] == "measured"
    # Measured now: no engine computes 10^15 tokens a second, so fetching cannot win.
    assert answered(c, "b", second, ns, compute_tokens_per_s=NEVER_WINS) == 0
    d = c.lookup_details("b")
    assert d.status == "ok" and d.hit_tokens == 0 and d.tiers == []
    assert next(r for r in d.tier_rates if r.tier == "disk").decision == "decline"
    # At one token a second any tier wins.
    assert answered(c, "c", second, ns, compute_tokens_per_s=ALWAYS_WINS) == 32
    assert c.lookup_details("c").tiers == [P.TierTokens("disk", 32)]


def test_timeout_ms_shortens_the_deadline():
    """A ROUTER that never answers, and an injected clock: the lookup answers 0 at its own
    shorter deadline, with a CANCEL, and its details say so."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    clock = [100.0]
    c = KvtierClient(f"tcp://127.0.0.1:{port}", clock=lambda: clock[0], lookup_timeout_ms=2000)
    try:
        ns = [bytes(16)]
        assert c.lookup("t", b"", [], ns, compute_tokens_per_s=1000, timeout_ms=50) is None
        assert router.poll(int(WAIT_S * 1000)), "no LOOKUP came"
        ident, frame = router.recv_multipart()
        assert frame[3] == P.MsgType.LOOKUP and b'"computeTokensPerSec":1000' in frame
        clock[0] += 0.049
        assert c.lookup("t", b"", [], ns) is None
        clock[0] += 0.002
        assert c.lookup("t", b"", [], ns) == 0
        assert c.lookup_details("t") == LookupDetails("timeout", 0, [], None, None)
        assert router.poll(int(WAIT_S * 1000))
        assert router.recv_multipart()[1][3] == P.MsgType.CANCEL
        # the client's own deadline stays the upper bound
        assert c.lookup("u", b"", [], ns, timeout_ms=60_000) is None
        router.recv_multipart()
        clock[0] += 1.999
        assert c.lookup("u", b"", [], ns) is None
        clock[0] += 0.002
        assert c.lookup("u", b"", [], ns) == 0
    finally:
        c.close()
        router.close()


def test_multi_lookup_client_gives_the_details_of_the_server_with_the_fewest_tokens(sidecar, client_factory):
    a, b = client_factory(sidecar.endpoint, **SLOW_OK), client_factory(sidecar.endpoint, **SLOW_OK)
    ns_a, ns_b = ns_for("multi-a"), ns_for("multi-b")
    chunks = chunks_for(4, 3)
    put(a, ns_a, chunks)
    put(a, ns_b, chunks[:1])
    m = MultiLookupClient([a, b], [[ns_a], [ns_b]])
    hashes, counts = pack_hashes(chunks), [16] * 3
    deadline = time.monotonic() + WAIT_S
    while (got := m.lookup("m", hashes, counts, compute_tokens_per_s=5000)) is None:
        assert time.monotonic() < deadline
        m.poll()
    assert got == 16
    d = m.lookup_details("m")
    assert d.hit_tokens == 16 and d.tiers == [P.TierTokens("cpu", 16)] and d.tier_rates is not None
    assert m.lookup_details("m") is None


def test_admitted_tokens_stops_at_a_tier_the_sidecar_did_not_load():
    rate = lambda tier, decision: P.TierRate(tier, decision, 10**9, 100, 0)  # noqa: E731
    tiers = [P.TierTokens("cpu", 16), P.TierTokens("disk", 16), P.TierTokens("s3", 16)]
    loaded = LookupDetails("ok", 48, tiers, 64, [rate("cpu", "none"), rate("disk", "load"), rate("s3", "load")])
    assert admitted_tokens(loaded) == 48
    assert admitted_tokens(loaded._replace(tier_rates=None)) == 48, "a sidecar without rates"
    cut = loaded._replace(tier_rates=[rate("cpu", "none"), rate("disk", "load"), rate("s3", "none")])
    assert admitted_tokens(cut) == 32


def test_a_lookup_result_carrying_rates_decodes_on_the_slow_path_as_the_fast_one_would():
    """A LOOKUP_RESULT with the trailing fields goes past the fast reader to the table's."""
    lid = b"r"
    body = struct.pack("<H", 1) + lid + struct.pack("<BIIIB", 0, 5, 16, 1, 1) + struct.pack("<H", 3) + b"cpu" + struct.pack("<I", 16)
    rates = struct.pack("<IB", 64, 1) + struct.pack("<H", 3) + b"cpu" + struct.pack("<BQII", 0, 0, 0, 0)
    _, _, rep = P.decode_reply(P.encode_header(0x81, 9) + body + rates)
    assert rep.hit_tokens == 16 and rep.bytes_per_token == 64
    assert rep.tier_rates == [P.TierRate("cpu", "none", 0, 0, 0)]
    _, _, plain = P.decode_reply(P.encode_header(0x81, 9) + body)
    assert plain.bytes_per_token is None and plain.tier_rates is None


def test_worth_a_step_only_when_computing_would_take_longer_than_the_step():
    assert worth_a_step(2048, 12_000, 0.0), "waiting costs an idle engine nothing"
    assert worth_a_step(2048, 12_000, 100.0)  # 171 ms of compute
    assert not worth_a_step(1024, 12_000, 100.0)  # 85 ms: the step computes them
    assert not worth_a_step(0, 12_000, 0.0)
    with pytest.raises(InvalidArgumentError):
        worth_a_step(10, 0, 1.0)
