"""A KV indexer as Dynamo's KV router runs one, written for tests from Dynamo's sources:

- ai-dynamo/dynamo ``lib/llm/src/kv_router/publisher.rs`` at 02fec11b7ee19d239974206ae6a88045bd4e6461
  (the ZMQ listener on a vLLM engine's event publisher, the wire decoder, the conversion of
  vLLM's events into the router's);
- ai-dynamo/dynamo ``lib/llm/src/kv_router/indexer.rs`` at 003dab3b6d82a228b39bce34988c05af5813717f
  (``RadixTree``: ``apply_event``, ``find_matches``, ``OverlapScores``);
- ai-dynamo/dynamo ``lib/kv-router/src/zmq_wire/convert.rs`` at 2bd0a36dcb371b2f22ad56aa48215e383aee02a0
  (later revisions: each event placed in a worker's storage tier from its ``medium``).

What it does, as those do:

- A SUB socket per worker connects to the engine's publisher and subscribes to a topic prefix;
  a message must be three frames ``[topic, seq, payload]`` with an 8-byte sequence number.
- The payload is ``[ts, events, data_parallel_rank]`` or a map of those names (the rank is
  required: a batch without it fails to decode and is dropped whole). Each event is a tagged sequence (vLLM's ``array_like``
  encoding) or a tagged map (vLLM after its PR 42892), read by position or by name; fields past
  the known ones are ignored. Block hashes must be integers (signed or unsigned 64-bit, read as
  unsigned): a batch with a bytes hash fails to decode and is dropped.
- ``BlockStored``: each block takes ``block_size`` of the event's ``token_ids`` in turn; its key in
  the tree is a hash of those tokens alone (the "local block hash"); an event whose
  ``block_size`` is not the indexer's stops at that block (Dynamo warns and publishes none of
  the rest), and one with fewer tokens than its blocks need is a slice past the end of
  ``token_ids`` (a panic that ends the listener in Rust: here the worker's subscription is
  marked dead and reads nothing more). ``lora_id``, ``lora_name`` and ``extra_keys`` do not
  enter the key at 02fec11.
- The tree: nodes keyed by their local hash under their parent, each with the set of workers that
  hold it; per worker a lookup from the engine's block hash to its node. A store starts at the
  node of ``parent_block_hash`` in the worker's lookup (the root when None) and is skipped
  whole when the parent is not there (``ParentBlockNotFound``). A removal takes the worker off
  each named node and out of its lookup; a node no worker holds loses its children. A hash the
  worker's lookup lacks ends the removal there (``BlockNotFound``). ``AllBlocksCleared`` takes the
  worker off every node it holds.
- ``find_matches``: walk the tree from the root along the prompt's local block hashes (its whole
  blocks), stopping at the first missing child; every worker on each node passed scores one.

Where this differs from the commits read (and why):

- ``medium``: 02fec11 reads it and ignores it (a worker is its engine). Later revisions place
  each event in ``(worker, storage tier)``. Here an engine is two workers: ``"device"`` for the
  GPU's blocks (medium ``GPU`` or none) and ``"offload"`` for every other medium. The offloaded
  media are not split further: a kvtier prefix can span media (a chunk's medium is the kind of
  tier that first held it), and the tree finds a block's parent in the same worker's lookup.
  ``medium_aware=False`` is 02fec11's behaviour.
- The local block hash: Dynamo's is xxh3-64 (seed 1337) of the tokens as little-endian u32;
  here it is an 8-byte BLAKE2b of the same bytes (xxhash is not in the environment). Any hash of
  the block's tokens alone keys the tree the same way.
- Events are applied on the caller's thread as :meth:`pump` reads them (Dynamo applies them on
  an indexer thread from a channel, in the same order).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import zmq

__all__ = ["DynamoIndexer", "local_block_hashes", "OFFLOAD", "DEVICE"]

DEVICE = "device"
OFFLOAD = "offload"


def _local_hash(tokens: Sequence[int]) -> int:
    data = b"".join(int(t).to_bytes(4, "little") for t in tokens)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def local_block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """The local hash of each whole block of ``tokens`` (a trailing partial block has none)."""
    n = len(tokens) // block_size
    return [_local_hash(tokens[i * block_size : (i + 1) * block_size]) for i in range(n)]


class _Node:
    __slots__ = ("children", "workers")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.workers: set = set()


class _Undecodable(Exception):
    pass


def _u64(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _Undecodable(f"block hash {v!r} is not an integer")
    return v & 0xFFFFFFFFFFFFFFFF


_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
_REMOVED = ("block_hashes", "medium")


def _event(raw: Any) -> tuple[str, dict]:
    """``(tag, fields)`` of one wire event, tagged sequence or tagged map."""
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields = {k: raw.get(k) for k in _STORED}
    elif isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = _STORED if tag == "BlockStored" else _REMOVED if tag == "BlockRemoved" else ()
        fields = {k: (raw[i + 1] if i + 1 < len(raw) else None) for i, k in enumerate(names)}
    else:
        raise _Undecodable(f"not a tagged event: {raw!r}")
    if tag == "BlockStored":
        if fields["block_hashes"] is None or fields["token_ids"] is None or fields["block_size"] is None:
            raise _Undecodable("BlockStored without block_hashes, token_ids or block_size")
        fields["block_hashes"] = [_u64(h) for h in fields["block_hashes"]]
        if fields["parent_block_hash"] is not None:
            fields["parent_block_hash"] = _u64(fields["parent_block_hash"])
    elif tag == "BlockRemoved":
        if fields["block_hashes"] is None:
            raise _Undecodable("BlockRemoved without block_hashes")
        fields["block_hashes"] = [_u64(h) for h in fields["block_hashes"]]
    elif tag != "AllBlocksCleared":
        raise _Undecodable(f"unknown event {tag!r}")
    return tag, fields


@dataclass
class _Subscription:
    worker_id: Any
    socket: Any
    dead: bool = False
    batches: int = 0
    undecodable: int = 0
    last_seq: int | None = None


@dataclass
class Counters:
    """What went wrong, per worker key, as Dynamo's ``kv_cache_events_applied`` metric counts it."""

    parent_not_found: dict = field(default_factory=dict)
    block_not_found: dict = field(default_factory=dict)
    short_tokens: dict = field(default_factory=dict)
    wrong_block_size: dict = field(default_factory=dict)

    @staticmethod
    def bump(d: dict, key: Any) -> None:
        d[key] = d.get(key, 0) + 1


