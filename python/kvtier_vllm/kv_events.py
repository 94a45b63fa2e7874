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

Events name each chunk's blocks (``blocks_per_chunk`` engine blocks) with their ``token_ids``
(the request's tokens of those blocks, remembered with the blocks' hashes: routers that key
blocks by their tokens, such as Dynamo's, need them) and ``medium`` the kind of the tier that
first held the chunk on every rank (``CPU``, ``DISK``, ``SHARED``). A CLEAR of the engine's
namespaces removes each chunk reported stored with a ``BlockRemoved`` of its blocks (routers
such as llm-d's ignore ``AllBlocksCleared``, and kvtier's CLEAR does not touch the GPU's
blocks, which vLLM's own ``AllBlocksCleared`` would say).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Any, Iterable, Sequence

__all__ = ["ChunkTransitions", "BlockEventMapper", "WorkerEvents", "MEDIUM_ORDER"]

#: Slower media last: a chunk reported for several ranks takes the slowest rank's medium.
MEDIUM_ORDER = {"CPU": 0, "DISK": 1, "SHARED": 2, "EXTERNAL": 3}


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
    __slots__ = ("ranks", "medium", "reported", "blocks", "parent", "tokens")

    def __init__(self) -> None:
        self.ranks = 0
        self.medium: str | None = None
        self.reported: str | None = None
        self.blocks: tuple | None = None
        self.parent: Any = None
        self.tokens: array | None = None


class BlockEventMapper:
    """The scheduler's side (see the module docstring).

    :param world: KV ranks (``tp_size * pp_size``): a chunk is stored when all of them hold it.
    :param blocks_per_chunk: engine blocks per kvtier chunk.
    :param max_chunks: chunks remembered at most; past it the oldest is forgotten (reported
        removed when it was reported stored: a router then under- rather than over-estimates).
    :param block_size: tokens per engine block: with it, ``stored`` events carry the chunk's
        tokens (4 bytes each kept per remembered chunk); without it, none.
    """

    def __init__(self, world: int, blocks_per_chunk: int, max_chunks: int = 65536, block_size: int | None = None) -> None:
        if world < 1 or blocks_per_chunk < 1 or max_chunks < 1 or (block_size is not None and block_size < 1):
            raise ValueError("world, blocks_per_chunk, max_chunks and block_size must be >= 1")
        self._full = (1 << world) - 1
        self._bpc = blocks_per_chunk
        self._chunk_tokens = None if block_size is None else block_size * blocks_per_chunk
        self._max = max_chunks
        self._chunks: OrderedDict[bytes, _Chunk] = OrderedDict()
        self._out: list[tuple] = []
        self._reported = 0

    @property
    def reported_chunks(self) -> int:
        """Chunks currently reported stored."""
        return self._reported

    def remember(
        self, chunk_hashes: Sequence[bytes], block_hashes: Sequence[Any], token_ids: Sequence[int] | None = None
    ) -> None:
        """Maps a request's chunks to its blocks: chunk ``i`` is blocks ``[i*bpc, (i+1)*bpc)`` (the
        engine's hashes, as its events name them) and, with ``block_size`` and the request's
        ``token_ids``, those blocks' tokens. Chunks without all their blocks are skipped."""
        bpc = self._bpc
        n = self._chunk_tokens
        for i, h in enumerate(chunk_hashes):
            blocks = tuple(block_hashes[i * bpc : (i + 1) * bpc])
            if len(blocks) < bpc:
                break
            c = self._get(bytes(h))
            if c.blocks is None:
                c.blocks = blocks
                c.parent = block_hashes[i * bpc - 1] if i > 0 else None
            if c.tokens is None and n is not None and token_ids is not None and len(token_ids) >= (i + 1) * n:
                c.tokens = array("i", token_ids[i * n : (i + 1) * n])
            self._report(c)
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
                if c.reported is not None:
                    self._out.append(("removed", c.blocks, c.reported))
                    c.reported = None
                    self._reported -= 1
                if c.ranks == 0:
                    c.medium = None
        if cleared:
            # Each chunk reported stored is removed by name: a router may ignore AllBlocksCleared.
            for c in self._chunks.values():
                if c.reported is not None:
                    self._out.append(("removed", c.blocks, c.reported))
                c.reported = None
                if c.ranks == 0:
                    c.medium = None
            self._reported = 0
            # Chunks stored again (on every rank) since the CLEAR are reported anew.
            for c in self._chunks.values():
                self._report(c)
        self._trim()

    def take(self) -> list[tuple]:
        """Events since the last call: ``("stored", blocks, parent, medium, token_ids)``
        (``token_ids`` a tuple, empty when not known) and ``("removed", blocks, medium)``."""
        out, self._out = self._out, []
        return out

    def _get(self, h: bytes) -> _Chunk:
        c = self._chunks.get(h)
        if c is None:
            c = self._chunks[h] = _Chunk()
        else:
            self._chunks.move_to_end(h)
        return c

    def _report(self, c: _Chunk) -> None:
        if c.reported is None and c.blocks is not None and c.ranks == self._full:
            c.reported = c.medium or "CPU"
            self._reported += 1
            self._out.append(("stored", c.blocks, c.parent, c.reported, tuple(c.tokens or ())))

    def _trim(self) -> None:
        while len(self._chunks) > self._max:
            _, c = self._chunks.popitem(last=False)
            if c.reported is not None:
                self._out.append(("removed", c.blocks, c.reported))
                self._reported -= 1


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
