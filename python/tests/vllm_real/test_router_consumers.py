"""Two routers' indexers, written from the routers' own sources, read two vLLM engines' KV events
and score what each engine can load from its kvtier sidecar.

Each engine runs vLLM's own scheduler and connector path with kvtier's connector reporting its
chunks (``kv_events``), and publishes through vLLM's ``ZmqEventPublisher`` on a topic
``kv@<pod>@<model>`` (llm-d's). Its prefix-caching hash is ``sha256_cbor`` with ``PYTHONHASHSEED``
set, so a router can compute the engine's block hashes from tokens, as llm-d's does.

- :mod:`tests.support.dynamo_indexer`: Dynamo's radix-tree indexer (ai-dynamo/dynamo
  ``lib/llm/src/kv_router/publisher.rs`` at 02fec11b7ee19d239974206ae6a88045bd4e6461 and
  ``lib/llm/src/kv_router/indexer.rs`` at 003dab3b6d82a228b39bce34988c05af5813717f): blocks keyed
  by hashes of their own tokens, a parent chain per worker, a prompt scored by the blocks found
  for a worker along its path. Each engine is two workers: its GPU blocks and its offloaded ones
  (as later revisions place events by medium, ``lib/kv-router/src/zmq_wire/convert.rs`` at
  2bd0a36dcb371b2f22ad56aa48215e383aee02a0).
- :mod:`tests.support.llmd_indexer`: llm-d's KV-cache indexer (llm-d/llm-d-kv-cache-manager at
  0e9fb4729313ce3bcd5a6b87e1227b4409d2da63, ``pkg/kvcache/kvevents/pool.go`` and the index,
  token processor and scorer it feeds): keys (model, engine block hash), pod entries per device
  tier (the medium), ``AllBlocksCleared`` ignored, the longest run of a prompt's block keys a pod
  holds; scored here over kvtier's tiers (``cpu``, ``disk``, ``shared``, ``external``).

The truth is a LOOKUP on each engine's sidecar over every rank's namespace (no pins): the leading
chunks the engine can load. Both indexers must score, in blocks, exactly ``chunks × blocks per
chunk`` for each of 32 prompts and both engines after saves, evictions (engine B's small host
tier has nothing below it), a CLEAR of engine A's namespaces, and a SIGKILL of A's sidecar that
lost one chunk file of one rank while it was down. The routers' own behaviour that would make
them differ is answered by the events themselves:

- llm-d ignores ``AllBlocksCleared``: a CLEAR comes as a ``BlockRemoved`` of every chunk.
- Dynamo skips a ``BlockStored`` whose parent the worker does not hold, empties a node's children
  when its last worker leaves, and credits a worker with every node on the path it is on (a block
  whose parent another worker keeps alive counts): the connector reports a chunk only while the
  chunk before it is reported (a lost chunk takes the chunks after it along, as a LOOKUP stops at
  it), so neither happens; the test asserts no store or removal of an offloaded block was
  skipped.
- Dynamo slices ``block_size`` tokens per block hash: every ``BlockStored`` carries all its
  blocks' tokens (no listener died).
- A SIGKILL loses host memory: the workers resynchronise from the restarted sidecar's snapshot and
  the chunks it lost are reported removed.

Events reach the routers at the engines' steps; after each phase the engines step (with short
requests that keep them stepping) until every score agrees, within a bounded time.
"""

from __future__ import annotations

import time

import pytest

from kvtier_vllm.client import KvtierClient
from kvtier_vllm.hashing import hash_chunks
from tests.conftest import Sidecar, free_port
from tests.support.dynamo_indexer import DynamoIndexer
from tests.support.llmd_indexer import LlmdIndexer
from tests.vllm_real.harness.helpers import prompt, serve

CHUNK, BLOCK = 32, 16
BPC = CHUNK // BLOCK
#: One rank's chunk: 32 tokens × 2 layers × K and V × 2 heads × 8 dims × 2 bytes.
PAGE = CHUNK * 2 * 2 * 2 * 8 * 2
MODEL = "router-consumers-model"
SEED = "4242"
DOCS = 10
KVTIER_TIERS = ("cpu", "disk", "shared", "external")
#: How long a phase may take to agree, counted only while nothing changes (a busy machine).
SETTLE_S = 180.0


def _sidecar(tmp_path, name: str, host_chunks: int, disk: bool) -> Sidecar:
    d = tmp_path / name
    d.mkdir()
    tiers = [{"name": "cpu", "type": "local-cpu", "capacityBytes": 2 * host_chunks * PAGE, "pageBytes": PAGE}]
    if disk:
        tiers.append({"name": "disk", "type": "local-disk", "path": str(d / "disk"), "capacityBytes": 64 << 20})
    # Fixed event ports: the workers' followers reconnect to them after a restart.
    events = {"endpoint": f"tcp://127.0.0.1:{free_port()}", "replayEndpoint": f"tcp://127.0.0.1:{free_port()}", "heartbeatMs": 50}
    return Sidecar(dir=d, config={"tiers": tiers, "events": events})


