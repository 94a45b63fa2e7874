"""KV cache events in vLLM's block-hash space (vLLM-free; :mod:`kvtier_vllm.connector` hands them
to vLLM as ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``). See docs/events.md.

The path, in vLLM's own plumbing:

1. Each worker follows its rank's namespace on the sidecar's event stream
   (:class:`~kvtier_vllm.sidecar_events.SidecarEventFollower`) and reports, once per step, the
   chunks that became reachable on this node or stopped being so, tagged with its rank
   (:class:`WorkerEvents` -> :class:`ChunkTransitions`, vLLM's ``get_kv_connector_kv_cache_events``).
2. vLLM's ``KVOutputAggregator`` merges the workers' containers (``add_events``,
   ``increment_workers``) and the scheduler's ``update_connector_output`` receives the result.
3. The scheduler (:class:`BlockEventMapper`) aggregates across ranks — a chunk is stored once
   **every** rank holds it, removed as soon as **any** rank lost it (a load needs all ranks) —
   and maps kvtier's chunk hashes to the engine's block hashes, which it learned from the
   requests it scheduled. ``take_events`` yields the result.

Events name each chunk's blocks (``blocks_per_chunk`` engine blocks) with what vLLM's own
``BlockStored`` carries for them (:class:`BlockEvent`, :func:`event_fields`): the blocks' tokens
(routers that key blocks by their tokens, such as Dynamo's, need them), the request's LoRA
(``lora_id``, ``lora_name``) and each block's ``extra_keys`` (the extra keys vLLM hashed into the
block: LoRA name, multimodal identifiers, cache salt), all remembered with the blocks' hashes, and
``medium`` the kind of the tier that first held the chunk on every rank (:data:`MEDIUMS`). A
CLEAR of the engine's namespaces removes each chunk reported stored with a ``BlockRemoved`` of its
blocks (routers such as llm-d's ignore ``AllBlocksCleared``, and kvtier's CLEAR does not touch the
GPU's blocks, which vLLM's own ``AllBlocksCleared`` would say).

With ``prefix_closed`` (the connector's setting) a chunk is reported stored only while the chunk
before it in its request is: what is reported is what a load can use (a LOOKUP counts chunks from
the first one on), and a router's prefix tree never holds a chunk whose parent it lacks (Dynamo's
radix tree drops a ``BlockStored`` whose parent it does not hold, and keeps counting a block whose
parent another engine still holds).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

__all__ = [
    "BlockEvent",
    "BlockEventMapper",
    "ChunkTransitions",
    "MEDIUMS",
    "MEDIUM_ORDER",
    "WorkerEvents",
    "block_extra_keys",
    "event_fields",
]

#: kvtier's ``medium`` strings, by the capabilities of the tier that holds a chunk, as the
#: sidecar's stream names them (docs/events.md): ``CPU`` host memory (local-cpu; the string vLLM's
#: own offloading connector gives host memory), ``SHARED`` a store several sidecars read and write
#: (redis, s3, fs), ``DISK`` another persistent one (local-disk), ``EXTERNAL`` anything else.
#: vLLM's own blocks are ``GPU``; vLLM has no string for the last three.
MEDIUMS = ("CPU", "DISK", "SHARED", "EXTERNAL")

#: Slower media last: a chunk reported for several ranks takes the slowest rank's medium.
MEDIUM_ORDER = {"CPU": 0, "DISK": 1, "SHARED": 2, "EXTERNAL": 3}


@dataclass(frozen=True)
class BlockEvent:
    """One event of :meth:`BlockEventMapper.take_records`: a chunk's blocks became reachable
    (``stored``) or stopped being so (``removed``).

    ``extra_keys`` has one entry per block (None for a block without extra keys), as vLLM's
    ``BlockStored.extra_keys``; ``lora_id`` and ``lora_name`` are the LoRA of the request the
    chunk was remembered from. A ``removed`` event carries only ``blocks`` and ``medium``.
    """

    kind: str
    blocks: tuple
    medium: str
    parent: Any = None
    token_ids: tuple = ()
    extra_keys: tuple | None = None
    lora_id: int | None = None
    lora_name: str | None = None

    def as_tuple(self) -> tuple:
        """The compact form :meth:`BlockEventMapper.take` returns."""
        if self.kind == "stored":
            return ("stored", self.blocks, self.parent, self.medium, self.token_ids)
        return ("removed", self.blocks, self.medium)


def event_fields(
    ev: BlockEvent,
    block_size: int,
    *,
    group_idx: int | None = None,
    kv_cache_spec_kind: str | None = None,
    kv_cache_spec_sliding_window: int | None = None,
) -> tuple[str, dict]:
    """The vLLM event class name and its fields for ``ev``, filled as vLLM's block pool fills its
    own (``vllm/v1/core/block_pool.py``): ``extra_keys`` one entry per block, ``group_idx`` the KV
    cache group and, on ``BlockStored`` only, the group's ``kv_cache_spec_kind`` and sliding
    window (vLLM's KV cache manager adds them to its own). A vLLM whose classes lack a field
    gets it dropped by the caller."""
    if ev.kind == "stored":
        extra = list(ev.extra_keys) if ev.extra_keys is not None else [None] * len(ev.blocks)
        return "BlockStored", {
            "block_hashes": list(ev.blocks),
            "parent_block_hash": ev.parent,
            "token_ids": list(ev.token_ids),
            "block_size": block_size,
            "lora_id": ev.lora_id,
            "medium": ev.medium,
            "lora_name": ev.lora_name,
            "extra_keys": extra,
            "group_idx": group_idx,
            "kv_cache_spec_kind": kv_cache_spec_kind,
            "kv_cache_spec_sliding_window": kv_cache_spec_sliding_window,
        }
    return "BlockRemoved", {"block_hashes": list(ev.blocks), "medium": ev.medium, "group_idx": group_idx}


def block_extra_keys(
    num_blocks: int,
    block_size: int,
    *,
    lora_name: str | None = None,
    cache_salt: str | None = None,
    mm: Sequence[tuple[str, int, int]] = (),
) -> list[tuple | None]:
    """Each block's extra keys as vLLM's ``generate_block_hash_extra_keys`` makes them (vLLM
    9aaf83ef, ``vllm/v1/core/kv_cache_utils.py``), for the connector where that function is not
    importable: the LoRA name, then ``(identifier, offset - block start)`` of each multimodal
    span (``(identifier, offset, length)``) the block overlaps, then the cache salt on the first
    block; None for a block with none. (Prompt embeddings add their own key in vLLM; kvtier
    stores nothing for such requests.)"""
    spans = sorted(mm, key=lambda s: s[1])
    out: list[tuple | None] = []
    for i in range(num_blocks):
        start, end = i * block_size, (i + 1) * block_size
        keys: list = [lora_name] if lora_name else []
        keys += [(ident, off - start) for ident, off, length in spans if off < end and off + length > start]
        if start == 0 and cache_salt:
            keys.append(cache_salt)
        out.append(tuple(keys) if keys else None)
    return out


class ChunkTransitions:
    """One or more workers' transitions, ``(rank, kind, chunk_hash, medium)`` tuples (``kind``
    ``stored``, ``removed`` or ``cleared``; hash and medium None where they do not apply).

    It has the methods of vLLM's ``KVConnectorKVEvents`` (the connector subclasses both), so
    vLLM's output aggregator can merge the workers' containers; aggregation across ranks is the
    scheduler's (:class:`BlockEventMapper`), so :meth:`aggregate` keeps every event."""

    def __init__(self, events: Iterable[tuple] = (), num_workers: int = 1) -> None:
        self._events: list[tuple] = list(events)
        self._workers = num_workers

    def add_events(self, events: list) -> None:
        self._events.extend(events)

    def aggregate(self) -> "ChunkTransitions":
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._workers += count

    def get_all_events(self) -> list:
        return list(self._events)

    def get_number_of_workers(self) -> int:
        return self._workers

    def clear_events(self) -> None:
        self._events = []
        self._workers = 1

    def merge(self, other: Any) -> "ChunkTransitions":
        self.add_events(other.get_all_events())
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} workers={self._workers} events={len(self._events)}>"


