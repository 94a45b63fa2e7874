"""One request in flight on a kvtier client (:class:`Pending`)."""

from __future__ import annotations

from typing import Any, Protocol

from .errors import KvtierError

__all__ = ["Pending"]

_PENDING, _OK, _FAILED = 0, 1, 2


class _Owner(Protocol):
    """What a :class:`Pending` needs of the transport that sent it (``ClientTransport``): taking
    in replies, and waiting on its socket for one request."""

    def poll(self) -> Any: ...

    def _wait_for(self, pending: "Pending", timeout_ms: float | None) -> None: ...


class Pending:
    """One request in flight. ``done`` once answered, failed or expired; ``result()`` returns
    the reply object (a dict for PING/STATS) or raises its :class:`KvtierError`."""

    __slots__ = (
        "_client", "request_id", "msg_type", "deadline", "lookup_id", "_state", "_value", "_seen",
        "_frame", "_sock", "_resends",
    )

    def __init__(self, client: _Owner, request_id: int, msg_type: int, deadline: float, lookup_id: str | None = None) -> None:
        self._client = client
        self.request_id = request_id
        self.msg_type = msg_type
        self.deadline = deadline
        self.lookup_id = lookup_id
        self._state = _PENDING
        self._value: Any = None
        self._seen = -1
        # for a resend after a refusal as unauthenticated (kept only with Curve keys)
        self._frame: bytes | None = None
        self._sock: zmq.Socket | None = None
        self._resends = 0

    @property
    def done(self) -> bool:
        """True once the reply came, or the request failed or expired. Never blocks; call
        ``client.poll()`` (or :meth:`wait`) to take in replies."""
        return self._state != _PENDING

    def result(self) -> Any:
        """The reply object, or raises the request's :class:`KvtierError` (the server's error
        mapped to its class, ``RequestTimeoutError`` past the deadline, ``ClosedError`` after
        close). Takes in waiting replies first; raises ``RuntimeError`` if still pending."""
        if self._state == _PENDING:
            self._client.poll()
            if self._state == _PENDING:
                raise RuntimeError(f"request {self.request_id} is still pending; use wait()")
        if self._state == _FAILED:
            raise self._value
        return self._value

    def exception(self) -> KvtierError | None:
        """The error of a failed request, None when it succeeded or is pending."""
        return self._value if self._state == _FAILED else None

    def wait(self, timeout_ms: float | None = None) -> Any:
        """Blocks on the socket until this request is done, then returns :meth:`result`.
        Without ``timeout_ms`` it waits up to the request's own deadline (then
        ``RequestTimeoutError``); with it, at most that long (``RequestTimeoutError`` too, but
        the request stays pending)."""
        self._client._wait_for(self, timeout_ms)
        return self.result()

    # completion (client internal)
    def _resolve(self, value: Any) -> None:
        self._state = _OK
        self._value = value

    def _fail(self, err: KvtierError) -> None:
        self._state = _FAILED
        self._value = err

    def __repr__(self) -> str:
        state = ("pending", "done", "failed")[self._state]
        return f"<Pending #{self.request_id} type=0x{self.msg_type:02x} {state}>"