class Node:
    """An engine, its sidecar, and what the routers call it."""

    def __init__(self, engine_fixture, pod: str, sidecar: Sidecar) -> None:
        from kvtier_vllm.vllm_glue import all_rank_namespaces

        self.pod = pod
        self.sidecar = sidecar
        self.port = free_port()
        self.engine = engine_fixture(
            sidecar=sidecar,
            model_id=MODEL,
            extra={"kv_events": True},
            kv_events_endpoint=f"tcp://*:{self.port}",
            kv_events_topic=f"kv@{pod}@{MODEL}",
            prefix_caching_hash_algo="sha256_cbor",
        )
        self.namespaces = [ns for _, ns, _ in all_rank_namespaces(self.engine.scheduler.connector._shape)]
        self.client = KvtierClient(sidecar.endpoint, request_timeout_ms=10_000)
        self.n = 0

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def serve(self, tokens: list[int]) -> None:
        self.n += 1
        serve(self.engine, f"{self.pod}-r{self.n}", tokens)

    def tick(self) -> None:
        """One engine step; a short request (no whole chunk, so nothing for kvtier) keeps it
        stepping, as vLLM's engine steps only while it has requests."""
        e = self.engine
        if not e.scheduler.requests:
            self.n += 1
            e.add_request(f"{self.pod}-tick{self.n}", prompt(90_000 + self.n, BLOCK + 4), max_tokens=20)
        e.step()

    def loadable_blocks(self, tokens: list[int]) -> int:
        """The truth: leading chunks the sidecar can load for every rank, in blocks."""
        chunks = hash_chunks(tokens, chunk_size=CHUNK)
        if not chunks:
            return 0
        self.n += 1
        res = self.client.send_lookup(
            f"{self.pod}-truth-{self.n}", b"".join(c.hash for c in chunks), [CHUNK] * len(chunks), self.namespaces, pin=False
        ).wait(30_000)
        return res.hit_chunks * BPC

    def drain(self) -> None:
        """Waits until the sidecar's writes to lower tiers are done."""
        deadline = time.monotonic() + SETTLE_S
        while self.client.stats()["writeThrough"]["depth"] > 0:
            assert time.monotonic() < deadline, "write-through did not drain"
            time.sleep(0.02)

    def restart_client(self) -> None:
        self.client.close()
        self.client = KvtierClient(self.sidecar.endpoint, request_timeout_ms=10_000)

    def close(self) -> None:
        self.client.close()


def _docs() -> list[list[int]]:
    return [prompt(7000 + d, 4 * CHUNK) for d in range(DOCS)]


def _probes(docs) -> list[list[int]]:
    """32 prompts: the first 1 to 4 chunks of 8 documents (shared prefixes), each with its own tail."""
    return [doc[: k * CHUNK] + prompt(8000 + 10 * d + k, 5) for d, doc in enumerate(docs[:8]) for k in range(1, 5)]


class Routers:
    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.dynamo = DynamoIndexer(BLOCK)
        self.llmd = LlmdIndexer(BLOCK, SEED)
        for n in nodes:
            self.dynamo.subscribe(n.pod, n.endpoint)
            self.llmd.subscribe(n.endpoint)

    def pump(self) -> None:
        self.dynamo.pump()
        self.llmd.pump()

    def table(self, probes) -> list[tuple]:
        """(pod, probe index, truth, Dynamo's score, llm-d's score), in blocks."""
        rows = []
        for n in self.nodes:
            for i, p in enumerate(probes):
                rows.append(
                    (n.pod, i, n.loadable_blocks(p), self.dynamo.score(n.pod, p), self.llmd.score(n.pod, p, MODEL, KVTIER_TIERS))
                )
        return rows

    def close(self) -> None:
        self.dynamo.close()
        self.llmd.close()


def _settle(name: str, routers: Routers, probes, results: list) -> list[tuple]:
    """Steps both engines until both indexers agree with the sidecars on every prompt."""
    idle_since = time.monotonic()
    last = None
    while True:
        for _ in range(4):
            for n in routers.nodes:
                n.tick()
            routers.pump()
        rows = routers.table(probes)
        wrong = [r for r in rows if not r[2] == r[3] == r[4]]
        if not wrong:
            results.append((name, rows))
            return rows
        if wrong != last:
            last, idle_since = wrong, time.monotonic()
        assert time.monotonic() - idle_since < SETTLE_S, (
            f"{name}: (pod, prompt, truth, dynamo, llm-d) disagreeing for {SETTLE_S} s: {wrong[:8]} ({len(wrong)} of {len(rows)})"
        )


