"""A small engine rig: the Python connectors over a real sidecar and shared-memory KV caches.

It plays vLLM's part step by step (the tests say which hook runs when), with deterministic KV
content: block ``j`` of a prompt holds bytes derived from the prompt's tokens up to the end of that
block, the rank, the layer and K/V, so any block can be checked byte for byte after a load.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from kvtier_vllm.client import KvtierClient
from kvtier_vllm.connector_types import ConnectorOutput, ConnectorRequest, ScheduledRequest
from kvtier_vllm.cover_lookup import CoverLookupClient
from kvtier_vllm.kv_caches import allocate_host_kv_cache, build_registration
from kvtier_vllm.namespace import derive_namespace, head_covers
from kvtier_vllm.rank_lookup import RankLookup, rank_suffix
from kvtier_vllm.save_fence import SaveFences
from kvtier_vllm.scheduler import SchedulerConnector
from kvtier_vllm.worker import WorkerConnector


def tokens(seed: int, n: int) -> list[int]:
    """Deterministic pseudo-random token ids (xorshift), like the TypeScript tests'."""
    out, x = [], (seed & 0xFFFFFFFF) or 1
    for _ in range(n):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        out.append(x % 32000)
    return out


def block_content(prompt: Sequence[int], j: int, block: int, rank: int, layer: int, kv: int, shape) -> np.ndarray:
    """The KV bytes (as uint16) of block ``j`` of ``prompt``."""
    prefix = np.asarray(prompt[: (j + 1) * block], dtype=np.uint32).tobytes()
    seed = hashlib.blake2b(prefix + bytes([rank, layer, kv]), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(seed, "little"))
    return rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)


@dataclass
class Rank:
    index: int
    cache: object
    worker: WorkerConnector
    namespace: bytes
    suffix: str


