"""kvtier's KV cache events through vLLM's own path, to a router's socket: each worker's
``get_kv_connector_kv_cache_events``, vLLM's ``KVOutputAggregator`` merging the ranks, the
scheduler's ``update_connector_output`` and ``take_events``, and vLLM's ``ZmqEventPublisher``
(``--kv-events-config``), read by a ZMQ subscriber decoding vLLM's own ``KVEventBatch``. Two
ranks on one sidecar with its event stream on: a request's saved chunks come out as
``BlockStored`` (medium ``CPU``) in the request's own block hashes once every rank holds them,
with their tokens, evicted ones as ``BlockRemoved``, and a CLEAR as a ``BlockRemoved`` of every
chunk still reported (routers such as llm-d's ignore ``AllBlocksCleared``)."""

from __future__ import annotations

import pytest
import zmq

from kvtier_vllm.client import KvtierClient
from tests.conftest import Sidecar, free_port
from tests.vllm_real.harness.helpers import prompt, serve, step_until

CHUNK, BLOCK = 32, 16
#: One rank's chunk: 32 tokens × 2 layers × K and V × 2 heads × 8 dims × 2 bytes.
CHUNK_BYTES = CHUNK * 2 * 2 * 2 * 8 * 2


@pytest.fixture
def events_sidecar():
    # 12 pages, one per chunk of one rank: 6 chunks of both ranks, nothing below host memory.
    s = Sidecar(
        config={
            "tiers": [{"name": "cpu", "type": "local-cpu", "capacityBytes": 12 * CHUNK_BYTES, "pageBytes": CHUNK_BYTES}],
            "events": {"endpoint": "tcp://127.0.0.1:*", "heartbeatMs": 50},
        }
    )
    try:
        yield s
    finally:
        s.close()


class Router:
    """A subscriber of vLLM's KV event stream, as a KV-aware router runs one: connected to the
    port vLLM's publisher binds (vLLM binds an endpoint with a wildcard host, its default
    ``tcp://*:5557``)."""

    def __init__(self, endpoint: str) -> None:
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.connect(endpoint)
        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.events: list = []

    def take(self) -> list:
        while self._sub.poll(0):
            _topic, _seq, payload = self._sub.recv_multipart()
            self.events += self._decoder.decode(payload).events
        return self.events

    def close(self) -> None:
        self._sub.close()
        self._ctx.term()


def test_saved_chunks_evictions_and_clear_reach_a_router_through_vllm(engine, events_sidecar):
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    ours = ("CPU", "DISK", "SHARED")

    def reported(events) -> set:
        """kvtier's chunks a router holds after ``events``: stored and not removed since."""
        live: set = set()
        for ev in events:
            if isinstance(ev, BlockStored) and ev.medium in ours:
                live.add(tuple(ev.block_hashes))
            elif isinstance(ev, BlockRemoved) and ev.medium in ours:
                live.discard(tuple(ev.block_hashes))
        return live
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    port = free_port()
    e = engine(sidecar=events_sidecar, extra={"kv_events": True}, kv_events_endpoint=f"tcp://*:{port}")
    router = Router(f"tcp://127.0.0.1:{port}")
    try:
        ticks = iter(range(10_000))

        def until(cond):
            """Steps until ``cond()``: vLLM's engine steps (and so carries its workers' events)
            only while it has requests, so a short one is kept running (a full block: vLLM
            publishes its own ``BlockStored`` for it)."""

            def check():
                if not e.scheduler.requests:
                    n = next(ticks)
                    e.add_request(f"tick{n}", prompt(5000 + n, BLOCK + 4), max_tokens=50)
                return cond()

            step_until(e, check, max_steps=2000)

        until(lambda: router.take())  # the subscription is live: nothing later is missed
        p = prompt(31, 2 * CHUNK + 3)
        req = e.add_request("r", p, max_tokens=2)
        hashes = [maybe_convert_block_hash(h) for h in req.block_hashes]
        e.run()
        want = [hashes[0:2], hashes[2:4]]

        cpu_stored = lambda: [ev for ev in router.take() if isinstance(ev, BlockStored) and ev.medium == "CPU"]  # noqa: E731
        until(lambda: len(cpu_stored()) >= 2)
        assert [ev.block_hashes for ev in cpu_stored()] == want
        assert [ev.parent_block_hash for ev in cpu_stored()] == [None, hashes[1]]
        assert all(ev.block_size == BLOCK for ev in cpu_stored())
        # The blocks' tokens, as routers that key blocks by their tokens (Dynamo's) read them.
        assert [list(ev.token_ids) for ev in cpu_stored()] == [list(p[:CHUNK]), list(p[CHUNK : 2 * CHUNK])]

        # Six more chunks per rank do not fit: the oldest are evicted (nothing below host memory).
        for i in range(3):
            serve(e, f"w{i}", prompt(40 + i, 2 * CHUNK + 1))
        removed = lambda: [ev for ev in router.take() if isinstance(ev, BlockRemoved) and ev.medium == "CPU"]  # noqa: E731
        until(lambda: any(ev.block_hashes == want[0] for ev in removed()))

        before = reported(router.take())
        assert before, "chunks are reported before the CLEAR"
        c = KvtierClient(events_sidecar.endpoint)
        try:
            c.clear()
        finally:
            c.close()
        # Every chunk reported is removed by name; kvtier sends no AllBlocksCleared.
        until(lambda: not (reported(router.take()) & before))
        assert not any(isinstance(ev, AllBlocksCleared) for ev in router.take())
    finally:
        router.close()
