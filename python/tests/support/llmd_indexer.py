"""A KV-cache indexer as llm-d's KV cache manager runs one, written for tests from its sources
(llm-d/llm-d-kv-cache-manager at 0e9fb4729313ce3bcd5a6b87e1227b4409d2da63):

- ``pkg/kvcache/kvevents/zmq_subscriber.go``: a SUB socket with a topic filter; a message is
  three frames ``[topic, seq, payload]`` and its topic ``kv@<pod-id>@<model-name>`` names the pod
  and the model (a topic of another shape is dropped);
- ``pkg/kvcache/kvevents/events.go`` and ``pool.go``: the payload is ``[ts, events,
  data_parallel_rank?]`` (an array, or a map of those names); each event must be an array whose
  first element is its tag (a tagged map is skipped: the map encoding vLLM adopted in its PR
  42892 reached llm-d only later, in llm-d-kv-cache PR 661); ``BlockStored`` is read by position (block hashes, parent, token ids,
  block size, LoRA id, medium; later fields ignored), ``BlockRemoved`` as (block hashes, medium).
  A hash is an integer taken as unsigned 64 bits, or bytes whose last 8 are read big-endian.
  The device tier is the medium lowercased, ``gpu`` without one. ``BlockStored`` adds a pod entry
  ``(pod, tier)`` to the key ``(model, hash)`` of each block; ``BlockRemoved`` evicts that entry
  from each key (a key left without entries goes); ``AllBlocksCleared`` is ignored;
- ``pkg/kvcache/kvblock/in_memory.go``: the index, key -> pod entries (at most 10 per key,
  least recently added out first);
- ``pkg/kvcache/kvblock/token_processor.go``: a prompt's block keys, computed from its tokens as
  vLLM's ``sha256_cbor`` block hash (CBOR of ``[parent, tokens, None]`` hashed with SHA-256, the
  first parent the SHA-256 of the CBOR of the hash seed, vLLM's ``PYTHONHASHSEED``), whole blocks
  only, each key the last 8 bytes of its hash; no extra keys (LoRA, salt, multimodal) enter it;
- ``pkg/kvcache/kvblock_scorer.go``: ``LongestPrefix``: a pod scores for consecutive keys from
  the prompt's first while it holds each (in any tier), each key adding its best tier's weight.

Where this differs from the commit read: the SUB socket connects to the engine's publisher
(0e9fb47 binds it and lets vLLM's publishers connect; vLLM binds when its endpoint has a
wildcard host, as the tests' engines are started), and :meth:`LlmdIndexer.score` can restrict the
tiers that count (weights 1) to score what an engine can load from one store.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Iterable, Sequence

import zmq

__all__ = ["LlmdIndexer", "block_keys"]

#: Pod entries kept per key (``defaultPodsPerKey``).
PODS_PER_KEY = 10


def _cbor(value: Any) -> bytes:
    import cbor2

    return cbor2.dumps(value, canonical=True)


def block_keys(tokens: Sequence[int], block_size: int, hash_seed: str) -> list[int]:
    """The prompt's block keys as llm-d's token processor computes them (see the module)."""
    parent = hashlib.sha256(_cbor(hash_seed)).digest()
    keys = []
    for i in range(len(tokens) // block_size):
        parent = hashlib.sha256(_cbor([parent, [int(t) for t in tokens[i * block_size : (i + 1) * block_size]], None])).digest()
        keys.append(int.from_bytes(parent[24:], "big"))
    return keys


def _hash_u64(h: Any) -> int | None:
    if isinstance(h, bool):
        return None
    if isinstance(h, int):
        return h & 0xFFFFFFFFFFFFFFFF
    if isinstance(h, (bytes, bytearray)) and h:
        return int.from_bytes(bytes(h)[-8:].rjust(8, b"\0"), "big")
    return None


class LlmdIndexer:
    """See the module docstring.

    :param block_size: tokens per block of the token processor.
    :param hash_seed: the token processor's ``HashSeed`` (the engines' ``PYTHONHASHSEED``).
    """

    def __init__(self, block_size: int, hash_seed: str) -> None:
        import msgspec

        self.block_size = block_size
        self.hash_seed = hash_seed
        self._decoder = msgspec.msgpack.Decoder()
        self._ctx = zmq.Context()
        self._subs: list = []
        #: (model, hash) -> pod entries (pod, tier), oldest first.
        self.index: dict[tuple[str, int], OrderedDict] = {}
        self.skipped_events = 0
        self.dropped_messages = 0
        self.cleared_ignored = 0
        #: pod -> messages digested.
        self.messages: dict[str, int] = {}

    def subscribe(self, endpoint: str, topic_filter: str = "kv@") -> None:
        s = self._ctx.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SUBSCRIBE, topic_filter.encode())
        s.connect(endpoint)
        self._subs.append(s)

    def pump(self) -> int:
        """Reads and digests every message waiting; returns how many."""
        n = 0
        for s in self._subs:
            while s.poll(0):
                frames = s.recv_multipart()
                n += 1
                if len(frames) != 3:
                    self.dropped_messages += 1
                    continue
                parts = frames[0].decode(errors="replace").split("@")
                if len(parts) != 3:
                    self.dropped_messages += 1
                    continue
                self.messages[parts[1]] = self.messages.get(parts[1], 0) + 1
                self.process(parts[1], parts[2], frames[2])
        return n

    def process(self, pod: str, model: str, payload: bytes) -> None:
        """``Pool.processEvent`` then ``digestEvents`` for one message."""
        try:
            batch = self._decoder.decode(payload)
        except Exception:
            self.dropped_messages += 1
            return
        if isinstance(batch, dict):  # a struct decodes from a map by field names too
            batch = [batch.get("ts"), batch.get("events")]
        if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[1], (list, tuple)):
            self.dropped_messages += 1
            return
        for raw in batch[1]:
            if not isinstance(raw, (list, tuple)) or not raw or not isinstance(raw[0], str):
                self.skipped_events += 1
                continue
            tag, rest = raw[0], list(raw[1:])
            if tag == "BlockStored":
                rest += [None] * (6 - len(rest))
                hashes, medium = rest[0], rest[5]
                tier = medium.lower() if isinstance(medium, str) else "gpu"
                keys = [k for k in (_hash_u64(h) for h in hashes or ()) if k is not None]
                for k in keys:
                    self._add((model, k), (pod, tier))
            elif tag == "BlockRemoved":
                rest += [None] * (2 - len(rest))
                hashes, medium = rest[0], rest[1]
                tier = medium.lower() if isinstance(medium, str) else "gpu"
                for k in (_hash_u64(h) for h in hashes or ()):
                    if k is not None:
                        self._evict((model, k), (pod, tier))
            elif tag == "AllBlocksCleared":
                self.cleared_ignored += 1
            else:
                self.skipped_events += 1

    def _add(self, key: tuple[str, int], entry: tuple[str, str]) -> None:
        entries = self.index.setdefault(key, OrderedDict())
        entries.pop(entry, None)
        entries[entry] = None
        while len(entries) > PODS_PER_KEY:
            entries.popitem(last=False)

    def _evict(self, key: tuple[str, int], entry: tuple[str, str]) -> None:
        entries = self.index.get(key)
        if entries is None:
            return
        entries.pop(entry, None)
        if not entries:
            del self.index[key]

    def scores(self, tokens: Sequence[int], model: str, tiers: Iterable[str] | None = None) -> dict[str, int]:
        """Pod -> longest run of the prompt's block keys from the first that the pod holds (in
        one of ``tiers``; every tier when None), one per key (every weight 1)."""
        allowed = None if tiers is None else set(tiers)
        active: set[str] | None = None
        out: dict[str, int] = {}
        for k in block_keys(tokens, self.block_size, self.hash_seed):
            pods = {p for p, t in self.index.get((model, k), ()) if allowed is None or t in allowed}
            active = pods if active is None else active & pods
            if not active:
                break
            for p in active:
                out[p] = out.get(p, 0) + 1
        return out

    def score(self, pod: str, tokens: Sequence[int], model: str, tiers: Iterable[str] | None = None) -> int:
        return self.scores(tokens, model, tiers).get(pod, 0)

    def close(self) -> None:
        for s in self._subs:
            s.close()
        self._ctx.term()