@dataclass
class Rig:
    endpoint: str
    block: int = 4
    chunk: int = 16
    num_blocks: int = 256
    layers: int = 2
    heads: int = 2
    head_dim: int = 4
    ranks: int = 1
    layout: str = "flash_attn"
    lookup_timeout_ms: int = 2000
    request_timeout_ms: int = 5000
    load_timeout_ms: int = 0
    heartbeat_interval_s: float = 5.0
    #: SAVEs with save fences (a state file per rank), as the vLLM adapter sends them.
    fences: bool = False
    save_timeout_s: float = 1.0
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    #: Another rig's model id, to share its chunks (default: a model of this rig's own).
    model_id: str = ""
    #: Each rank's lookup also asks about the covers of its heads (chunks saved at other TP
    #: sizes), as the vLLM adapter's scheduler does.
    covers: bool = False

    def __post_init__(self) -> None:
        self.model_id = self.model_id or f"rig-{self.tag}"
        self.rank_list: list[Rank] = []
        targets = []
        self._clients: list[KvtierClient] = []
        for k in range(self.ranks):
            path = f"/dev/shm/kvtier-rig-{self.tag}-{k}"
            cache = allocate_host_kv_cache(
                path,
                num_layers=self.layers,
                num_blocks=self.num_blocks,
                block_size=self.block,
                num_heads=self.heads // self.ranks,
                head_dim=self.head_dim,
                layout=self.layout,
                block_pad_bytes=8,
            )
            worker = WorkerConnector(
                self.client(),
                load_timeout_ms=self.load_timeout_ms,
                lookup_suffix=rank_suffix(k, self.ranks),
                heartbeat_client_factory=self.client,
                heartbeat_interval_s=self.heartbeat_interval_s,
                save_fences=SaveFences() if self.fences else None,
                save_timeout_s=self.save_timeout_s,
            )
            reg = build_registration(
                cache.layers,
                engine_id=f"eng-{self.tag}-{k}",
                model_id=self.model_id,
                dtype="float16",
                num_kv_heads=self.heads,
                head_dim=self.head_dim,
                block_size=self.block,
                tp_size=self.ranks,
                tp_rank=k,
                chunk_size=self.chunk,
                layout=self.layout,
                state_file=worker.state_file,
            )
            result = worker.register_kv_caches(reg, timeout_ms=10000)
            ns = derive_namespace(
                model_id=self.model_id,
                dtype="float16",
                num_layers=self.layers,
                num_kv_heads=self.heads,
                head_dim=self.head_dim,
                block_size=self.block,
                tp_size=self.ranks,
                tp_rank=k,
            ).id
            assert bytes(result.namespace) == ns, "the scheduler derives the namespace the sidecar registered"
            self.rank_list.append(Rank(k, cache, worker, ns, rank_suffix(k, self.ranks)))
            client = self.client()
            if self.covers:
                shards = head_covers(
                    model_id=self.model_id, dtype="float16", num_layers=self.layers,
                    num_kv_heads=self.heads, head_dim=self.head_dim, block_size=self.block,
                    tp_size=self.ranks, tp_rank=k,
                )
                client = CoverLookupClient(client, [[n.id for _, _, n in c] for _, c in shards])
            targets.append((client, ns, rank_suffix(k, self.ranks)))
        self.lookup = RankLookup(targets)
        self.scheduler = SchedulerConnector(self.lookup, block_size=self.block, chunk_size=self.chunk)
        self.free_blocks = list(range(self.num_blocks))
        self.admin = self.client()

    # ------------------------------------------------------------------ plumbing

    def client(self) -> KvtierClient:
        c = KvtierClient(self.endpoint, lookup_timeout_ms=self.lookup_timeout_ms, request_timeout_ms=self.request_timeout_ms)
        self._clients.append(c)
        return c

    def close(self) -> None:
        self.scheduler.close()
        for r in self.rank_list:
            r.worker.close(timeout_s=2.0)
            r.cache.close()
        for c in self._clients:
            c.close()

    @property
    def bpc(self) -> int:
        return self.chunk // self.block

    def alloc(self, n: int, reverse: bool = False) -> list[int]:
        assert len(self.free_blocks) >= n, "rig out of blocks"
        if reverse:
            out = self.free_blocks[-n:][::-1]
            del self.free_blocks[-n:]
        else:
            out, self.free_blocks = self.free_blocks[:n], self.free_blocks[n:]
        return out

    def free(self, blocks: Iterable[int]) -> None:
        self.free_blocks.extend(blocks)

    # ------------------------------------------------------------------ KV content

    def _arr(self, rank: Rank, layer: int, kv: int, blk: int) -> np.ndarray:
        a = rank.cache.layers[layer].view(np.uint16)
        return a[kv, blk] if self.layout == "flash_attn" else a[blk, kv]

    def compute(self, prompt: Sequence[int], table: Sequence[int], start_tok: int, end_tok: int) -> None:
        """The forward pass: writes the KV of the blocks holding tokens [start_tok, end_tok)."""
        for j in range(start_tok // self.block, -(-end_tok // self.block)):
            for r in self.rank_list:
                for layer in range(self.layers):
                    for kv in range(2):
                        dst = self._arr(r, layer, kv, table[j])
                        dst[...] = block_content(prompt, j, self.block, r.index, layer, kv, dst.shape)

    def scribble(self, blocks: Iterable[int]) -> None:
        """Fills blocks with garbage (a freed block reused by someone else)."""
        for b in blocks:
            for r in self.rank_list:
                for layer in range(self.layers):
                    for kv in range(2):
                        self._arr(r, layer, kv, b)[...] = 0xDEAD

    def mismatched(self, prompt: Sequence[int], table: Sequence[int], first_block: int, end_block: int) -> list[int]:
        """Block indices in [first_block, end_block) whose bytes differ from the expected KV."""
        bad = []
        for j in range(first_block, end_block):
            ok = True
            for r in self.rank_list:
                for layer in range(self.layers):
                    for kv in range(2):
                        got = self._arr(r, layer, kv, table[j])
                        if not np.array_equal(got, block_content(prompt, j, self.block, r.index, layer, kv, got.shape)):
                            ok = False
            if not ok:
                bad.append(j)
        return bad

    # ------------------------------------------------------------------ hooks, in vLLM's order

    def ask(self, req: ConnectorRequest, computed: int = 0, timeout_s: float = 10.0):
        """get_num_new_matched_tokens until it stops deferring (one call per 'scheduler step')."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.scheduler.get_num_new_matched_tokens(req, computed)
            if got[0] is not None:
                return got
            assert time.monotonic() < deadline, "lookup never answered"
            time.sleep(0.002)

    def step(self, scheduled: Sequence[ScheduledRequest] = (), compute: Iterable[tuple] = ()):
        """build_connector_meta -> every worker's start_load_kv -> forward pass -> wait_for_save."""
        meta = self.scheduler.build_connector_meta(scheduled)
        for r in self.rank_list:
            r.worker.handle_preemptions(meta.preempted(), timeout_s=10)
            r.worker.start_load_kv(meta)
        for prompt, table, a, b in compute:
            self.compute(prompt, table, a, b)
        for r in self.rank_list:
            r.worker.wait_for_save()
        return meta

    def finished(self, finished_req_ids: Iterable[str] = ()) -> ConnectorOutput:
        """get_finished and get_block_ids_with_load_errors of every rank, aggregated like vLLM's
        KVOutputAggregator (an id counts once every rank reported it), fed to the scheduler."""
        sending: dict[str, int] = getattr(self, "_sending", {})
        recving: dict[str, int] = getattr(self, "_recving", {})
        self._sending, self._recving = sending, recving
        invalid: set[int] = set()
        for r in self.rank_list:
            s, v = r.worker.get_finished(set(finished_req_ids))
            invalid |= r.worker.get_block_ids_with_load_errors()
            for rid in s:
                sending[rid] = sending.get(rid, 0) + 1
            for rid in v:
                recving[rid] = recving.get(rid, 0) + 1
        done_s = {rid for rid, n in sending.items() if n == self.ranks}
        done_r = {rid for rid, n in recving.items() if n == self.ranks}
        for rid in done_s:
            del sending[rid]
        for rid in done_r:
            del recving[rid]
        out = ConnectorOutput(finished_sending=done_s, finished_recving=done_r, invalid_block_ids=invalid)
        self.scheduler.update_connector_output(out)
        self.recved = getattr(self, "recved", set()) | done_r
        self.invalid_seen = getattr(self, "invalid_seen", set()) | invalid
        return out

    def idle(self, timeout_s: float = 15.0) -> None:
        for r in self.rank_list:
            assert r.worker.wait_idle(timeout_s), "transfers did not settle"

    def until_recving(self, request_id: str, timeout_s: float = 30.0) -> ConnectorOutput:
        """Steps get_finished until the request's load is reported (invalid blocks accumulated)."""
        deadline = time.monotonic() + timeout_s
        while True:
            out = self.finished()
            if request_id in self.recved:
                self.recved.discard(request_id)
                invalid, self.invalid_seen = self.invalid_seen, set()
                return ConnectorOutput(out.finished_sending, {request_id}, invalid)
            assert time.monotonic() < deadline, f"load of {request_id} never settled"
            for r in self.rank_list:
                r.worker._client.poll(timeout_ms=20)

    def save_prompt(self, rid: str, prompt: Sequence[int]) -> list[int]:
        """A writer request: prefill the whole prompt in one step, save its full chunks, finish."""
        req = ConnectorRequest(rid, prompt)
        n, _ = self.ask(req)
        assert n == 0, "a writer finds nothing"
        table = self.alloc(-(-len(prompt) // self.block))
        self.scheduler.update_state_after_alloc(req, table, 0)
        meta = self.step([ScheduledRequest(req, table, 0, len(prompt))], [(prompt, table, 0, len(prompt))])
        assert meta.saves, "full chunks are saved"
        delay, _ = self.scheduler.request_finished(req, table)
        assert delay
        self.step()
        self.idle()
        out = self.finished()
        assert rid in out.finished_sending
        self.free(table)
        return table