class WorkerEvents:
    """A worker's side: its rank's follower, polled once per step.

    :param follower: a :class:`~kvtier_vllm.sidecar_events.SidecarEventFollower` (owned).
    :param rank: this worker's KV rank index (``pp_rank * tp_size + tp_rank``).
    """

    def __init__(self, follower: Any, rank: int) -> None:
        self._follower = follower
        self._rank = rank

    def take(self, factory: Any = ChunkTransitions) -> Any:
        """This step's transitions in a container made by ``factory`` (None when there are none)."""
        out = []
        for t in self._follower.poll():
            if t[0] == "stored":
                out.append((self._rank, "stored", t[1], t[2]))
            elif t[0] == "removed":
                out.append((self._rank, "removed", t[1], None))
            else:
                out.append((self._rank, "cleared", None, None))
        return factory(out) if out else None

    def close(self) -> None:
        self._follower.close()


class _Chunk:
    __slots__ = ("ranks", "medium", "reported", "blocks", "parent", "tokens", "extra", "lora", "prev", "next")

    def __init__(self) -> None:
        self.ranks = 0
        self.medium: str | None = None
        self.reported: str | None = None
        self.blocks: tuple | None = None
        self.parent: Any = None
        self.tokens: array | None = None
        self.extra: tuple | None = None
        self.lora: tuple | None = None
        #: The chunk before this one in its request (None: the first), and the chunks after it.
        self.prev: bytes | None = None
        self.next: set[bytes] | None = None


