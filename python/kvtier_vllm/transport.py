"""The connection under a kvtier client: one pyzmq DEALER socket, requests in flight matched
by request id, deadlines, liveness and reconnects (:class:`ClientTransport`, the base of
:class:`~.client.KvtierClient`).

The DEALER reconnects on its own when the sidecar restarts; requests lost with the old process
run into their deadlines, and later requests go to the new process.

Liveness: while requests are in flight and nothing has been heard from the sidecar for
``liveness_timeout_ms``, the client sends a PING. If that PING is not answered within
``liveness_timeout_ms`` too, the sidecar is treated as down: every request in flight fails at
once (lookups answer 0, the others ``RequestTimeoutError``) and new lookups answer 0 without
waiting, so a dead sidecar costs the engine one detection delay, not a deadline per request.
A PING is repeated every ``liveness_timeout_ms`` while down; the first frame heard from the
sidecar ends it. Going down also replaces the socket, so nothing queued for the old connection
(a SAVE given up on, whose blocks the engine may reuse) can reach a sidecar later. A client
object belongs to one thread (zmq sockets are not thread-safe).

With CurveZMQ keys, a request refused with ``KVT_UNAUTHENTICATED`` (its connection carries no
identity the sidecar minted, docs/security.md; the sidecar did nothing with it) is sent again on
a fresh socket, i.e. a new connection and handshake. The refused socket is kept (and drained)
until the replies to the other requests sent on it are in; each of those is sent again only if
it was refused too. At most ``MAX_AUTH_RECONNECTS`` fresh sockets in a row (any other reply on
the current socket starts the count again) and as many resends of one request; past that the
refusal is surfaced (``UnauthenticatedError``) and the count starts again. Without keys it is
surfaced at once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable

import zmq

from . import protocol as P
from .curve import CurveKeys
from .errors import (
    CapacityError,
    ClosedError,
    InvalidArgumentError,
    KvtierError,
    ProtocolError,
    RequestTimeoutError,
    error_for_code,
)
from .pending import _FAILED, _PENDING, Pending
from .protocol_table import MESSAGES

__all__ = ["ClientTransport", "MAX_AUTH_RECONNECTS"]

_log = logging.getLogger("kvtier_vllm.client")
#: Endpoints whose malformed answers this process has logged (until one answers well again).
_MALFORMED_LOGGED: set[str] = set()

#: Fresh sockets opened in a row after refusals as unauthenticated, and resends of one request,
#: before the refusal is surfaced (see the module docstring).
MAX_AUTH_RECONNECTS = 3
_UNAUTHENTICATED = "KVT_UNAUTHENTICATED"

# plain ints: `int & zmq.POLLIN` would go through the IntFlag's Python-level __and__
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_RCVMORE = int(zmq.RCVMORE)
_RCVTIMEO = int(zmq.RCVTIMEO)
_Again = zmq.Again
_LOOKUP_RESULT = P.MsgType.LOOKUP_RESULT
_ERROR = P.MsgType.ERROR
_CLEAR_RESULT = P.MsgType.CLEAR_RESULT
#: reply type code -> its one field, a JSON object, which a request's Pending resolves to (PONG's
#: ``info``, STATS_RESULT's ``stats``); other replies resolve to their record
_OBJECT_REPLIES = {
    spec["code"]: spec["fields"][0]["key"]
    for spec in MESSAGES.values()
    if spec["dir"] == "reply" and len(spec["fields"]) == 1 and spec["fields"][0]["kind"] == "json"
}


class ClientTransport:
    """The connection to one kvtier sidecar: its socket, the requests in flight, their
    deadlines, liveness. :class:`~.client.KvtierClient` documents the parameters."""

    def __init__(
        self,
        endpoint: str,
        lookup_timeout_ms: float = 2000,
        request_timeout_ms: float = 10000,
        clock: Callable[[], float] = time.monotonic,
        context: zmq.Context | None = None,
        liveness_timeout_ms: float = 5000,
        curve: CurveKeys | None = None,
    ) -> None:
        if not isinstance(endpoint, str) or endpoint == "":
            raise InvalidArgumentError("endpoint must be a non-empty string")
        for name, v in (
            ("lookup_timeout_ms", lookup_timeout_ms),
            ("request_timeout_ms", request_timeout_ms),
            ("liveness_timeout_ms", liveness_timeout_ms),
        ):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise InvalidArgumentError(f"{name} must be a positive number, got {v!r}")
        self.endpoint = endpoint
        self.lookup_timeout_s = lookup_timeout_ms / 1000.0
        self.request_timeout_s = request_timeout_ms / 1000.0
        self.liveness_timeout_s = liveness_timeout_ms / 1000.0
        self._clock = clock
        self._ctx = context if context is not None else zmq.Context.instance()
        self._curve = curve
        self._sock = self._open_socket()
        # sockets replaced after a refusal as unauthenticated, drained until nothing waits on them
        self._retired: list[zmq.Socket] = []
        self._auth_in_a_row = 0
        #: Fresh sockets opened because the sidecar refused a request as unauthenticated.
        self.auth_reconnects = 0
        self._rid = 0
        self._pending: dict[int, Pending] = {}
        self._lookups: dict[str, Pending] = {}
        self._lookup_q: deque[Pending] = deque()
        self._request_q: deque[Pending] = deque()
        self._gen = 0
        self._closed = False
        #: Highest epoch seen in a LOOKUP_RESULT or CLEAR_RESULT from this server.
        self.max_epoch = 0
        #: The last error a lookup() swallowed (answered 0 instead), for diagnostics.
        self.last_lookup_error: KvtierError | None = None
        #: Replies that matched no request in flight (late, or for fire-and-forget CANCELs).
        self.unmatched_replies = 0
        #: Frames that could not be decoded.
        self.malformed_replies = 0
        self._malformed_logged = False
        # liveness (see the module docstring)
        self._heard_at = clock()
        self._probe: Pending | None = None
        self._next_probe_at = 0.0
        self._down = False
        #: Times the sidecar was found down (a liveness PING went unanswered).
        self.outages = 0

    # ---------------------------------------------------------------------------------------
    # plumbing

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def reachable(self) -> bool:
        """False from an unanswered liveness PING until the sidecar is heard from again."""
        return not self._down

    @property
    def pending_requests(self) -> int:
        """Requests waiting for a reply (lookups included)."""
        return len(self._pending)

    @property
    def socket(self) -> zmq.Socket:
        """The DEALER socket (e.g. to poll it together with others); do not recv from it. It is
        replaced when the sidecar is found down or refuses it as unauthenticated, so ask for it
        again after an outage."""
        return self._sock

    def _open_socket(self) -> zmq.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        if self._curve is not None:
            self._curve.apply(sock)
        sock.connect(self.endpoint)
        self._rcvtimeo = -1  # the socket's RCVTIMEO, set when a poll first blocks on it
        return sock

    def _next_id(self) -> int:
        rid = self._rid
        pending = self._pending
        while True:
            rid = rid + 1 if rid < 0xFFFF_FFFF else 1  # 1..2^32-1, never 0
            if rid not in pending:
                self._rid = rid
                return rid

    def _send(self, frame: bytes) -> bool:
        try:
            self._sock.send(frame, _NOBLOCK)
            return True
        except _Again:
            return False

    def _start(self, msg_type: int, build: Callable[[int], bytes], timeout_s: float | None = None) -> Pending:
        if self._closed:
            p = Pending(self, 0, msg_type, 0.0)
            p._fail(ClosedError("client is closed"))
            return p
        rid = self._next_id()
        frame = build(rid)
        deadline = self._clock() + (self.request_timeout_s if timeout_s is None else timeout_s)
        p = Pending(self, rid, msg_type, deadline)
        if not self._send(frame):
            p._fail(CapacityError("send queue full: the sidecar is not taking messages"))
            return p
        self._track(p, frame)
        self._pending[rid] = p
        self._request_q.append(p)
        return p

    def _track(self, p: Pending, frame: bytes) -> None:
        p._sock = self._sock
        if self._curve is not None:
            p._frame = frame

    def _fire_cancel(self, lookup_id: str) -> None:
        if self._closed:
            return
        try:
            self._send(P.encode_cancel(self._next_id(), lookup_id))
        except KvtierError:
            pass

    def _take(self, frame: bytes, sock: zmq.Socket | None = None) -> None:
        try:
            msg_type, rid, rep = P.decode_reply(frame)
        except KvtierError as err:
            self.malformed_replies += 1
            if not self._malformed_logged and self.endpoint not in _MALFORMED_LOGGED:
                # Once per process until the sidecar answers well again: not a line per lookup.
                self._malformed_logged = True
                _MALFORMED_LOGGED.add(self.endpoint)
                _log.error(
                    "the sidecar at %s answered with something that is not kvtier protocol v1 (%s); "
                    "its lookups count as misses and its loads and saves fail until it answers well",
                    self.endpoint, err,
                )
            p = self._pending.pop(P.peek_request_id(frame), None)
            if p is not None:
                self._complete_error(p, err if isinstance(err, ProtocolError) else ProtocolError(str(err)))
            return
        if self._malformed_logged:
            self._malformed_logged = False
            _MALFORMED_LOGGED.discard(self.endpoint)
        if msg_type == _LOOKUP_RESULT or msg_type == _CLEAR_RESULT:
            if rep.epoch > self.max_epoch:
                self.max_epoch = rep.epoch
        p = self._pending.pop(rid, None)
        if p is None:
            self.unmatched_replies += 1
            return
        if sock is None:
            sock = self._sock
        if msg_type == _ERROR and rep.code == _UNAUTHENTICATED and self._resend(p, sock):
            return
        if sock is self._sock:
            self._auth_in_a_row = 0
        if msg_type == _ERROR:
            self._complete_error(p, error_for_code(rep.code, rep.message))
        elif msg_type != p.msg_type | 0x80:
            self._complete_error(p, ProtocolError(f"reply type 0x{msg_type:02x} to a request of type 0x{p.msg_type:02x}"))
        elif p.lookup_id is not None:
            # epoch rule: an answer computed before a clear this client knows of is stale
            if rep.status == "ok" and rep.epoch >= self.max_epoch:
                p._resolve(rep.hit_tokens)
            else:
                p._resolve(0)
        else:
            key = _OBJECT_REPLIES.get(msg_type)
            p._resolve(rep if key is None else getattr(rep, key))

    def _resend(self, p: Pending, sock: zmq.Socket) -> bool:
        """Sends ``p``, refused as unauthenticated on ``sock``, again on a fresh socket (opened
        here when ``sock`` is still the current one). False when the refusal is to be surfaced."""
        if self._curve is None or self._closed or p._frame is None:
            return False
        if p._resends >= MAX_AUTH_RECONNECTS or (
            sock is self._sock and self._auth_in_a_row >= MAX_AUTH_RECONNECTS
        ):
            self._auth_in_a_row = 0  # surfaced; the next refusal may try fresh sockets again
            return False
        if sock is self._sock:
            self._auth_in_a_row += 1
            self.auth_reconnects += 1
            _log.warning(
                "request refused as unauthenticated by %s; reconnecting (%d in a row)",
                self.endpoint,
                self._auth_in_a_row,
            )
            self._retired.append(sock)
            self._sock = self._open_socket()
        p._resends += 1
        p._sock = self._sock
        if self._send(p._frame):
            self._pending[p.request_id] = p
        else:
            self._complete_error(p, CapacityError("send queue full: the sidecar is not taking messages"))
        return True

    def _drain_retired(self) -> int:
        """Takes in the replies waiting on replaced sockets and closes those nothing waits on."""
        n = 0
        for sock in list(self._retired):
            while sock.get(_EVENTS) & _POLLIN:
                try:
                    frame = sock.recv(_NOBLOCK)
                except _Again:
                    break
                while sock.get(_RCVMORE):
                    frame = sock.recv()
                self._take(frame, sock)
                n += 1
        waited_on = {id(p._sock) for p in self._pending.values()}
        for sock in list(self._retired):
            if id(sock) not in waited_on:
                sock.close(linger=0)
                self._retired.remove(sock)
        return n

    def _close_retired(self) -> None:
        for sock in self._retired:
            sock.close(linger=0)
        self._retired.clear()

    def _wait_reply(self, timeout_ms: float) -> Any:
        """Waits up to ``timeout_ms`` for a reply: the first frame received when only the current
        socket is open (a blocking recv, no poller), else True when one of the sockets is
        readable; None on timeout."""
        if self._retired:
            return True if self._poll_sockets(timeout_ms) else None
        sock = self._sock
        t = min(int(timeout_ms), 0x7FFF_FFFF)  # RCVTIMEO is a C int of milliseconds
        if t != self._rcvtimeo:
            sock.setsockopt(_RCVTIMEO, t)
            self._rcvtimeo = t
        try:
            frame = sock.recv()
        except _Again:
            return None
        while sock.get(_RCVMORE):  # the last frame is the message
            frame = sock.recv(_NOBLOCK)
        return frame

    def _poll_sockets(self, timeout_ms: float) -> bool:
        """Waits up to ``timeout_ms`` for a reply on the socket or a replaced one."""
        poller = zmq.Poller()
        for sock in (self._sock, *self._retired):
            poller.register(sock, _POLLIN)
        return bool(poller.poll(timeout_ms))

    def _complete_error(self, p: Pending, err: KvtierError) -> None:
        if p.lookup_id is not None:
            self.last_lookup_error = err
            p._resolve(0)
        else:
            p._fail(err)

    def _drain(self, first: Any = None) -> int:
        """Takes in every reply waiting on the socket, without blocking (``first``: a frame just
        received from it, taken in first)."""
        self._gen += 1
        sock = self._sock
        n = 0
        if first is not None:
            self._take(first, sock)
            n = 1
        # With nothing left in flight, a frame still queued could only be a late or unmatched
        # reply: it is taken in by the next drain, so the option read (a system call) is saved
        # on the one-request-at-a-time path.
        if (first is None or self._pending) and sock.get(_EVENTS) & _POLLIN:
            while True:
                try:
                    frame = sock.recv(_NOBLOCK)
                except _Again:
                    break
                while sock.get(_RCVMORE):  # the last frame is the message
                    frame = sock.recv()
                self._take(frame, sock)
                n += 1
                # one option read is cheaper than ending on a zmq.Again exception
                if not sock.get(_EVENTS) & _POLLIN:
                    break
        if self._retired:
            n += self._drain_retired()
        now = self._clock()
        if n:
            self._heard_at = now
            self._down = False
        if self._pending or self._down:
            self._liveness(now)
        return n

    def _liveness(self, now: float) -> None:
        """Probes a silent sidecar with a PING; an unanswered probe marks it down."""
        probe = self._probe
        if probe is not None:
            if probe._state == _PENDING:
                if now < probe.deadline:
                    return
                self._pending.pop(probe.request_id, None)
                probe._fail(RequestTimeoutError("liveness PING not answered"))
            self._probe = None
            if probe._state == _FAILED and not self._closed:
                self._mark_down()
                return
        if now - self._heard_at >= self.liveness_timeout_s and now >= self._next_probe_at and not self._closed:
            self._next_probe_at = now + self.liveness_timeout_s
            self._probe = self._start(P.MsgType.PING, P.encode_ping, self.liveness_timeout_s)

    def _mark_down(self) -> None:
        if not self._down:
            self.outages += 1
        self._down = True
        err = RequestTimeoutError(
            f"sidecar {self.endpoint} did not answer a PING within "
            f"{self.liveness_timeout_s * 1000:g} ms: treated as down until it answers"
        )
        self.last_lookup_error = err
        pending = list(self._pending.values())
        self._pending.clear()
        for p in pending:
            if p.lookup_id is not None:
                p._resolve(0)
            else:
                p._fail(err)
        # A new socket: what the old one still queued for the sidecar (a SAVE the worker has
        # now given up on, whose blocks the engine may reuse) must never reach it later.
        self._sock.close(linger=0)
        self._close_retired()
        self._sock = self._open_socket()

    def _expire(self, now: float) -> None:
        q = self._lookup_q
        while q and q[0].deadline <= now:
            p = q.popleft()
            if p._state == _PENDING:
                self._pending.pop(p.request_id, None)
                p._resolve(0)
                self.last_lookup_error = RequestTimeoutError(
                    f"lookup {p.lookup_id!r} not answered within {self.lookup_timeout_s * 1000:g} ms"
                )
                self._fire_cancel(p.lookup_id)  # stop the prefetch, release pins
        q = self._request_q
        while q and q[0].deadline <= now:
            p = q.popleft()
            if p._state == _PENDING:
                self._pending.pop(p.request_id, None)
                p._fail(RequestTimeoutError(f"no reply to request #{p.request_id} (type 0x{p.msg_type:02x}) within the deadline"))

    def poll(self, timeout_ms: float = 0) -> int:
        """Takes in waiting replies and expires deadlines; returns the replies taken. With
        ``timeout_ms`` > 0 it first waits up to that long for one to arrive."""
        if self._closed:
            return 0
        if timeout_ms > 0:
            got = self._wait_reply(timeout_ms)
            if got is not None:
                n = self._drain(None if got is True else got)
            else:
                self._gen += 1  # the socket was checked: lookups need not check it again
                n = 0
                if self._pending or self._down:
                    self._liveness(self._clock())
        else:
            n = self._drain()
        self._expire(self._clock())
        return n

    def _wait_for(self, p: Pending, timeout_ms: float | None) -> None:
        clock = self._clock
        limit = None if timeout_ms is None else clock() + timeout_ms / 1000.0
        while p._state == _PENDING and not self._closed:
            now = clock()
            self._expire(now)
            if p._state != _PENDING:
                return
            end = p.deadline if limit is None else min(limit, p.deadline)
            left_ms = (end - now) * 1000.0
            if left_ms <= 0:
                if limit is not None and limit <= now:
                    raise RequestTimeoutError(f"request #{p.request_id} still pending after {timeout_ms} ms")
                continue
            got = self._wait_reply(max(1, int(left_ms) + 1))
            if got is not None:
                self._drain(None if got is True else got)

    # ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Fails every request in flight with ``ClosedError`` (pending lookups answer 0) and
        closes the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        err = ClosedError("client closed")
        for p in self._pending.values():
            if p.lookup_id is not None:
                p._resolve(0)
            else:
                p._fail(err)
        self._pending.clear()
        self._lookups.clear()
        self._lookup_q.clear()
        self._request_q.clear()
        self._sock.close(linger=0)
        self._close_retired()

    def __enter__(self) -> "ClientTransport":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            if not self._closed:
                self._sock.close(linger=0)
        except Exception:
            pass
