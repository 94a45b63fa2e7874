"""A stand-in for vLLM's side of KV cache events, for tests without vLLM: its block hasher, its
event classes' wire form and its ZMQ publisher, written from ``vllm/distributed/kv_events.py``
(``ZmqEventPublisher``: PUB frames ``[topic, seq (u64 BE), payload]``, a ROUTER that replays the
kept batches from a sequence number and ends with seq -1 and an empty payload; payload a msgpack
``[ts, [events...], data_parallel_rank]`` with each event a tagged array, e.g.
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
lora_name]``), and the step of vLLM's engine that carries a connector's events from its workers
to the publisher (``KVOutputAggregator`` then ``update_connector_output`` then ``take_events``).
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections import deque
from typing import Any, Iterable, Sequence

import msgpack
import zmq

from kvtier_vllm.kv_events import BlockEventMapper, ChunkTransitions

NONE_HASH = hashlib.sha256(b"twin-vllm-block-hash-seed").digest()


def block_hashes(tokens: Sequence[int], block_size: int) -> list[bytes]:
    """The engine's chained block hashes of a prompt's full blocks (like vLLM's sha256 hasher)."""
    out, parent = [], NONE_HASH
    for j in range(len(tokens) // block_size):
        blk = tokens[j * block_size : (j + 1) * block_size]
        parent = hashlib.sha256(parent + struct.pack(f"<{len(blk)}I", *blk)).digest()
        out.append(parent)
    return out


def external(h: bytes) -> int:
    """``maybe_convert_block_hash`` with int block hashes (vLLM's default): the low 64 bits."""
    return int.from_bytes(h, "big") & ((1 << 64) - 1)


def encode_batch(ts: float, events: list, dp_rank: int | None) -> bytes:
    """A batch as vLLM's publisher writes it (msgspec's array-like ``KVEventBatch``): the msgpack
    package writes the values in msgspec's forms, integers in their smallest (uint64 block hashes
    too), floats as float64, bin, str and nil."""
    return msgpack.packb([ts, events, dp_rank])


def wire_event(ev: tuple, block_size: int) -> list:
    """A kvtier mapper event as vLLM's publisher writes the event the connector yields."""
    if ev[0] == "stored":
        return ["BlockStored", list(ev[1]), ev[2], [], block_size, None, ev[3], None]
    if ev[0] == "removed":
        return ["BlockRemoved", list(ev[1]), ev[2]]
    return ["AllBlocksCleared"]


class EventPublisher:
    """vLLM's ``ZmqEventPublisher``, minus its thread: ``publish`` sends at once."""

    END_SEQ = (-1).to_bytes(8, "big", signed=True)

    def __init__(self, topic: str = "kv-events", buffer_steps: int = 10_000, dp_rank: int = 0) -> None:
        ctx = zmq.Context.instance()
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.replay = ctx.socket(zmq.ROUTER)
        self.replay.setsockopt(zmq.LINGER, 0)
        self.replay.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.replay_endpoint = self.replay.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.topic = topic.encode()
        self._seq = 0
        self._buffer: deque = deque(maxlen=buffer_steps)
        self._dp_rank = dp_rank

    def publish(self, events: list) -> None:
        payload = encode_batch(time.time(), events, self._dp_rank)
        seq = self._seq
        self._seq += 1
        self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        self._buffer.append((seq, payload))
        self.serve()

    def serve(self) -> None:
        """Answers waiting replay requests ``[identity, "", start_seq]``."""
        while True:
            try:
                frames = self.replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3:
                continue
            ident, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in self._buffer:
                if seq >= first:
                    self.replay.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
            self.replay.send_multipart([ident, b"", self.END_SEQ, b""])

    def close(self) -> None:
        self.pub.close(0)
        self.replay.close(0)


class EngineEvents:
    """The event path of one engine: each worker's ``get_kv_connector_kv_cache_events``, vLLM's
    ``KVOutputAggregator`` merging them, the scheduler connector's ``update_connector_output``
    and ``take_events``, and the publisher — one :meth:`step` per engine step."""

    def __init__(self, workers: Sequence[Any], world: int, block_size: int, chunk_size: int) -> None:
        self.workers = list(workers)  # kvtier_vllm.kv_events.WorkerEvents, one per rank
        self.mapper = BlockEventMapper(world, chunk_size // block_size)
        self.block_size = block_size
        self.publisher = EventPublisher()
        self.published = 0

    def remember(self, chunk_hashes: Iterable[bytes], prompt: Sequence[int]) -> None:
        """What the connector does in ``update_state_after_alloc`` with ``request.block_hashes``."""
        self.mapper.remember(list(chunk_hashes), [external(h) for h in block_hashes(prompt, self.block_size)])

    def step(self) -> int:
        combined = None
        for w in self.workers:
            ev = w.take(ChunkTransitions)
            if combined is None:
                combined = ev
            elif ev is not None:
                combined.add_events(ev.get_all_events())
                combined.increment_workers(1)
        if combined is not None:
            self.mapper.apply(combined.get_all_events())
        events = [wire_event(e, self.block_size) for e in self.mapper.take()]
        if events:
            self.publisher.publish(events)
            self.published += len(events)
        else:
            self.publisher.serve()
        return len(events)

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.publisher.close()