class BlockEventMapper:
    """The scheduler's side (see the module docstring).

    :param world: KV ranks (``tp_size * pp_size``): a chunk is stored when all of them hold it.
    :param blocks_per_chunk: engine blocks per kvtier chunk.
    :param max_chunks: chunks remembered at most; past it the oldest is forgotten (reported
        removed when it was reported stored: a router then under- rather than over-estimates).
    :param block_size: tokens per engine block: with it, ``stored`` events carry the chunk's
        tokens (4 bytes each kept per remembered chunk); without it, none.
    :param prefix_closed: report a chunk only while the chunk before it in its request is
        reported (see the module docstring); a chunk removed takes the chunks after it along,
        and they come back with it.
    """

    def __init__(
        self,
        world: int,
        blocks_per_chunk: int,
        max_chunks: int = 65536,
        block_size: int | None = None,
        prefix_closed: bool = False,
    ) -> None:
        if world < 1 or blocks_per_chunk < 1 or max_chunks < 1 or (block_size is not None and block_size < 1):
            raise ValueError("world, blocks_per_chunk, max_chunks and block_size must be >= 1")
        self._full = (1 << world) - 1
        self._bpc = blocks_per_chunk
        self._chunk_tokens = None if block_size is None else block_size * blocks_per_chunk
        self._max = max_chunks
        self._closed = prefix_closed
        self._chunks: OrderedDict[bytes, _Chunk] = OrderedDict()
        self._out: list[BlockEvent] = []
        self._reported = 0

    @property
    def reported_chunks(self) -> int:
        """Chunks currently reported stored."""
        return self._reported

    def remember(
        self,
        chunk_hashes: Sequence[bytes],
        block_hashes: Sequence[Any],
        token_ids: Sequence[int] | None = None,
        extra_keys: Sequence[Any] | None = None,
        lora: tuple[int | None, str | None] | None = None,
    ) -> None:
        """Maps a request's chunks to its blocks: chunk ``i`` is blocks ``[i*bpc, (i+1)*bpc)`` (the
        engine's hashes, as its events name them) and, with ``block_size`` and the request's
        ``token_ids``, those blocks' tokens; ``extra_keys`` (one entry per block, aligned with
        ``block_hashes``) and ``lora`` (``(lora_id, lora_name)``) are kept for the events. Chunks
        without all their blocks are skipped."""
        bpc = self._bpc
        n = self._chunk_tokens
        prev: bytes | None = None
        for i, h in enumerate(chunk_hashes):
            blocks = tuple(block_hashes[i * bpc : (i + 1) * bpc])
            if len(blocks) < bpc:
                break
            key = bytes(h)
            c = self._get(key)
            if c.blocks is None:
                c.blocks = blocks
                c.parent = block_hashes[i * bpc - 1] if i > 0 else None
                if extra_keys is not None and any(k is not None for k in extra_keys[i * bpc : (i + 1) * bpc]):
                    c.extra = tuple(extra_keys[i * bpc : (i + 1) * bpc])
                if lora is not None and (lora[0] is not None or lora[1] is not None):
                    c.lora = (lora[0], lora[1])
            if c.tokens is None and n is not None and token_ids is not None and len(token_ids) >= (i + 1) * n:
                c.tokens = array("i", token_ids[i * n : (i + 1) * n])
            c.prev = prev
            if prev is not None:
                p = self._chunks.get(prev)
                if p is not None:
                    if p.next is None:
                        p.next = set()
                    p.next.add(key)
            self._report(c)
            prev = key
        self._trim()

    def apply(self, transitions: Iterable[tuple]) -> None:
        """Applies workers' transitions (:class:`ChunkTransitions` events)."""
        cleared = False
        for rank, kind, h, medium in transitions:
            bit = 1 << rank
            if kind == "cleared":
                cleared = True
                for c in self._chunks.values():
                    c.ranks &= ~bit
                continue
            if kind == "stored":
                c = self._get(bytes(h))
                c.ranks |= bit
                if c.medium is None or MEDIUM_ORDER.get(medium, 9) > MEDIUM_ORDER.get(c.medium, 9):
                    c.medium = medium
                self._report(c)
            elif kind == "removed":
                c = self._chunks.get(bytes(h))
                if c is None:
                    continue
                c.ranks &= ~bit
                self._unreport(c)
                if c.ranks == 0:
                    c.medium = None
        if cleared:
            # Each chunk reported stored is removed by name: a router may ignore AllBlocksCleared.
            for c in self._chunks.values():
                if c.reported is not None:
                    self._out.append(BlockEvent("removed", c.blocks, c.reported))
                c.reported = None
                if c.ranks == 0:
                    c.medium = None
            self._reported = 0
            # Chunks stored again (on every rank) since the CLEAR are reported anew.
            for c in list(self._chunks.values()):
                self._report(c)
        self._trim()

    def take(self) -> list[tuple]:
        """Events since the last call: ``("stored", blocks, parent, medium, token_ids)``
        (``token_ids`` a tuple, empty when not known) and ``("removed", blocks, medium)``
        (:meth:`take_records` has every field)."""
        return [ev.as_tuple() for ev in self.take_records()]

    def take_records(self) -> list[BlockEvent]:
        """Events since the last call, with every field (:class:`BlockEvent`)."""
        out, self._out = self._out, []
        return out

    def _get(self, h: bytes) -> _Chunk:
        c = self._chunks.get(h)
        if c is None:
            c = self._chunks[h] = _Chunk()
        else:
            self._chunks.move_to_end(h)
        return c

    def _reportable(self, c: _Chunk) -> bool:
        if c.reported is not None or c.blocks is None or c.ranks != self._full:
            return False
        if not self._closed or c.prev is None:
            return True
        p = self._chunks.get(c.prev)
        return p is not None and p.reported is not None

    def _report(self, c: _Chunk) -> None:
        todo = [c]
        while todo:
            c = todo.pop()
            if not self._reportable(c):
                continue
            c.reported = c.medium or "CPU"
            self._reported += 1
            lora = c.lora or (None, None)
            self._out.append(
                BlockEvent("stored", c.blocks, c.reported, c.parent, tuple(c.tokens or ()), c.extra, lora[0], lora[1])
            )
            if self._closed and c.next:
                todo.extend(self._chunks[h] for h in c.next if h in self._chunks)

    def _unreport(self, c: _Chunk) -> None:
        todo = [c]
        while todo:
            c = todo.pop()
            if c.reported is None:
                continue
            self._out.append(BlockEvent("removed", c.blocks, c.reported))
            c.reported = None
            self._reported -= 1
            if self._closed and c.next:
                todo.extend(self._chunks[h] for h in c.next if h in self._chunks)

    def _trim(self) -> None:
        while len(self._chunks) > self._max:
            h, c = self._chunks.popitem(last=False)
            self._unreport(c)
            if c.prev is not None:
                p = self._chunks.get(c.prev)
                if p is not None and p.next:
                    p.next.discard(h)



