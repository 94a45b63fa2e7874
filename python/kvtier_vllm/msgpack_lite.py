"""The subset of MessagePack the sidecar's event stream writes (docs/events.md): nil, booleans,
integers, float32/64, str, bin, arrays and maps. Decoding only; the package depends on pyzmq alone.
"""

from __future__ import annotations

import struct
from typing import Any

from .errors import ProtocolError

__all__ = ["unpackb"]

_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> int:
        at = self.pos
        if at + n > len(self.buf):
            raise ProtocolError(f"msgpack: truncated at byte {at}")
        self.pos = at + n
        return at

    def uint(self, n: int) -> int:
        at = self.take(n)
        return int.from_bytes(self.buf[at : at + n], "big")

    def sint(self, n: int) -> int:
        at = self.take(n)
        return int.from_bytes(self.buf[at : at + n], "big", signed=True)

    def raw(self, n: int) -> bytes:
        at = self.take(n)
        return bytes(self.buf[at : at + n])


def _read(r: _Reader, depth: int) -> Any:
    if depth > 64:
        raise ProtocolError("msgpack: nested deeper than 64")
    b = r.buf[r.take(1)]
    if b < 0x80:
        return b
    if b >= 0xE0:
        return b - 0x100
    if 0xA0 <= b <= 0xBF:
        return r.raw(b & 0x1F).decode("utf-8")
    if 0x90 <= b <= 0x9F:
        return [_read(r, depth + 1) for _ in range(b & 0x0F)]
    if 0x80 <= b <= 0x8F:
        return _map(r, b & 0x0F, depth)
    if b == 0xC0:
        return None
    if b == 0xC2:
        return False
    if b == 0xC3:
        return True
    if b in (0xC4, 0xC5, 0xC6):
        return r.raw(r.uint(1 << (b - 0xC4)))
    if b == 0xCA:
        return _F32.unpack_from(r.buf, r.take(4))[0]
    if b == 0xCB:
        return _F64.unpack_from(r.buf, r.take(8))[0]
    if 0xCC <= b <= 0xCF:
        return r.uint(1 << (b - 0xCC))
    if 0xD0 <= b <= 0xD3:
        return r.sint(1 << (b - 0xD0))
    if b in (0xD9, 0xDA, 0xDB):
        return r.raw(r.uint(1 << (b - 0xD9))).decode("utf-8")
    if b in (0xDC, 0xDD):
        n = r.uint(2 if b == 0xDC else 4)
        if n > len(r.buf) - r.pos:
            raise ProtocolError("msgpack: truncated array")
        return [_read(r, depth + 1) for _ in range(n)]
    if b in (0xDE, 0xDF):
        return _map(r, r.uint(2 if b == 0xDE else 4), depth)
    raise ProtocolError(f"msgpack: type byte 0x{b:02x} not supported")


def _map(r: _Reader, n: int, depth: int) -> dict:
    if n > len(r.buf) - r.pos:
        raise ProtocolError("msgpack: truncated map")
    out = {}
    for _ in range(n):
        k = _read(r, depth + 1)
        out[k] = _read(r, depth + 1)
    return out


def unpackb(data: bytes) -> Any:
    """Decodes one value that fills ``data`` exactly.

    :raises ProtocolError: on truncated or trailing bytes or an unsupported type (ext).
    """
    r = _Reader(bytes(data))
    v = _read(r, 0)
    if r.pos != len(r.buf):
        raise ProtocolError(f"msgpack: {len(r.buf) - r.pos} trailing bytes")
    return v
