"""The event mapping without a sidecar: the msgpack reader, the scheduler's aggregation across
ranks and its mapping to engine block hashes, and the container vLLM's output aggregator merges."""

from __future__ import annotations

import pytest

from kvtier_vllm.errors import ProtocolError
from kvtier_vllm.kv_events import BlockEventMapper, ChunkTransitions, _reachable
from kvtier_vllm.msgpack_lite import unpackb


def test_msgpack_reader_reads_the_forms_the_stream_writes():
    assert unpackb(bytes.fromhex("9501a161c0c3c2")) == [1, "a", None, True, False]
    assert unpackb(bytes.fromhex("ff")) == -1
    assert unpackb(bytes.fromhex("d0df")) == -33
    assert unpackb(bytes.fromhex("ce00010000")) == 65536
    assert unpackb(bytes.fromhex("cf0000010000000000")) == 2**40
    assert unpackb(bytes.fromhex("cb3ff8000000000000")) == 1.5
    assert unpackb(bytes.fromhex("c4020102")) == b"\x01\x02"
    assert unpackb(bytes.fromhex("81a16101")) == {"a": 1}
    long = "x" * 300
    assert unpackb(b"\xda\x01\x2c" + long.encode()) == long
    assert unpackb(b"\xdc\x00\x02\x01\x02") == [1, 2]
    for bad in ("9301", "0101", "d40100", "c405"):
        with pytest.raises(ProtocolError):
            unpackb(bytes.fromhex(bad))


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