def _wait_live(routers: Routers) -> None:
    """Steps until each indexer has a message from each engine: SUB sockets miss what was
    published before they joined."""
    deadline = time.monotonic() + SETTLE_S
    while not (
        all(s.batches for s in routers.dynamo._subs) and {n.pod for n in routers.nodes} <= set(routers.llmd.messages)
    ):
        assert time.monotonic() < deadline, "the indexers never heard from both engines"
        for n in routers.nodes:
            n.tick()
        routers.pump()


@pytest.fixture
def sidecars(tmp_path):
    """A: 6 chunks of host memory over a disk tier. B: 10 chunks of host memory, nothing below.
    (Requested before ``engine``: the engines close first.)"""
    made = []
    try:
        made.append(_sidecar(tmp_path, "a", host_chunks=6, disk=True))
        made.append(_sidecar(tmp_path, "b", host_chunks=10, disk=False))
        yield made[0], made[1]
    finally:
        for s in made:
            s.close()


def test_dynamo_and_llmd_indexers_score_what_each_engine_can_load(sidecars, engine, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONHASHSEED", SEED)  # vLLM's first block hash; the token processor's seed
    sa, sb = sidecars
    nodes: list[Node] = []
    routers = None
    try:
        a = Node(engine, "engine-a", sa)
        nodes.append(a)
        b = Node(engine, "engine-b", sb)
        nodes.append(b)
        routers = Routers([a, b])
        _wait_live(routers)
        docs = _docs()
        probes = _probes(docs)
        tail = prompt(77, 3)
        results: list = []

        # Saves: A keeps 16 chunks (its host tier spills to disk), B 8.
        for d in (0, 1, 2, 3):
            a.serve(docs[d] + tail)
        for d in (2, 3):
            b.serve(docs[d] + tail)
        rows = _settle("saves", routers, probes, results)
        assert all(r[2] for r in rows if r[0] == "engine-b" and r[1] // 4 in (2, 3))

        # Evictions: B's host tier overflows and loses its least recently used chunks.
        for d in (4, 5, 6):
            b.serve(docs[d] + tail)
        a.serve(docs[4] + tail)
        rows = _settle("evictions", routers, probes, results)
        b_blocks = sum(r[2] for r in rows if r[0] == "engine-b")
        assert 0 < b_blocks < BPC * sum(range(1, 5)) * 5, "B lost chunks"

        # CLEAR of A's namespaces (every tier; no write to the disk in flight), then two
        # documents saved again.
        a.drain()
        a.client.clear(a.namespaces)
        for d in (1, 6):
            a.serve(docs[d] + tail)
        rows = _settle("clear", routers, probes, results)
        held = [r for r in rows if r[0] == "engine-a" and r[2]]
        assert {r[1] // 4 for r in held} == {1, 6}, held
        assert routers.llmd.cleared_ignored == 0, "kvtier's CLEAR is not an AllBlocksCleared"

        # SIGKILL of A's sidecar once its disk holds everything: host memory is gone; one rank's
        # file of document 7's second chunk is lost while it is down. B holds document 7 too, so
        # Dynamo's tree keeps the nodes after that chunk alive: only the events take A off them.
        a.serve(docs[7] + tail)
        b.serve(docs[7] + tail)
        a.drain()
        sa.kill()
        lost = hash_chunks(docs[7] + tail, chunk_size=CHUNK)[1].hash.hex()
        files = [f for f in (sa.dir / "disk").rglob(f"{lost}*") if a.namespaces[1].hex() in str(f)]
        assert len(files) == 1, files
        files[0].unlink()
        sa.start()
        a.restart_client()
        rows = _settle("sidecar restart", routers, probes, results)
        doc7 = {pod: [r[2] for r in rows if r[0] == pod and r[1] // 4 == 7] for pod in ("engine-a", "engine-b")}
        assert doc7 == {"engine-a": [BPC] * 4, "engine-b": [BPC, 2 * BPC, 3 * BPC, 4 * BPC]}, doc7

        offload = {w: n for w, n in routers.dynamo.counters.parent_not_found.items() if w[1] == "offload"}
        assert offload == {}, f"Dynamo skipped stores of offloaded blocks: {offload}"
        offload = {w: n for w, n in routers.dynamo.counters.block_not_found.items() if w[1] == "offload"}
        assert offload == {}, f"Dynamo skipped removals of offloaded blocks: {offload}"
        assert routers.dynamo.dead_workers() == [] and routers.dynamo.undecodable_batches() == 0
        assert routers.llmd.skipped_events == 0 and routers.llmd.dropped_messages == 0
        with capsys.disabled():
            for name, rows in results:
                held = sum(1 for r in rows if r[2])
                print(
                    f"\nrouter consumers: {name}: Dynamo's and llm-d's scores equal the sidecars' for "
                    f"{len(rows)}/{len(rows)} (engine, prompt) pairs ({held} with blocks to load)"
                )
    finally:
        if routers is not None:
            routers.close()
        for n in nodes:
            n.close()


def test_the_indexers_read_vllms_encodings_as_their_routers_do():
    """vLLM's own ``KVEventBatch`` (positional events, this vLLM) and the tagged maps of vLLM after
    its PR 42892: Dynamo's decoder reads both; llm-d's at 0e9fb47 reads the positional form and
    skips maps. Bytes block hashes (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``) fail Dynamo's batch
    at 02fec11 and are read by llm-d (last 8 bytes); a ``BlockStored`` with fewer tokens than its
    blocks ends Dynamo's listener."""
    import msgspec
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

    toks = prompt(3, 2 * BLOCK)
    enc = msgspec.msgpack.Encoder()

    def stored(hashes, tokens, medium="CPU", **kw):
        return BlockStored(
            block_hashes=hashes, parent_block_hash=None, token_ids=tokens, block_size=BLOCK, lora_id=None,
            medium=medium, lora_name=None, **kw,
        )

    dyn = DynamoIndexer(BLOCK)
    llmd = LlmdIndexer(BLOCK, SEED)
    try:
        first = stored([11, 12], toks, extra_keys=[None, None], group_idx=0)
        positional = enc.encode(KVEventBatch(ts=1.0, events=[first], data_parallel_rank=0))
        sub = dyn.feed("w", positional)
        llmd.process("w", MODEL, positional)
        assert dyn.find_matches(toks) == {("w", "offload"): 2}
        assert llmd.index[(MODEL, 11)] and llmd.index[(MODEL, 12)] and llmd.skipped_events == 0

        as_map = enc.encode([2.0, [{"type": "BlockRemoved", "block_hashes": [12], "medium": "CPU", "group_idx": 0}], 0])
        dyn.feed("w", as_map)
        llmd.process("w", MODEL, as_map)
        assert dyn.find_matches(toks) == {("w", "offload"): 1}
        assert (MODEL, 12) in llmd.index and llmd.skipped_events == 1

        removed = enc.encode(KVEventBatch(ts=3.0, events=[BlockRemoved(block_hashes=[12], medium="CPU")], data_parallel_rank=0))
        llmd.process("w", MODEL, removed)
        assert (MODEL, 12) not in llmd.index

        as_bytes = enc.encode(KVEventBatch(ts=4.0, events=[stored([b"\x01" * 32], toks[:BLOCK])], data_parallel_rank=0))
        dyn.feed("w", as_bytes)
        llmd.process("w", MODEL, as_bytes)
        assert sub.undecodable == 1 and (MODEL, int.from_bytes(b"\x01" * 8, "big")) in llmd.index

        short = enc.encode(KVEventBatch(ts=5.0, events=[stored([21, 22], toks[:BLOCK])], data_parallel_rank=0))
        dyn.feed("w", short)
        assert sub.dead and dyn.counters.short_tokens == {("w", "offload"): 1}
    finally:
        dyn.close()
        llmd.close()


def test_extra_keys_without_vllms_function_match_vllms_own():
    """The connector passes vLLM's own per-block extra keys; where vLLM lacks the function, kvtier
    derives them the same way (LoRA name on every block, the cache salt on the first)."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys
    from vllm.v1.request import Request

    from kvtier_vllm.connector import _request_keys
    from kvtier_vllm.kv_events import block_extra_keys
    from kvtier_vllm.vllm_glue import connector_request

    sql = LoRARequest("sql", 3, "/adapters/sql")
    for lora, salt in ((sql, "tenant-a"), (None, "tenant-b"), (sql, None)):
        req = Request("r", prompt(4, 5 * BLOCK), SamplingParams(max_tokens=1), None, lora_request=lora, cache_salt=salt)
        ours, lora_ids = _request_keys(req, connector_request(req), 5, BLOCK)
        theirs = [generate_block_hash_extra_keys(req, i * BLOCK, (i + 1) * BLOCK, 0)[0] for i in range(5)]
        assert ours == theirs == block_extra_keys(5, BLOCK, lora_name=lora and lora.lora_name, cache_salt=salt)
        assert lora_ids == (None if lora is None else (3, "sql"))
    plain = Request("p", prompt(5, 2 * BLOCK), SamplingParams(max_tokens=1), None)
    assert _request_keys(plain, connector_request(plain), 2, BLOCK) == (None, None)
