"""The event mapping without a sidecar: the sidecar's payloads as the follower reads them, vLLM's
batches as the test stand-ins write and read them, the scheduler's aggregation across ranks and
its mapping to engine block hashes, and the container vLLM's output aggregator merges."""

from __future__ import annotations

import time

import msgpack
import pytest
import zmq

from kvtier_vllm.kv_events import BlockEventMapper, ChunkTransitions, _reachable
from kvtier_vllm.sidecar_events import END_SEQ, SidecarEventFollower
from support.kv_router import decode_batch
from support.vllm_events import encode_batch, wire_event

NS = bytes.fromhex("00112233445566778899aabbccddeeff")
A, B = b"\x11" * 32, b"\x22" * 32
INSTANCE = "00112233aabbccdd"
#: A batch of every event kind, byte for byte as the sidecar writes it (test/unit/event-log.test.ts
#: pins the same bytes on the sidecar's side): ts 1764355200.125; stored A, B in cpu; removed A
#: from disk (evicted); cleared [NS] (epoch 7); cleared [] (epoch 2^32).
SIDECAR_BATCH = bytes.fromhex(
    "93cb41da4a7b2008000094"
    "95a673746f726564c41000112233445566778899aabbccddeeffa3637075a3435055c440" + "11" * 32 + "22" * 32
    + "96a772656d6f766564c41000112233445566778899aabbccddeeffa46469736ba44449534bc420" + "11" * 32
    + "a765766963746564"
    "93a7636c656172656491c41000112233445566778899aabbccddeeff07"
    "93a7636c656172656490cf0000000100000000"
    "b030303131323233336161626263636464"
)


def test_the_follower_reads_every_event_kind_the_sidecar_writes():
    ctx = zmq.Context.instance()
    pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    for s in (pub, router):
        s.setsockopt(zmq.LINGER, 0)
        s.bind("tcp://127.0.0.1:*")
    f = SidecarEventFollower(
        pub.getsockopt(zmq.LAST_ENDPOINT).decode(), router.getsockopt(zmq.LAST_ENDPOINT).decode(), NS
    )
    try:
        got: list = []
        deadline = time.monotonic() + 20
        while len(got) < 4:
            assert time.monotonic() < deadline, f"got {got}"
            if router.poll(0):
                ident, *req = router.recv_multipart()
                assert req == [b"snapshot", NS]
                # An empty snapshot: no batches, then ["end", 0, instance, seq 0].
                router.send_multipart([ident, END_SEQ, msgpack.packb(["end", 0, INSTANCE, 0])])
            pub.send_multipart([b"kvtier", (1).to_bytes(8, "big"), SIDECAR_BATCH])
            got += f.poll()
            time.sleep(0.01)
        assert got == [("stored", A, "CPU"), ("stored", B, "CPU"), ("cleared",), ("cleared",)]
        assert (f.instance, f.last_seq, f.stats["bad"]) == (INSTANCE, 1, 0)
    finally:
        f.close()
        pub.close(0)
        router.close(0)


def test_the_vllm_stand_in_writes_uint64_block_hashes_and_a_float64_ts_the_router_reads_back():
    stored = wire_event(("stored", (2**64 - 1, 2**63, 5), 2**63 - 1, "CPU", ()), 16)
    removed = wire_event(("removed", (2**64 - 1,), "DISK"), 16)
    cleared = wire_event(("cleared",), 16)
    payload = encode_batch(1764355200.5, [stored, removed, cleared], 0)
    assert payload.startswith(bytes.fromhex("93cb41da4a7b20200000")), "[ts, events, dp]: ts a float64"
    assert bytes.fromhex("93cf" + "ff" * 8 + "cf80" + "00" * 7 + "05") in payload, "uint64 hashes"
    assert decode_batch(payload) == (1764355200.5, [stored, removed, cleared])


def H(i: int) -> bytes:
    return i.to_bytes(32, "big")


def blocks(i: int, bpc: int = 2) -> list[int]:
    return [1000 * i + j for j in range(bpc)]


def test_a_chunk_is_stored_once_every_rank_holds_it_and_removed_when_any_loses_it():
    m = BlockEventMapper(world=2, blocks_per_chunk=2)
    m.remember([H(0), H(1)], blocks(0) + blocks(1))
    m.apply([(0, "stored", H(0), "CPU")])
    assert m.take() == []
    m.apply([(1, "stored", H(0), "DISK"), (0, "stored", H(1), "CPU")])
    assert m.take() == [("stored", (0, 1), None, "DISK", ())]
    m.apply([(1, "stored", H(1), "CPU")])
    assert m.take() == [("stored", (1000, 1001), 1, "CPU", ())]
    assert m.reported_chunks == 2
    # Rank 0 loses chunk 0 (its last tier): loading it needs every rank, so it is gone.
    m.apply([(0, "removed", H(0), None)])
    assert m.take() == [("removed", (0, 1), "DISK")]
    m.apply([(1, "removed", H(0), None)])
    assert m.take() == []
    # Stored again on both: reported again.
    m.apply([(0, "stored", H(0), "CPU"), (1, "stored", H(0), "CPU")])
    assert m.take() == [("stored", (0, 1), None, "CPU", ())]


