"""Errors with the stable codes of docs/protocol.md section 5.

Every failure the package raises on purpose is a :class:`KvtierError` with a ``code``
(``'KVT_...'``); there is one subclass per code, so callers can branch on ``code`` or on the
class, never on the message text.
"""

from __future__ import annotations

__all__ = [
    "KvtierError",
    "ProtocolError",
    "TooLargeError",
    "InvalidArgumentError",
    "CapacityError",
    "ClosedError",
    "InternalError",
    "BackendError",
    "CorruptError",
    "UnknownNamespaceError",
    "NotFoundError",
    "RequestTimeoutError",
    "AbortedError",
    "ConfigError",
    "UnauthenticatedError",
    "ForbiddenError",
    "ERROR_CODES",
    "error_for_code",
]


class KvtierError(Exception):
    """Base of every kvtier error; ``code`` is the stable code, ``message`` the text for people."""

    code = "KVT_INTERNAL"

    def __init__(self, message: str = "", code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code

    def __reduce__(self):  # picklable across processes with its code
        return (type(self), (self.message, self.code))


class ProtocolError(KvtierError):
    """Malformed frame: truncated field, trailing bytes, bad magic/version/type, bad UTF-8 or JSON."""

    code = "KVT_PROTOCOL"


class TooLargeError(KvtierError):
    """A declared size over a limit."""

    code = "KVT_TOO_LARGE"


class InvalidArgumentError(KvtierError):
    """Well-formed but invalid values."""

    code = "KVT_INVALID_ARGUMENT"


class CapacityError(KvtierError):
    """The server tracks its maximum number of running lookups, or its lookup memory bound
    (``storage.maxLookupBytes``) is taken by lookups in flight and pinned; the non-blocking
    ``lookup()`` answers 0 for it (recompute)."""

    code = "KVT_CAPACITY"


class ClosedError(KvtierError):
    """The server (or this client) is shutting down or closed."""

    code = "KVT_CLOSED"


class InternalError(KvtierError):
    """An unexpected failure; also what an unknown error code maps to."""

    code = "KVT_INTERNAL"


class BackendError(KvtierError):
    """A copy out of the engine's KV cache failed (SAVE)."""

    code = "KVT_BACKEND"


class CorruptError(KvtierError):
    """Reserved: corrupt stored data."""

    code = "KVT_CORRUPT"


class UnknownNamespaceError(KvtierError):
    """Reserved."""

    code = "KVT_UNKNOWN_NAMESPACE"


class NotFoundError(KvtierError):
    """A data-plane message names an engine without a registration."""

    code = "KVT_NOT_FOUND"


class RequestTimeoutError(KvtierError):
    """No reply within the client's deadline (client side; never sent by the server)."""

    code = "KVT_TIMEOUT"


class AbortedError(KvtierError):
    """The caller gave the request up (client side)."""

    code = "KVT_ABORTED"


class ConfigError(KvtierError):
    """Invalid configuration (or a ``cuda`` registration on a server without CUDA)."""

    code = "KVT_CONFIG"


class UnauthenticatedError(KvtierError):
    """The connection carries no identity the server issued (CurveZMQ on, see docs/security.md)."""

    code = "KVT_UNAUTHENTICATED"


class ForbiddenError(KvtierError):
    """The client's key may not send this message, or not for this namespace; nothing changed."""

    code = "KVT_FORBIDDEN"


#: Code -> exception class, for every code of protocol v1.
ERROR_CODES: dict[str, type[KvtierError]] = {
    cls.code: cls
    for cls in (
        ProtocolError,
        TooLargeError,
        InvalidArgumentError,
        CapacityError,
        ClosedError,
        InternalError,
        BackendError,
        CorruptError,
        UnknownNamespaceError,
        NotFoundError,
        RequestTimeoutError,
        AbortedError,
        ConfigError,
        UnauthenticatedError,
        ForbiddenError,
    )
}


def error_for_code(code: str, message: str = "") -> KvtierError:
    """The exception for a wire error code. A code this client does not know becomes
    :class:`InternalError` (``KVT_INTERNAL``), with the original code kept in the message."""
    cls = ERROR_CODES.get(code)
    if cls is None:
        return InternalError(f"unknown error code {code!r}: {message}" if message else f"unknown error code {code!r}")
    return cls(message)
