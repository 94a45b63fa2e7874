"""What the connector's KV events carry beyond block hashes, without vLLM: the fields of vLLM's own
``BlockStored``/``BlockRemoved`` (vLLM 9aaf83ef, ``vllm/distributed/kv_events.py``, filled as
``vllm/v1/core/block_pool.py`` fills them for the GPU's blocks), each block's extra keys as
vLLM's ``generate_block_hash_extra_keys`` makes them, the request's LoRA, and the prefix-closed
reporting that keeps a router's prefix tree whole."""

from __future__ import annotations

from kvtier_vllm.kv_events import BlockEvent, BlockEventMapper, block_extra_keys, event_fields


def H(i: int) -> bytes:
    return i.to_bytes(32, "big")


def stored(m: BlockEventMapper, *hashes: int) -> None:
    m.apply([(0, "stored", H(h), "CPU") for h in hashes])


def test_stored_fields_are_vllms_with_one_extra_key_per_block():
    ev = BlockEvent("stored", (11, 12), "DISK", 10, tuple(range(8)), (("tenant",), None), 3, "sql")
    name, kw = event_fields(ev, 4, group_idx=0, kv_cache_spec_kind="full_attention")
    assert name == "BlockStored"
    assert kw == {
        "block_hashes": [11, 12],
        "parent_block_hash": 10,
        "token_ids": list(range(8)),
        "block_size": 4,
        "lora_id": 3,
        "medium": "DISK",
        "lora_name": "sql",
        "extra_keys": [("tenant",), None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
        "kv_cache_spec_sliding_window": None,
    }
    # A block without extra keys is None in the list, as vLLM's block pool sends it.
    _, plain = event_fields(BlockEvent("stored", (1, 2), "CPU"), 4)
    assert plain["extra_keys"] == [None, None] and plain["lora_id"] is None and plain["lora_name"] is None


def test_removed_fields_are_vllms():
    assert event_fields(BlockEvent("removed", (11, 12), "SHARED"), 4, group_idx=0, kv_cache_spec_kind="x") == (
        "BlockRemoved",
        {"block_hashes": [11, 12], "medium": "SHARED", "group_idx": 0},
    )


def test_extra_keys_are_derived_as_vllm_derives_them():
    # LoRA name on every block, the salt on the first block only, then each multimodal span's
    # (identifier, offset from the block's start) on the blocks it overlaps.
    assert block_extra_keys(3, 4, lora_name="sql", cache_salt="t") == [("sql", "t"), ("sql",), ("sql",)]
    assert block_extra_keys(2, 4) == [None, None]
    assert block_extra_keys(4, 4, mm=[("img", 2, 7)]) == [(("img", 2),), (("img", -2),), (("img", -6),), None]
    assert block_extra_keys(2, 4, lora_name="a", cache_salt="s", mm=[("i", 1, 1)]) == [("a", ("i", 1), "s"), ("a",)]


def test_each_chunk_carries_its_requests_lora_and_its_blocks_extra_keys():
    m = BlockEventMapper(world=1, blocks_per_chunk=2, block_size=2)
    extra = [("s",), None, None, None]
    m.remember([H(0), H(1)], [10, 11, 12, 13], list(range(8)), extra, (7, "sql"))
    stored(m, 0, 1)
    assert m.take_records() == [
        BlockEvent("stored", (10, 11), "CPU", None, (0, 1, 2, 3), (("s",), None), 7, "sql"),
        BlockEvent("stored", (12, 13), "CPU", 11, (4, 5, 6, 7), None, 7, "sql"),
    ]
    # take() is the compact form of the same events.
    m.apply([(0, "removed", H(1), None)])
    assert m.take() == [("removed", (12, 13), "CPU")]


def test_prefix_closed_reports_what_a_load_can_use():
    m = BlockEventMapper(world=1, blocks_per_chunk=1, prefix_closed=True)
    m.remember([H(0), H(1), H(2)], [10, 11, 12])
    # The second and third chunks arrive first: nothing a load can use yet.
    stored(m, 1, 2)
    assert m.take() == []
    stored(m, 0)
    assert [e[1] for e in m.take()] == [(10,), (11,), (12,)], "parents before children"
    # The first chunk is lost: the chunks after it cannot be loaded either.
    m.apply([(0, "removed", H(0), None)])
    assert m.take() == [("removed", (10,), "CPU"), ("removed", (11,), "CPU"), ("removed", (12,), "CPU")]
    assert m.reported_chunks == 0
    # It comes back: so do they (still held).
    stored(m, 0)
    assert [e[1] for e in m.take()] == [(10,), (11,), (12,)]
    # A middle chunk lost takes only what follows it.
    m.apply([(0, "removed", H(1), None)])
    assert m.take() == [("removed", (11,), "CPU"), ("removed", (12,), "CPU")]


def test_prefix_closed_follows_shared_prefixes():
    m = BlockEventMapper(world=1, blocks_per_chunk=1, prefix_closed=True)
    m.remember([H(0), H(1)], [10, 11])
    m.remember([H(0), H(2)], [10, 12])
    stored(m, 1, 2, 0)
    assert sorted(e[1] for e in m.take()) == [(10,), (11,), (12,)]
    m.apply([(0, "removed", H(0), None)])
    assert sorted(e[1] for e in m.take()) == [(10,), (11,), (12,)]


def test_prefix_closed_clear_and_bound():
    m = BlockEventMapper(world=1, blocks_per_chunk=1, max_chunks=3, prefix_closed=True)
    m.remember([H(0), H(1)], [10, 11])
    stored(m, 0, 1)
    m.take()
    # After a CLEAR only the second chunk is stored again: without the first, not reported.
    m.apply([(0, "cleared", None, None), (0, "stored", H(1), "CPU")])
    assert m.take() == [("removed", (10,), "CPU"), ("removed", (11,), "CPU")]
    stored(m, 0)
    assert [e[1] for e in m.take()] == [(10,), (11,)]
    stored(m, 1)  # seen again: the first chunk is now the oldest
    assert m.take() == []
    # The bound forgets the oldest chunk (the first): the one after it goes too.
    m.remember([H(5)], [50])
    m.remember([H(6)], [60])
    assert m.take() == [("removed", (10,), "CPU"), ("removed", (11,), "CPU")]
    assert m.reported_chunks == 0