def test_chunks_seen_before_their_request_are_reported_once_mapped():
    m = BlockEventMapper(world=1, blocks_per_chunk=2)
    m.apply([(0, "stored", H(5), "SHARED"), (0, "stored", H(6), "CPU")])
    assert m.take() == []
    m.remember([H(5), H(6), H(7)], blocks(0) + blocks(1) + [7000])
    assert m.take() == [("stored", (0, 1), None, "SHARED", ()), ("stored", (1000, 1001), 1, "CPU", ())]
    m.remember([H(5)], blocks(0))
    assert m.take() == [], "a chunk is reported once"


def test_clear_removes_each_reported_chunk_by_name_and_chunks_stored_again_are_reported_again():
    m = BlockEventMapper(world=2, blocks_per_chunk=1)
    m.remember([H(0), H(1)], [10, 11])
    m.apply([(r, "stored", H(i), "CPU") for r in (0, 1) for i in (0, 1)])
    assert len(m.take()) == 2
    m.apply([(0, "cleared", None, None), (1, "cleared", None, None), (0, "stored", H(1), "CPU"), (1, "stored", H(1), "CPU")])
    # A BlockRemoved per chunk (routers such as llm-d's ignore AllBlocksCleared), then the
    # chunk stored again since the CLEAR.
    assert m.take() == [("removed", (10,), "CPU"), ("removed", (11,), "CPU"), ("stored", (11,), 10, "CPU", ())]
    m.apply([(0, "cleared", None, None)])
    assert m.take() == [("removed", (11,), "CPU")]
    m.apply([(1, "cleared", None, None)])
    assert m.take() == [], "nothing reported: nothing to remove"


def test_stored_events_carry_the_chunks_tokens_when_the_block_size_is_known():
    m = BlockEventMapper(world=1, blocks_per_chunk=2, block_size=4)
    tokens = list(range(100, 120))  # 5 blocks of 4: two whole chunks and a block
    m.remember([H(0), H(1), H(2)], [1, 2, 3, 4, 5], tokens)
    m.apply([(0, "stored", H(i), "CPU") for i in (0, 1, 2)])
    assert m.take() == [
        ("stored", (1, 2), None, "CPU", tuple(range(100, 108))),
        ("stored", (3, 4), 2, "CPU", tuple(range(108, 116))),
    ]
    # Too few tokens for a chunk: its blocks are still reported, without tokens.
    m2 = BlockEventMapper(world=1, blocks_per_chunk=2, block_size=4)
    m2.remember([H(5)], [9, 10], [1, 2, 3])
    m2.apply([(0, "stored", H(5), "DISK")])
    assert m2.take() == [("stored", (9, 10), None, "DISK", ())]
    with pytest.raises(ValueError):
        BlockEventMapper(world=1, blocks_per_chunk=2, block_size=0)


def test_the_bound_forgets_the_oldest_chunk_and_reports_it_removed():
    m = BlockEventMapper(world=1, blocks_per_chunk=1, max_chunks=3)
    m.remember([H(i) for i in range(3)], [0, 1, 2])
    m.apply([(0, "stored", H(i), "CPU") for i in range(3)])
    assert len(m.take()) == 3
    m.remember([H(3)], [3])
    assert m.take() == [("removed", (0,), "CPU")]
    assert m.reported_chunks == 2


def test_the_container_merges_like_vllms_output_aggregator():
    # vLLM's KVOutputAggregator: the first worker's container accumulates the others' events.
    w0 = ChunkTransitions([(0, "stored", H(1), "CPU")])
    w1 = ChunkTransitions([(1, "stored", H(1), "CPU"), (1, "removed", H(2), None)])
    w0.add_events(w1.get_all_events())
    w0.increment_workers(1)
    assert w0.get_number_of_workers() == 2
    assert w0.aggregate() is w0 and len(w0.get_all_events()) == 3
    w0.clear_events()
    assert w0.get_all_events() == [] and w0.get_number_of_workers() == 1


def test_a_wildcard_host_is_replaced_by_the_sidecars():
    assert _reachable("tcp://0.0.0.0:5557", "tcp://10.0.0.5:5555") == "tcp://10.0.0.5:5557"
    assert _reachable("tcp://*:5557", "tcp://node-a:5555") == "tcp://node-a:5557"
    assert _reachable("tcp://127.0.0.1:5557", "tcp://10.0.0.5:5555") == "tcp://127.0.0.1:5557"
    assert _reachable("ipc:///run/e", "tcp://10.0.0.5:5555") == "ipc:///run/e"


def test_without_msgpack_the_follower_says_in_one_line_what_to_install():
    import subprocess
    import sys
    from pathlib import Path

    import kvtier_vllm

    code = "import sys; sys.modules['msgpack'] = None; import kvtier_vllm.sidecar_events"
    package_root = Path(kvtier_vllm.__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=package_root)
    assert res.returncode != 0
    assert res.stderr.strip().splitlines()[-1] == (
        "ImportError: kvtier_vllm's kv_events needs the msgpack package: "
        "pip install msgpack (Debian: apt-get install python3-msgpack)"
    )
