"""Two engines, each with its own sidecar, report kvtier's chunks as vLLM KV cache events; a router
written from vLLM's event format alone (tests/support/kv_router.py) indexes both streams and
picks, for each prompt, the engine with the longest prefix. After saves, evictions, a CLEAR and a
SIGKILLed sidecar that lost a file while it was down (the workers resynchronise from a
snapshot), the index must agree with
what each sidecar can actually load (a LOOKUP over every rank's namespace, without pins), for
every probe and both engines. The agreement right after each phase (one engine step, no wait)
and after the events have propagated is printed as ``router events: ...``.

Engine A: tensor parallelism 2, a 24-page host tier over a disk tier. Engine B: one rank, a
24-page host tier and nothing below, so its evictions lose chunks.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import Sidecar, free_port
from kvtier_vllm.connector_types import ConnectorRequest, ScheduledRequest
from kvtier_vllm.hashing import hash_chunks
from kvtier_vllm.kv_events import open_worker_events
from support.kv_router import KvRouter, prompt_blocks
from support.rig import Rig, tokens
from support.vllm_events import EngineEvents

BLOCK, CHUNK, BPC = 4, 16, 4
DOCS = 8
PAGE = 4096


def _sidecar(root: Path, name: str, disk: bool) -> Sidecar:
    d = root / name
    d.mkdir()
    tiers = [{"name": "cpu", "type": "local-cpu", "capacityBytes": 24 * PAGE, "pageBytes": PAGE}]
    if disk:
        tiers.append({"name": "disk", "type": "local-disk", "path": str(d / "disk"), "capacityBytes": 64 << 20})
    events = {"endpoint": f"tcp://127.0.0.1:{free_port()}", "replayEndpoint": f"tcp://127.0.0.1:{free_port()}", "heartbeatMs": 50}
    return Sidecar(dir=d, config={"tiers": tiers, "events": events})


class Engine:
    def __init__(self, name: str, sidecar: Sidecar, ranks: int) -> None:
        self.name = name
        self.sidecar = sidecar
        self.rig = Rig(sidecar.endpoint, block=BLOCK, chunk=CHUNK, ranks=ranks, heads=2, heartbeat_interval_s=0.3)
        workers = [open_worker_events(r.worker._client, r.namespace, r.index) for r in self.rig.rank_list]
        self.events = EngineEvents(workers, ranks, BLOCK, CHUNK)
        self.namespaces = [r.namespace for r in self.rig.rank_list]
        self.truth_client = self.rig.client()
        self.n = 0

    def save(self, prompt: list[int]) -> None:
        """A writer request as the rig's, with the connector's ``update_state_after_alloc``
        remembering the request's block hashes."""
        rig = self.rig
        self.n += 1
        rid = f"{self.name}-w{self.n}"
        req = ConnectorRequest(rid, prompt)
        n, _ = rig.ask(req)
        table = rig.alloc(-(-len(prompt) // BLOCK))
        rig.scheduler.update_state_after_alloc(req, table, 0)
        self.events.remember(rig.scheduler.chunk_hashes(rid), prompt)
        rig.step([ScheduledRequest(req, table, 0, len(prompt))], [(prompt, table, 0, len(prompt))])
        rig.scheduler.request_finished(req, table)
        rig.step()
        rig.idle()
        rig.finished()
        rig.free(table)
        self.events.step()

    def loadable(self, prompt: list[int]) -> int:
        """Ground truth: leading chunks the sidecar can load for every rank (no pin)."""
        chunks = hash_chunks(prompt, chunk_size=CHUNK)
        self.n += 1
        res = self.truth_client.send_lookup(
            f"{self.name}-truth-{self.n}",
            b"".join(c.hash for c in chunks),
            [CHUNK] * len(chunks),
            self.namespaces,
            pin=False,
        ).wait(10_000)
        return res.hit_chunks

    def close(self) -> None:
        self.events.close()
        self.rig.close()


def _docs() -> list[list[int]]:
    return [tokens(1000 + d, 4 * CHUNK) for d in range(DOCS)]


def _probes(docs) -> list[list[int]]:
    return [doc[: k * CHUNK] + tokens(5000 + i * 10 + k, 5) for i, doc in enumerate(docs) for k in range(1, 5)]


@pytest.fixture
def fleet():
    root = Path(tempfile.mkdtemp(prefix="kvtier-router-"))
    made = []
    try:
        sa = _sidecar(root, "a", disk=True)
        made.append(sa)
        sb = _sidecar(root, "b", disk=False)
        made.append(sb)
        a = Engine("A", sa, ranks=2)
        made.append(a)
        b = Engine("B", sb, ranks=1)
        made.append(b)
        yield a, b
    finally:
        for m in reversed(made):
            m.close()
        shutil.rmtree(root, ignore_errors=True)


def _evaluate(router: KvRouter, engines, probes) -> dict:
    pairs = agree = chosen_ok = 0
    for p in probes:
        blocks = prompt_blocks(p, BLOCK)[: (len(p) // CHUNK) * BPC]
        truth = {e.name: e.loadable(p) for e in engines}
        for e in engines:
            pairs += 1
            agree += router.prefix(e.name, blocks) // BPC == truth[e.name]
        chosen, _ = router.best(blocks)
        best = max(truth.values())
        chosen_ok += (best == 0 and chosen is None) or (chosen is not None and truth[chosen] == best)
    return {"pairs": pairs, "agree": agree, "probes": len(probes), "chosen_ok": chosen_ok}


def _phase(name: str, router: KvRouter, engines, probes, results: list) -> None:
    for e in engines:
        e.events.step()
    router.pump()
    first = _evaluate(router, engines, probes)
    deadline = time.monotonic() + 30
    while True:
        for e in engines:
            e.events.step()
        router.pump()
        now = _evaluate(router, engines, probes)
        if now["agree"] == now["pairs"]:
            break
        assert time.monotonic() < deadline, f"{name}: the router's index never agreed with the sidecars: {now}"
        time.sleep(0.05)
    assert now["chosen_ok"] == now["probes"]
    results.append((name, first, now))


def test_router_index_follows_both_engines_through_saves_evictions_clear_and_restart(fleet, capsys):
    a, b = fleet
    router = KvRouter(
        {e.name: (e.events.publisher.endpoint, e.events.publisher.replay_endpoint) for e in (a, b)}
    )
    docs = _docs()
    probes = _probes(docs)
    tail = tokens(77, 3)
    results: list = []
    try:
        # The router's SUB sockets join before anything is published (ZMQ drops earlier messages).
        time.sleep(0.3)
        for d in (0, 1, 2, 3):
            a.save(docs[d] + tail)
        for d in (2, 3, 4, 5):
            b.save(docs[d] + tail)
        _phase("saves", router, (a, b), probes, results)
        assert sum(b.loadable(docs[d] + tail) for d in (2, 3, 4, 5)) == 16

        # B's 24 pages overflow: it evicts its least recently used chunks (no tier below: lost).
        for d in (6, 7, 0):
            b.save(docs[d] + tail)
        _phase("evictions", router, (a, b), probes, results)
        assert sum(b.loadable(docs[d] + tail) for d in range(DOCS)) < 7 * 4, "B lost chunks"

        a.truth_client.clear(a.namespaces)
        a.save(docs[1] + tail)
        _phase("clear", router, (a, b), probes, results)
        assert a.loadable(docs[0] + tail) == 0 and a.loadable(docs[1] + tail) == 4

        for d in (4, 5):
            a.save(docs[d] + tail)
        deadline = time.monotonic() + 20
        while a.truth_client.stats()["writeThrough"]["depth"] > 0:  # on disk before the kill
            assert time.monotonic() < deadline, "write-through did not drain"
            time.sleep(0.01)
        # SIGKILL: host memory is gone, the disk tier's chunks stay loadable, except the third
        # chunk of document 4 on rank 1, whose file is lost while the sidecar is down.
        a.sidecar.kill()
        lost = hash_chunks(docs[4] + tail, chunk_size=CHUNK)[2].hash.hex()
        ns1 = a.namespaces[1].hex()
        files = [f for f in (a.sidecar.dir / "disk").rglob(f"{lost}*") if ns1 in str(f)]
        assert len(files) == 1, files
        files[0].unlink()
        a.sidecar.start()
        _phase("sidecar restart", router, (a, b), probes, results)
        assert [a.loadable(docs[d] + tail) for d in (1, 4, 5)] == [4, 2, 4]
    finally:
        router.close()
    gaps = sum(e.gaps for e in router.engines.values())
    with capsys.disabled():
        for name, first, now in results:
            print(
                f"\nrouter events: {name}: index agrees with the sidecars on {now['agree']}/{now['pairs']} "
                f"(engine, prompt) pairs, chosen engine could load the longest prefix for "
                f"{now['chosen_ok']}/{now['probes']} prompts (one engine step after the phase: "
                f"{first['agree']}/{first['pairs']} and {first['chosen_ok']}/{first['probes']})",
                file=sys.stderr,
            )
        print(
            f"\nrouter events: {a.events.published + b.events.published} events in "
            f"{router.batches} batches, {gaps} gaps repaired by replay",
            file=sys.stderr,
        )
