"""Follows one namespace of a sidecar's event stream (docs/events.md) without ever blocking.

:class:`SidecarEventFollower` keeps which tiers of the sidecar hold each chunk of its namespace
and turns the stream into *reachability transitions*: ``("stored", hash, medium)`` when a chunk
becomes reachable (some tier holds it), ``("removed", hash)`` when the last tier that held it no
longer does, and ``("cleared",)`` when a CLEAR covers the namespace. Gaps in the sequence numbers
are repaired from the replay window; a new instance id (the sidecar restarted) or a gap older than
the window is resynchronised from a snapshot, and the picture before and after is compared, so a
restart yields only the transitions it really caused.

Call :meth:`~SidecarEventFollower.poll` from one thread (zmq sockets are not thread-safe), as
often as convenient (the worker connector: once per engine step). Memory is bounded by
``max_chunks`` (past it the oldest chunk is forgotten and reported removed, the safe side for a
router) and by ``max_held`` messages held while a replay or snapshot is answered.

Payloads are read with the ``msgpack`` package, imported here: only a connector with
``kv_events`` on needs it.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import zmq

try:
    import msgpack
except ImportError as _err:
    raise ImportError(
        "kvtier_vllm's kv_events needs the msgpack package: pip install msgpack (Debian: apt-get install python3-msgpack)"
    ) from _err

from .errors import ProtocolError

__all__ = ["SidecarEventFollower", "END_SEQ"]

_log = logging.getLogger("kvtier_vllm.events")

#: The sequence number that ends a replay or a snapshot.
END_SEQ = b"\xff" * 8


class SidecarEventFollower:
    """See the module docstring.

    :param endpoint: the sidecar's event PUB endpoint (PING's ``events.endpoint``).
    :param replay_endpoint: its replay ROUTER endpoint.
    :param namespace: the 16-byte namespace id followed.
    :param topic: the stream's topic (the SUB prefix filter).
    :param max_chunks: chunks remembered at most.
    :param request_timeout_s: a replay or snapshot not answered by then is asked again.
    :param curve: CurveZMQ keys (:class:`~kvtier_vllm.curve.CurveKeys`) when the sidecar has keys.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str,
        namespace: bytes,
        *,
        topic: str = "kvtier",
        max_chunks: int = 1 << 18,
        max_held: int = 10_000,
        request_timeout_s: float = 5.0,
        curve: Any = None,
        clock: Callable[[], float] = time.monotonic,
        context: zmq.Context | None = None,
    ) -> None:
        if len(namespace) != 16:
            raise ValueError("namespace must be 16 bytes")
        self._ns = bytes(namespace)
        self._ctx = context or zmq.Context.instance()
        self._curve = curve
        self._replay_endpoint = replay_endpoint
        self._max_chunks = max_chunks
        self._max_held = max_held
        self._timeout = request_timeout_s
        self._clock = clock
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.apply(self._sub)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        self._sub.connect(endpoint)
        self._dealer: zmq.Socket | None = None
        self._instance: str | None = None
        self._last = 0
        #: hash -> bitmask of the tiers holding it (insertion order: oldest first).
        self._chunks: dict[bytes, int] = {}
        self._bits: dict[str, int] = {}
        self._media: dict[int, str] = {}
        self._out: list[tuple] = []
        self._held: list[tuple] = []
        #: None, or ("replay" | "snapshot", sent_at, replies so far)
        self._request: list | None = None
        self._need_snapshot = True
        #: Instances followed before (a message of one is a straggler from before a restart).
        self._retired: list[str] = []
        self.stats = {"messages": 0, "replays": 0, "snapshots": 0, "timeouts": 0, "bad": 0}

    # ------------------------------------------------------------------ public

    @property
    def instance(self) -> str | None:
        """The sidecar process whose stream is followed (None before the first snapshot)."""
        return self._instance

    @property
    def last_seq(self) -> int:
        return self._last

    def reachable(self) -> set[bytes]:
        """The chunk hashes some tier holds, as far as the stream says."""
        return set(self._chunks)

    def poll(self) -> list[tuple]:
        """Reads what arrived; returns the transitions since the last call (never waits)."""
        while True:
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            m = self._decode(frames[1:] if len(frames) == 3 else None)
            if m is not None:
                self.stats["messages"] += 1
                self._on_message(m)
        self._pump_request()
        out, self._out = self._out, []
        return out

    def close(self) -> None:
        self._sub.close(0)
        if self._dealer is not None:
            self._dealer.close(0)
            self._dealer = None

    # ------------------------------------------------------------------ messages

    def _decode(self, frames: list | None) -> tuple | None:
        try:
            if frames is None or len(frames[0]) != 8:
                raise ProtocolError("expected [topic, seq, payload]")
            seq = int.from_bytes(frames[0], "big")
            ts, events, instance = msgpack.unpackb(frames[1])[:3]
            return seq, str(instance), events
        except Exception as err:  # a message we cannot read: follow again from a snapshot
            self.stats["bad"] += 1
            _log.warning("kvtier events: unreadable message (%s); resynchronising", err)
            self._need_snapshot = True
            return None

    def _on_message(self, m: tuple) -> None:
        if self._request is not None or self._need_snapshot:
            self._hold(m)
            return
        seq, instance, events = m
        if instance in self._retired:
            return
        if instance != self._instance:
            self._need_snapshot = True
            self._hold(m)
            return
        if not events:  # heartbeat: the stream is at `seq`
            if seq > self._last:
                self._ask_replay()
            return
        if seq <= self._last:
            return
        if seq > self._last + 1:
            self._hold(m)
            self._ask_replay()
            return
        self._apply(events)
        self._last = seq

    def _hold(self, m: tuple) -> None:
        if len(self._held) >= self._max_held:
            self._held.clear()  # too far behind: the snapshot covers it
            self._need_snapshot = True
        self._held.append(m)

    # ------------------------------------------------------------------ replay and snapshot

    def _socket(self) -> zmq.Socket:
        if self._dealer is None:
            d = self._ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            if self._curve is not None:
                self._curve.apply(d)
            d.connect(self._replay_endpoint)
            self._dealer = d
        return self._dealer

    def _ask_replay(self) -> None:
        self._send("replay", [(self._last + 1).to_bytes(8, "big")])

    def _send(self, kind: str, frames: list[bytes]) -> None:
        if self._request is not None:
            return
        try:
            self._socket().send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:  # not connected yet: asked again at the next poll
            return
        self.stats["replays" if kind == "replay" else "snapshots"] += 1
        self._request = [kind, self._clock(), []]

    def _pump_request(self) -> None:
        if self._request is None and self._need_snapshot:
            self._send("snapshot", [b"snapshot", self._ns])
        req = self._request
        if req is None:
            return
        while self._dealer is not None:
            try:
                frames = self._dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 2:
                continue
            if frames[0] == END_SEQ:
                self._request = None
                self._finish(req[0], req[2], frames[1])
                return
            req[2].append(frames)
        if self._clock() - req[1] > self._timeout:
            # No answer (a restarted sidecar never answers the old request): a fresh socket, so
            # a late answer cannot be taken for the next one, and a snapshot.
            self.stats["timeouts"] += 1
            self._dealer.close(0)
            self._dealer = None
            self._request = None
            self._need_snapshot = True

    def _finish(self, kind: str, replies: list, end: bytes) -> None:
        try:
            if kind == "snapshot":
                self._finish_snapshot(replies, end)
            else:
                self._finish_replay(replies)
        except Exception as err:
            self.stats["bad"] += 1
            _log.warning("kvtier events: unreadable %s reply (%s); resynchronising", kind, err)
            self._need_snapshot = True
        held, self._held = self._held, []
        for m in held:
            self._on_message(m)

    def _finish_replay(self, replies: list) -> None:
        got = [self._decode([seq, payload]) for seq, payload in replies]
        first = got[0] if got else None
        if first is None or None in got or first[0] > self._last + 1 or first[1] != self._instance:
            # The window no longer holds the gap (or the sidecar restarted): a replay is asked
            # only for a gap, so an empty one is no answer either.
            self._need_snapshot = True
            return
        for seq, instance, events in got:
            if seq == self._last + 1 and instance == self._instance:
                if events:
                    self._apply(events)
                self._last = seq

    def _finish_snapshot(self, replies: list, end: bytes) -> None:
        tag, count, instance, seq = msgpack.unpackb(end)[:4]
        if tag != "end" or count != len(replies):
            raise ProtocolError(f"snapshot: {len(replies)} of {count} batches arrived")
        old = self._chunks
        self._chunks = {}
        stored: dict[bytes, str] = {}
        for frames in replies:
            _, _, events = self._decode(frames)
            for ev in events:
                if ev[0] != "stored" or bytes(ev[1]) != self._ns:
                    continue
                bit = self._bit(str(ev[2]), str(ev[3]))
                packed = bytes(ev[4])
                for i in range(0, len(packed), 32):
                    h = packed[i : i + 32]
                    self._chunks[h] = self._chunks.get(h, 0) | bit
                    stored.setdefault(h, str(ev[3]))
        for h in old:
            if h not in self._chunks:
                self._out.append(("removed", h))
        for h, medium in stored.items():
            if h not in old:
                self._out.append(("stored", h, medium))
        self._trim()
        if self._instance is not None and self._instance != str(instance):
            self._retired = (self._retired + [self._instance])[-8:]
        self._instance = str(instance)
        self._last = int(seq)
        self._need_snapshot = False
        # Held messages of another instance came before the restart the snapshot followed (a
        # later restart shows itself again with the next heartbeat).
        self._held = [m for m in self._held if m[1] == self._instance]

    # ------------------------------------------------------------------ state

    def _bit(self, tier: str, medium: str) -> int:
        bit = self._bits.get(tier)
        if bit is None:
            bit = self._bits[tier] = 1 << len(self._bits)
            self._media[bit] = medium
        return bit

    def _apply(self, events: list) -> None:
        chunks = self._chunks
        for ev in events:
            kind = ev[0]
            if kind == "cleared":
                covered = not ev[1] or any(bytes(n) == self._ns for n in ev[1])
                if covered:
                    chunks.clear()
                    self._out.append(("cleared",))
                continue
            if kind not in ("stored", "removed") or bytes(ev[1]) != self._ns:
                continue
            bit = self._bit(str(ev[2]), str(ev[3]))
            packed = bytes(ev[4])
            for i in range(0, len(packed), 32):
                h = packed[i : i + 32]
                had = chunks.get(h, 0)
                if kind == "stored":
                    if had == 0:
                        self._out.append(("stored", h, self._media[bit]))
                    chunks[h] = had | bit
                elif had:
                    left = had & ~bit
                    if left:
                        chunks[h] = left
                    else:
                        del chunks[h]
                        self._out.append(("removed", h))
        self._trim()

    def _trim(self) -> None:
        while len(self._chunks) > self._max_chunks:
            h = next(iter(self._chunks))
            del self._chunks[h]
            self._out.append(("removed", h))