class DynamoIndexer:
    """See the module docstring.

    :param block_size: the router's KV block size (tokens per block; Dynamo's ``kv_block_size``).
    :param medium_aware: split an engine into a ``device`` and an ``offload`` worker by medium
        (False: 02fec11, one worker per engine).
    """

    def __init__(self, block_size: int, *, medium_aware: bool = True) -> None:
        import msgspec

        self.block_size = block_size
        self.medium_aware = medium_aware
        self._decoder = msgspec.msgpack.Decoder()
        self._ctx = zmq.Context()
        self._subs: list[_Subscription] = []
        self._fed: dict[Any, _Subscription] = {}
        self._root = _Node()
        self._lookup: dict[Any, dict[int, _Node]] = {}
        self.counters = Counters()

    # ------------------------------------------------------------------ the listener

    def subscribe(self, worker_id: Any, endpoint: str, topic: str = "") -> None:
        """A SUB socket for ``worker_id`` on an engine's publisher (``start_zmq_listener``)."""
        s = self._ctx.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SUBSCRIBE, topic.encode())
        s.connect(endpoint)
        self._subs.append(_Subscription(worker_id, s))

    def pump(self) -> int:
        """Reads and applies every message waiting on every live subscription; returns how many."""
        n = 0
        for sub in self._subs:
            while sub.socket is not None and not sub.dead and sub.socket.poll(0):
                frames = sub.socket.recv_multipart()
                n += 1
                if len(frames) != 3 or len(frames[1]) != 8:
                    continue
                sub.last_seq = int.from_bytes(frames[1], "big")
                self._batch(sub, frames[2])
        return n

    def feed(self, worker_id: Any, payload: bytes) -> _Subscription:
        """Applies one payload as if ``worker_id``'s socket had received it (no socket)."""
        sub = self._fed.get(worker_id)
        if sub is None:
            sub = self._fed[worker_id] = _Subscription(worker_id, None)
            self._subs.append(sub)
        if not sub.dead:
            self._batch(sub, payload)
        return sub

    def dead_workers(self) -> list:
        """Workers whose listener ended (an event sliced past its tokens)."""
        return [s.worker_id for s in self._subs if s.dead]

    def undecodable_batches(self) -> int:
        return sum(s.undecodable for s in self._subs)

    def _batch(self, sub: _Subscription, payload: bytes) -> None:
        try:
            batch = self._decoder.decode(payload)
            if isinstance(batch, dict):  # a struct decodes from a map by field names too
                rank = batch.get("data_parallel_rank", batch.get("dp_rank"))
                batch = [batch.get("ts"), batch.get("events"), rank]
            if not isinstance(batch, (list, tuple)) or len(batch) < 3 or not isinstance(batch[2], int):
                raise _Undecodable("a batch is [ts, events, data_parallel_rank]")
            if not isinstance(batch[1], (list, tuple)):
                raise _Undecodable("a batch's events are a sequence")
            events = [_event(raw) for raw in batch[1]]
        except (_Undecodable, ValueError, TypeError):  # the whole batch is dropped
            sub.undecodable += 1
            return
        sub.batches += 1
        for tag, fields in events:
            if not self.apply(sub.worker_id, tag, fields):
                sub.dead = True
                return

    # ------------------------------------------------------------------ the tree

    def worker_key(self, worker_id: Any, medium: str | None) -> Any:
        """The tree's worker for an event of ``worker_id`` with this ``medium``."""
        if not self.medium_aware:
            return worker_id
        return (worker_id, DEVICE if medium in (None, "GPU") else OFFLOAD)

    def apply(self, worker_id: Any, tag: str, fields: dict) -> bool:
        """Applies one decoded event; False when it ends the listener (a slice past the tokens)."""
        if tag == "AllBlocksCleared":
            self._clear(self.worker_key(worker_id, None))
            return True
        w = self.worker_key(worker_id, fields.get("medium"))
        if tag == "BlockRemoved":
            self._remove(w, fields["block_hashes"])
            return True
        tokens = list(fields["token_ids"])
        size = int(fields["block_size"])
        blocks: list[tuple[int, int]] = []
        for i, h in enumerate(fields["block_hashes"]):
            if size != self.block_size:
                Counters.bump(self.counters.wrong_block_size, w)
                break
            if (i + 1) * size > len(tokens):
                Counters.bump(self.counters.short_tokens, w)
                return False
            blocks.append((h, _local_hash(tokens[i * size : (i + 1) * size])))
        self._store(w, fields["parent_block_hash"], blocks)
        return True

    def _store(self, w: Any, parent: int | None, blocks: list[tuple[int, int]]) -> None:
        lookup = self._lookup.setdefault(w, {})
        current = self._root if parent is None else lookup.get(parent)
        if current is None:
            Counters.bump(self.counters.parent_not_found, w)
            return
        for block_hash, local in blocks:
            node = current.children.get(local)
            if node is None:
                node = lookup.get(block_hash) or _Node()
                current.children[local] = node
            node.workers.add(w)
            lookup[block_hash] = node
            current = node

    def _remove(self, w: Any, hashes: Iterable[int]) -> None:
        lookup = self._lookup.setdefault(w, {})
        for h in hashes:
            node = lookup.get(h)
            if node is None:
                Counters.bump(self.counters.block_not_found, w)
                return
            node.workers.discard(w)
            if not node.workers:
                node.children.clear()
            del lookup[h]

    def _clear(self, w: Any) -> None:
        lookup = self._lookup.get(w)
        if lookup:
            for node in lookup.values():
                node.workers.discard(w)
            lookup.clear()

    def find_matches(self, tokens: Sequence[int]) -> dict:
        """Worker key -> blocks of the prompt found for it along the tree (``OverlapScores``)."""
        scores: dict = {}
        current = self._root
        for local in local_block_hashes(tokens, self.block_size):
            node = current.children.get(local)
            if node is None:
                break
            for w in node.workers:
                scores[w] = scores.get(w, 0) + 1
            current = node
        return scores

    def score(self, worker_id: Any, tokens: Sequence[int], where: str = OFFLOAD) -> int:
        """Blocks of ``tokens`` ``find_matches`` credits to the engine's ``where`` worker."""
        key = self.worker_key(worker_id, "GPU" if where == DEVICE else "CPU")
        return self.find_matches(tokens).get(key, 0)

    def close(self) -> None:
        for s in self._subs:
            if s.socket is not None:
                s.socket.close()
        self._ctx.term()
