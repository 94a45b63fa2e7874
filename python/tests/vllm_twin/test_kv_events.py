"""The connector's KV cache events through vLLM's own path: each worker's
``get_kv_connector_kv_cache_events``, the output aggregator merging them, the scheduler's
``update_connector_output`` and ``take_events`` (docs/events.md). Two ranks on one sidecar
with its event stream on: the blocks a request saved come out as ``BlockStored`` in the
request's own block hashes, once every rank holds them; evicted ones as ``BlockRemoved``;
a CLEAR as ``AllBlocksCleared``."""

from __future__ import annotations

import pytest
from kvtier_vllm.client import KvtierClient
from vllm import _twin
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

from tests.conftest import Sidecar
from tests.vllm_twin.twin.helpers import prompt, serve, step_until

CHUNK, BLOCK = 16, 4


@pytest.fixture
def events_sidecar():
    # 12 pages of 4 KiB, one per chunk of one rank: 6 chunks of the two ranks, nothing below.
    s = Sidecar(
        config={
            "tiers": [{"name": "cpu", "type": "local-cpu", "capacityBytes": 12 * 4096, "pageBytes": 4096}],
            "events": {"endpoint": "tcp://127.0.0.1:*", "heartbeatMs": 50},
        }
    )
    try:
        yield s
    finally:
        s.close()


def _blocks(req_hashes, i):
    return list(req_hashes[i * 4 : (i + 1) * 4])


@pytest.mark.parametrize("version", _twin.VERSIONS, ids=["fixture", "current"])
def test_saved_chunks_evictions_and_clear_reach_vllms_event_path(twin, events_sidecar, version):
    e = twin(sidecar=events_sidecar, version=version, extra={"kv_events": True})
    p = prompt(31, 2 * CHUNK + 3)
    e.add_request("r", p, max_tokens=2)
    hashes = list(e.scheduler.requests["r"].block_hashes)
    e.run()
    want = [_blocks(hashes, 0), _blocks(hashes, 1)]
    stored = lambda: [ev for ev in e.scheduler.kv_events if isinstance(ev, BlockStored)]  # noqa: E731
    step_until(e, lambda: len(stored()) >= 2, max_steps=2000)
    assert [ev.block_hashes for ev in stored()] == want
    assert [ev.parent_block_hash for ev in stored()] == [None, hashes[3]]
    assert all(ev.medium == "CPU" and ev.block_size == BLOCK and ev.token_ids == [] for ev in stored())

    # Six more chunks per rank do not fit: the oldest ones are evicted (nothing below the host tier).
    for i in range(3):
        serve(e, f"w{i}", prompt(40 + i, 2 * CHUNK + 1))
    removed = lambda: [ev for ev in e.scheduler.kv_events if isinstance(ev, BlockRemoved)]  # noqa: E731
    step_until(e, lambda: any(ev.block_hashes == want[0] for ev in removed()), max_steps=2000)
    assert all(ev.medium == "CPU" for ev in removed())

    c = KvtierClient(events_sidecar.endpoint)
    try:
        c.clear()
    finally:
        c.close()
    step_until(e, lambda: any(isinstance(ev, AllBlocksCleared) for ev in e.scheduler.kv_events), max_steps=2000)