def _reachable(endpoint: str, sidecar_endpoint: str) -> str:
    """``endpoint`` with a wildcard host (``*``, ``0.0.0.0``, ``::``) replaced by the sidecar's."""
    scheme, _, rest = endpoint.partition("://")
    host, sep, port = rest.rpartition(":")
    if scheme != "tcp" or not sep or host.strip("[]") not in ("*", "0.0.0.0", "::"):
        return endpoint
    sidecar_host = sidecar_endpoint.partition("://")[2].rpartition(":")[0]
    return f"tcp://{sidecar_host}:{port}"


def open_worker_events(
    client: Any,
    namespace: bytes,
    rank: int,
    *,
    endpoint: str | None = None,
    replay_endpoint: str | None = None,
    max_chunks: int = 65536,
    curve: Any = None,
) -> WorkerEvents:
    """A worker's :class:`WorkerEvents` on the stream of the sidecar ``client`` talks to: the
    endpoints given, else those its PING names (``events``).

    :raises ConfigError: when neither names a stream (the sidecar's ``events`` is off).
    """
    from .errors import ConfigError
    from .sidecar_events import SidecarEventFollower

    topic = "kvtier"
    if endpoint is None or replay_endpoint is None:
        info = (client.ping(timeout_ms=1000) or {}).get("events") or {}
        if not info.get("endpoint") or not info.get("replayEndpoint"):
            raise ConfigError(
                f"kv_events is on but the sidecar at {client.endpoint} publishes no event stream with replay; "
                "set events in its config (docs/events.md) or events_endpoint and events_replay_endpoint here"
            )
        endpoint = endpoint or _reachable(str(info["endpoint"]), client.endpoint)
        replay_endpoint = replay_endpoint or _reachable(str(info["replayEndpoint"]), client.endpoint)
        topic = str(info.get("topic", topic))
    follower = SidecarEventFollower(
        endpoint, replay_endpoint, namespace, topic=topic, max_chunks=max_chunks, curve=curve
    )
    return WorkerEvents(follower, rank)
