"""A KV-aware router's view of several engines, written from vLLM's KV event format alone (the
way llm-d's or Dynamo's indexers consume it): one SUB socket per engine on ``[topic, seq (u64
BE), msgpack payload]``, gaps in ``seq`` repaired through the engine's replay ROUTER (a request
``[start_seq]`` in REQ framing, answered batch by batch and ended by seq -1), and an index of
which engine holds which block on which medium. ``best`` picks the engine that can give the
longest prefix of a prompt's blocks.

Nothing here reads kvtier's code: payloads are read with the msgpack package (as a router in
any language reads them with its own library); the event layout (``[ts, [events], dp]`` with
events as tagged arrays ``["BlockStored", hashes, parent, token_ids, block_size, lora_id,
medium, ...]``, ``["BlockRemoved", hashes, medium, ...]``, ``["AllBlocksCleared"]``) and the
block hash are vLLM's.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Sequence

import msgpack
import zmq

_SEED = hashlib.sha256(b"twin-vllm-block-hash-seed").digest()


def prompt_blocks(tokens: Sequence[int], block_size: int) -> list[int]:
    """The engines' block hashes of a prompt (their configured hasher), as events name them."""
    out, parent = [], _SEED
    for j in range(len(tokens) // block_size):
        blk = tokens[j * block_size : (j + 1) * block_size]
        parent = hashlib.sha256(parent + struct.pack(f"<{len(blk)}I", *blk)).digest()
        out.append(int.from_bytes(parent, "big") & ((1 << 64) - 1))
    return out


def decode_batch(payload: bytes) -> tuple[float, list]:
    """``(ts, events)`` of one batch (msgpack; bin stays bytes, uint64 hashes stay ints)."""
    v = msgpack.unpackb(payload)
    return v[0], v[1]


class _Engine:
    def __init__(self, name: str, endpoint: str, replay_endpoint: str, ctx: zmq.Context) -> None:
        self.name = name
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.replay = ctx.socket(zmq.DEALER)
        self.replay.setsockopt(zmq.LINGER, 0)
        self.replay.connect(replay_endpoint)
        self.last_seq = -1
        #: block hash -> media holding it
        self.blocks: dict[int, set] = {}
        self.gaps = 0


class KvRouter:
    """See the module docstring. ``engines``: name -> (event endpoint, replay endpoint)."""

    def __init__(self, engines: dict[str, tuple[str, str]]) -> None:
        ctx = zmq.Context.instance()
        self.engines = {n: _Engine(n, ep, rep, ctx) for n, (ep, rep) in engines.items()}
        self.batches = 0

    def pump(self) -> int:
        """Applies every batch that arrived; returns how many."""
        n = 0
        for e in self.engines.values():
            while True:
                try:
                    _, seq_b, payload = e.sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                seq = int.from_bytes(seq_b, "big")
                if seq <= e.last_seq:
                    continue
                if e.last_seq >= 0 and seq > e.last_seq + 1:
                    e.gaps += 1
                    self._replay(e, e.last_seq + 1, seq)
                self._apply(e, payload)
                e.last_seq = seq
                n += 1
        self.batches += n
        return n

    def _replay(self, e: _Engine, first: int, until: int) -> None:
        e.replay.send_multipart([b"", first.to_bytes(8, "big")])
        while e.replay.poll(5000):
            _, seq_b, payload = e.replay.recv_multipart()
            if not payload:
                return
            seq = int.from_bytes(seq_b, "big")
            if e.last_seq < seq < until:
                self._apply(e, payload)
                e.last_seq = seq
        raise TimeoutError(f"engine {e.name}: no replay answer")

    def _apply(self, e: _Engine, payload: bytes) -> None:
        _, events = decode_batch(payload)
        for ev in events:
            tag = ev[0]
            if tag == "BlockStored":
                medium = ev[6] if len(ev) > 6 else None
                for h in ev[1]:
                    e.blocks.setdefault(h, set()).add(medium)
            elif tag == "BlockRemoved":
                medium = ev[2] if len(ev) > 2 else None
                for h in ev[1]:
                    media = e.blocks.get(h)
                    if media is not None:
                        media.discard(medium)
                        if not media:
                            del e.blocks[h]
            elif tag == "AllBlocksCleared":
                e.blocks.clear()

    def prefix(self, engine: str, blocks: Sequence[int]) -> int:
        """Leading blocks of the prompt the engine holds (any medium)."""
        held = self.engines[engine].blocks
        n = 0
        while n < len(blocks) and blocks[n] in held:
            n += 1
        return n

    def best(self, blocks: Sequence[int]) -> tuple[str | None, int]:
        """The engine with the longest prefix (None when none holds the first block)."""
        best, length = None, 0
        for name in self.engines:
            k = self.prefix(name, blocks)
            if k > length:
                best, length = name, k
        return best, length

    def close(self) -> None:
        for e in self.engines.values():
            e.sub.close(0)
            e.replay.close(0)
