"""The kvtier client: one pyzmq DEALER socket, many requests in flight, replies matched by
request id (docs/protocol.md section 1).

Nothing here sleeps or blocks unless asked to (``Pending.wait``, ``poll(timeout_ms)``, the
blocking convenience methods). :meth:`KvtierClient.lookup` is the scheduler's non-blocking call:
``None`` while the answer is pending, the hit tokens once answered, ``0`` past the deadline (a
CANCEL is then sent) or for any answer that is not a usable hit (canceled, stale, an error, a
malformed reply). It polls the socket at most once per round over the pending lookups (one
"scheduler step"), so asking about 1,000 pending lookups costs one socket check, not 1,000.

The connection itself (sending, matching replies, deadlines, liveness, reconnects after a
refusal as unauthenticated) is :class:`~.transport.ClientTransport`; the per-message requests
(``send_<message>`` and the blocking ``<message>``) are
:class:`~.client_requests.RequestMethods`, generated from the message table; this module adds
the non-blocking lookups and the hooks the generated methods call.
"""

from __future__ import annotations

from typing import Any, Sequence

from . import protocol as P
from .client_requests import RequestMethods
from .errors import CapacityError, InvalidArgumentError, KvtierError, RequestTimeoutError
from .lookup_rule import MAX_KEPT_DETAILS, LookupDetails, admitted_tokens, lookup_wait_ms
from .multi_lookup import MultiLookupClient
from .pending import _PENDING, Pending
from .transport import _NOBLOCK, MAX_AUTH_RECONNECTS, ClientTransport, _Again

_encode_lookup = P.encode_lookup


