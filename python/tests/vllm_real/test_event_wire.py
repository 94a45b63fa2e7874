"""vLLM's KV event batches on the wire, as vLLM's own encoder writes them (msgspec, array-like
tagged structs), against the test stand-ins the router tests use without vLLM: the stand-in
publisher's encoder (tests/support/vllm_events.py, the msgpack package) writes vLLM's bytes for
the same values, uint64 block hashes and a float64 timestamp included; vLLM's decoder reads the
stand-in's events; and the router's reader (tests/support/kv_router.py) reads vLLM's bytes."""

from __future__ import annotations

import msgspec

from tests.support.kv_router import decode_batch
from tests.support.vllm_events import encode_batch, wire_event

TS = 1764355200.125
HASHES = (2**64 - 1, 2**63, 2**32, 5)


def _vllm_events() -> list:
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    return [
        BlockStored(
            block_hashes=list(HASHES), parent_block_hash=2**63 - 1, token_ids=[1, 2, 70_000], block_size=16,
            lora_id=None, medium="CPU", lora_name=None, extra_keys=[("salt",), None, None, None],
        ),
        BlockStored(
            block_hashes=[7], parent_block_hash=None, token_ids=[], block_size=16,
            lora_id=3, medium="SHARED", lora_name="sql",
        ),
        BlockRemoved(block_hashes=list(HASHES[:2]), medium="DISK"),
        AllBlocksCleared(),
    ]


def _vllm_bytes(dp_rank) -> bytes:
    from vllm.distributed.kv_events import KVEventBatch

    return msgspec.msgpack.encode(KVEventBatch(ts=TS, events=_vllm_events(), data_parallel_rank=dp_rank))


def test_the_stand_in_encoder_writes_vllms_bytes_for_vllms_values():
    for dp_rank in (0, 3, None):
        wire = _vllm_bytes(dp_rank)
        # vLLM's events as the plain arrays msgspec writes for them (tag first, every field).
        events = msgspec.msgpack.decode(wire)[1]
        assert encode_batch(TS, events, dp_rank) == wire, f"data_parallel_rank {dp_rank}"


def test_vllms_decoder_reads_the_stand_in_events():
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    stand_in = [
        wire_event(("stored", HASHES, 2**63 - 1, "CPU", ()), 16),
        wire_event(("removed", HASHES[:2], "DISK"), 16),
        wire_event(("cleared",), 16),
    ]
    batch = msgspec.msgpack.decode(encode_batch(TS, stand_in, 0), type=KVEventBatch)
    assert batch.ts == TS and batch.data_parallel_rank == 0
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == list(HASHES)
    assert (stored.parent_block_hash, stored.medium, stored.block_size) == (2**63 - 1, "CPU", 16)
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == list(HASHES[:2])
    assert isinstance(cleared, AllBlocksCleared)


def test_the_router_reads_vllms_bytes():
    ts, events = decode_batch(_vllm_bytes(0))
    assert ts == TS
    assert [e[0] for e in events] == ["BlockStored", "BlockStored", "BlockRemoved", "AllBlocksCleared"]
    assert events[0][1] == list(HASHES), "uint64 block hashes stay exact"
    assert events[0][2] == 2**63 - 1 and events[0][3] == [1, 2, 70_000]
    assert events[1][6] == "SHARED" and events[2][1:3] == [list(HASHES[:2]), "DISK"]