def _await_config(pin: Any, prefetch: Any, await_chunks: Any, await_ms: Any) -> dict:
    """LOOKUP's config with ``awaitChunks``/``awaitMs`` (positive integers)."""
    for name, v in (("await_chunks", await_chunks), ("await_ms", await_ms)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidArgumentError(f"{name} must be a positive integer, got {v!r}")
    if not isinstance(pin, bool) or not isinstance(prefetch, bool):
        raise InvalidArgumentError("pin and prefetch must be booleans")
    out: dict = {k: False for k, on in (("pin", pin), ("prefetch", prefetch)) if not on}
    return {**out, "awaitChunks": await_chunks, "awaitMs": await_ms}
_LOOKUP = P.MsgType.LOOKUP
_LOOKUP_RESULT = int(P.MsgType.LOOKUP_RESULT)

__all__ = [
    "KvtierClient",
    "MultiLookupClient",
    "Pending",
    "MAX_AUTH_RECONNECTS",
    "LookupDetails",
    "admitted_tokens",
    "lookup_wait_ms",
]


class KvtierClient(ClientTransport, RequestMethods):
    """Client of one kvtier sidecar (scheduler and worker side alike).

    :param endpoint: the sidecar's ZMQ endpoint, e.g. ``tcp://127.0.0.1:5555``.
    :param lookup_timeout_ms: deadline of a :meth:`lookup`; past it the answer is 0 and a
        CANCEL is sent. Default 2000.
    :param request_timeout_ms: deadline of every other request (``RequestTimeoutError``).
        Default 10000.
    :param clock: monotonic clock in seconds the deadlines use (inject one in tests).
    :param context: the zmq context; default the process-wide instance.
    :param liveness_timeout_ms: silence with requests in flight after which a PING probes the
        sidecar, and the time that PING has to answer before the sidecar counts as down.
        Default 5000 (a sidecar whose event loop stalls for a second or two on a loaded host is
        not down; as the TypeScript clients).
    :param curve: CurveZMQ keys for a sidecar with authentication on (:func:`load_client_keys`);
        default none.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # lookup id -> its LOOKUP_RESULT once it arrives (None before), for lookups that named
        # the engine's prefill rate; then their LookupDetails until lookup_details takes them
        self._want: dict[str, Any] = {}
        self._details: dict[str, LookupDetails] = {}


    # ---------------------------------------------------------------------------------------
    # non-blocking lookups

    def lookup(
        self,
        lookup_id: str,
        hashes: Any,
        token_counts: Any,
        namespaces: Sequence[Any],
        pin: bool = True,
        prefetch: bool = True,
        compute_tokens_per_s: float | None = None,
        timeout_ms: float | None = None,
        await_chunks: int | None = None,
        await_ms: int | None = None,
    ) -> int | None:
        """Non-blocking lookup. The first call for ``lookup_id`` sends a LOOKUP and returns
        None; later calls return None while it is pending, then the hit tokens once (the next
        call starts a new lookup). Past the deadline: 0 and a CANCEL. Canceled, stale
        (including an epoch below the highest seen) and failed answers are 0. Bad arguments
        raise :class:`InvalidArgumentError`/:class:`TooLargeError` at once.

        ``compute_tokens_per_s``: the engine's prefill rate, tokens/s (a positive finite
        number), sent with the LOOKUP: the sidecar then claims a tier's hits only where fetching
        them beats computing them, and once this returns the number, :meth:`lookup_details` gives
        the whole answer (tiers, rates, decisions). ``timeout_ms``: a shorter deadline for this
        lookup (the smaller of it and ``lookup_timeout_ms`` applies; see :func:`lookup_wait_ms`).
        Both are read on the first call only.

        ``await_chunks`` and ``await_ms`` (disaggregated prefill, docs/fleet.md): the sidecar's
        answer waits up to ``await_ms`` for the first ``await_chunks`` chunks, whose save is still
        in flight on a producer; the deadline here grows by ``await_ms`` (still never blocking).
        """
        p = self._lookups.get(lookup_id)
        if p is None:
            if self._closed:
                return 0
            if self._down:
                self._drain()  # takes in a late answer and repeats the probe when due
                if self._down:
                    return 0
            rid = self._rid + 1
            if rid > 0xFFFF_FFFF or rid in self._pending:
                rid = self._next_id()
            else:
                self._rid = rid
            waits = await_chunks is not None and await_ms is not None and await_chunks > 0 and await_ms > 0
            frame = _encode_lookup(
                rid, lookup_id, namespaces, hashes, token_counts, pin, prefetch,
                config=_await_config(pin, prefetch, await_chunks, await_ms) if waits else None,
                compute_tokens_per_s=compute_tokens_per_s,
            )
            timeout_s = self.lookup_timeout_s + (await_ms / 1000.0 if waits else 0.0)
            if timeout_ms is not None:
                if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not timeout_ms > 0:
                    raise InvalidArgumentError(f"timeout_ms must be a positive number, got {timeout_ms!r}")
                timeout_s = min(timeout_s, timeout_ms / 1000.0)
            sock = self._sock
            try:
                sock.send(frame, _NOBLOCK)
            except _Again:
                self.last_lookup_error = CapacityError("send queue full: the sidecar is not taking messages")
                return 0
            self._details.pop(lookup_id, None)
            if compute_tokens_per_s is not None:
                self._want[lookup_id] = None
            p = Pending(self, rid, _LOOKUP, self._clock() + timeout_s, lookup_id)
            p._sock = sock
            if self._curve is not None:
                p._frame = frame  # for a resend after a refusal as unauthenticated
            p._seen = self._gen
            self._pending[rid] = p
            self._lookups[lookup_id] = p
            self._lookup_q.append(p)
            return None
        if p._state == _PENDING:
            # One socket check per round over the pending lookups: drain only when no drain
            # happened since this lookup was last asked about.
            if p._seen == self._gen:
                self._drain()
            p._seen = self._gen
            if p._state == _PENDING:
                if self._clock() < p.deadline:
                    return None
                self._pending.pop(p.request_id, None)
                p._resolve(0)
                self.last_lookup_error = RequestTimeoutError(
                    f"lookup {lookup_id!r} not answered within its deadline"
                )
                self._fire_cancel(lookup_id)
                if lookup_id in self._want:
                    self._want[lookup_id] = "timeout"
        del self._lookups[lookup_id]
        if lookup_id in self._want:
            self._keep_details(lookup_id, p._value, self._want.pop(lookup_id))
        return p._value

    def lookup_details(self, lookup_id: str) -> LookupDetails | None:
        """The whole answer behind the number :meth:`lookup` last returned for ``lookup_id``,
        once (it is forgotten when read, when a new lookup of the id starts, or by
        :meth:`forget`/:meth:`cancel`). None unless that lookup named ``compute_tokens_per_s``
        and :meth:`lookup` has returned its number. At most ``MAX_KEPT_DETAILS`` unread answers
        are kept (the oldest go first)."""
        return self._details.pop(lookup_id, None)

    def _keep_details(self, lookup_id: str, value: int, rep: Any) -> None:
        if isinstance(rep, P.LookupResult):
            status = rep.status
            if status == "ok" and value != rep.hit_tokens:
                status = "stale"  # an epoch below the highest this client saw
            d = LookupDetails(status, value, list(rep.tiers) if value else [], rep.bytes_per_token, rep.tier_rates)
        else:
            d = LookupDetails("timeout" if rep == "timeout" else "failed", 0, [], None, None)
        self._details[lookup_id] = d
        while len(self._details) > MAX_KEPT_DETAILS:
            del self._details[next(iter(self._details))]

    def _take(self, frame: bytes, sock: Any = None) -> None:
        # A LOOKUP_RESULT of a lookup that named the engine's rate is kept whole for
        # lookup_details; the transport resolves the lookup with its number as for any other.
        if self._want and len(frame) >= 8 and frame[3] == _LOOKUP_RESULT:
            p = self._pending.get(P.peek_request_id(frame))
            lookup_id = None if p is None else p.lookup_id
            if lookup_id is not None and lookup_id in self._want and self._lookups.get(lookup_id) is p:
                try:
                    self._want[lookup_id] = P.decode_reply(frame)[2]
                except KvtierError:
                    pass  # the transport counts it as malformed; the lookup answers 0
        super()._take(frame, sock)

    def forget(self, lookup_id: str) -> None:
        """Drops a lookup this client tracks (pending or answered but not yet read) and sends a
        CANCEL so the server stops its prefetch and releases its pins. Unknown ids: nothing."""
        self._want.pop(lookup_id, None)
        self._details.pop(lookup_id, None)
        p = self._lookups.pop(lookup_id, None)
        if p is None:
            return
        if p._state == _PENDING:
            self._pending.pop(p.request_id, None)
            p._resolve(0)
        self._fire_cancel(lookup_id)

    def cancel(self, lookup_id: str) -> None:
        """Fire-and-forget CANCEL (cleanup when a request finishes or is aborted); the reply is
        ignored. Also drops the lookup's local state."""
        self._want.pop(lookup_id, None)
        self._details.pop(lookup_id, None)
        self._drop_lookup(lookup_id)
        P.encode_cancel(0, lookup_id)  # validates the id before anything is sent
        self._fire_cancel(lookup_id)

    # ---------------------------------------------------------------------------------------
    # other requests: send_X(...) -> Pending and X(...) = send_X(...).wait() are generated from
    # the message table (RequestMethods); these are the hooks they call

    def _drop_lookup(self, lookup_id: str) -> None:
        """Resolves a pending lookup of ``lookup_id`` as 0 and forgets it (before a CANCEL)."""
        p = self._lookups.pop(lookup_id, None)
        if p is not None and p._state == _PENDING:
            self._pending.pop(p.request_id, None)
            p._resolve(0)

    def _load_timeout_s(self, deadline_ms: Any) -> float:
        """How long a LOAD's answer is awaited: the server answers by the LOAD's deadline (its
        own default, 20 s, for 0), so a little longer than that."""
        try:
            server_ms = deadline_ms if deadline_ms > 0 else 20_000
        except TypeError:
            server_ms = 20_000  # not a number: the encoder refuses it
        return max(self.request_timeout_s, server_ms / 1000.0 + 5.0)

    def send_frame(self, msg_type: int, body: bytes = b"", timeout_ms: float | None = None) -> Pending:
        """Sends a request of ``msg_type`` with a raw ``body`` (header added), unchecked: for
        tools and tests that must send what the encoders refuse."""
        return self._start(
            msg_type,
            lambda rid: P.encode_header(msg_type, rid) + bytes(body),
            None if timeout_ms is None else timeout_ms / 1000.0,
        )
