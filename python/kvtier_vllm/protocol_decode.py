"""Protocol v1 reply decoding (docs/protocol.md), re-exported by :mod:`.protocol`, driven by
the generated message table (:mod:`.protocol_table`): each reply's fields are read in its
order, by kind.

:func:`decode_reply` decodes one reply frame strictly: a short frame, another magic or version,
an unknown type, a truncated field, bytes after the last field, invalid UTF-8 or malformed JSON
raise :class:`~kvtier_vllm.errors.ProtocolError`; a string declared longer than its limit raises
:class:`~kvtier_vllm.errors.TooLargeError`. An ERROR reply decodes to :class:`ErrorReply` (an
unknown code reads as ``KVT_INTERNAL``); it is returned, not raised.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from .errors import ERROR_CODES, InvalidArgumentError, ProtocolError, TooLargeError
from . import protocol_table as _T
from .protocol_table import MESSAGES, REPLY_CLASSES, LookupResult, MsgType, Reply, TierTokens
from .protocol_types import HEADER_BYTES, MAGIC, VERSION

_HEADER = struct.Struct("<HBBI")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_LOOKUP_RESULT = MsgType.LOOKUP_RESULT
_ERRORS = {"KVT_PROTOCOL": ProtocolError, "KVT_INVALID_ARGUMENT": InvalidArgumentError}


class _Reader:
    __slots__ = ("buf", "off")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.off = HEADER_BYTES

    def need(self, n: int, what: str) -> None:
        if self.off + n > len(self.buf):
            raise ProtocolError(
                f"truncated message: {what} needs {n} bytes at offset {self.off}, "
                f"{len(self.buf) - self.off} left"
            )

    def u8(self, what: str) -> int:
        self.need(1, what)
        v = self.buf[self.off]
        self.off += 1
        return v

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.off)
        self.off += 4
        return v

    def str(self, what: str, limit: int) -> str:
        self.need(2, what)
        (n,) = _U16.unpack_from(self.buf, self.off)
        if n > limit:
            raise TooLargeError(f"{what} is {n} bytes, the limit is {limit}")
        self.off += 2
        self.need(n, what)
        try:
            s = self.buf[self.off : self.off + n].decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(f"{what} at offset {self.off} is not valid UTF-8") from None
        self.off += n
        return s

    def bytes(self, n: int, what: str) -> bytes:
        self.need(n, what)
        b = self.buf[self.off : self.off + n]
        self.off += n
        return b

    def end(self, what: str) -> None:
        if self.off != len(self.buf):
            raise ProtocolError(
                f"{len(self.buf) - self.off} unexpected trailing bytes after {what}"
            )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json(r: _Reader, f: dict) -> dict:
    n = r.u32(f"{f['label']} length")
    raw = r.bytes(n, f["label"])
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(f"{f['label']} is not valid UTF-8 JSON") from None
    return obj if isinstance(obj, dict) else {}


def _enum(r: _Reader, f: dict) -> str:
    code = r.u8(f["label"])
    names = f["names"]
    if code >= len(names):
        allowed = ", ".join(f"{i} ({n})" for i, n in enumerate(names))
        raise _ERRORS[f["unknown"]](f"unknown {f['label']} {code}; allowed {allowed}")
    return names[code]


def _u32s(r: _Reader, f: dict) -> list:
    n = r.u32(f"{f['label']} count")
    r.need(4 * n, f["label"])
    ids = list(struct.unpack_from(f"<{n}I", r.buf, r.off)) if n else []
    r.off += 4 * n
    return ids


def _blob(r: _Reader, f: dict) -> bytes:
    return r.bytes(r.u32(f"{f['label']} length"), f["label"])


def _i32(r: _Reader, f: dict) -> int:
    r.need(4, f["label"])
    (v,) = _I32.unpack_from(r.buf, r.off)
    r.off += 4
    return v


def _u64(r: _Reader, f: dict) -> int:
    r.need(8, f["label"])
    (v,) = _U64.unpack_from(r.buf, r.off)
    r.off += 8
    return v


def _list(r: _Reader, f: dict) -> list:
    n = r.u8(f"{f['label']} count")
    record = getattr(_T, f["record"])
    return [record(*_fields(r, f["of"])) for _ in range(n)]


def _fixed_bytes(r: "_Reader", f: dict) -> bytes | None:
    """Exactly ``size`` bytes; an optional field written as zeros (absent before a present one)
    reads as None."""
    b = r.bytes(f["size"], f["label"])
    return None if f.get("optional") and not any(b) else b


#: field kind -> reader of one reply field
_READ = {
    "bool": lambda r, f: r.u8(f["label"]) == 1,
    "u32": lambda r, f: r.u32(f["label"]),
    "i32": _i32,
    "u64": _u64,
    "enum": _enum,
    "str": lambda r, f: r.str(f["label"], f["max"]),
    "ns": lambda r, f: r.bytes(16, "namespace id"),
    "hash": lambda r, f: r.bytes(32, "chunk hash"),
    "u32s": _u32s,
    "json": _json,
    "blob": _blob,
    "bytes": _fixed_bytes,
    "list": _list,
}


def _fields(r: _Reader, fields: tuple) -> list:
    """The values of ``fields`` read in wire order; a ``known`` code adds its raw form last."""
    values, raw = [], []
    for f in fields:
        v = _READ[f["kind"]](r, f)
        if f.get("known") == "errorCodes":
            raw.append(v)
            v = v if v in ERROR_CODES else "KVT_INTERNAL"
        values.append(v)
    return values + raw


#: bytes of a field of a fixed-size kind ("bytes": its "size"); a list has none
_FIXED = {"bool": 1, "u32": 4, "i32": 4, "u64": 8, "enum": 1, "ns": 16, "hash": 32}


def _decoder(name: str, spec: dict) -> Any:
    """The decoder of one reply's body. Trailing optional fields (docs/protocol.md section 3) are
    told apart by the bytes left after the required ones: each optional field but the last has a
    fixed size, and the last may be a list (present when more bytes follow). One the reply left
    out reads as None."""
    cls, fields = REPLY_CLASSES[spec["code"]], spec["fields"]
    what = name.lower().replace("_", " ")
    required = tuple(f for f in fields if not f.get("optional"))
    optional = tuple(f for f in fields if f.get("optional"))
    sizes = [f["size"] if f["kind"] == "bytes" else _FIXED.get(f["kind"]) for f in optional]
    variable_last = bool(optional) and sizes[-1] is None
    trailers = [0]
    for size in sizes[: len(sizes) - 1] if variable_last else sizes:
        trailers.append(trailers[-1] + size)

    def decode(r: _Reader) -> Reply:
        values = _fields(r, required)
        if optional:
            rest = len(r.buf) - r.off
            if variable_last and rest > trailers[-1]:
                k = len(optional)
            elif rest in trailers:
                k = trailers.index(rest)
            else:
                names = ", then ".join(f["name"] for f in optional)
                raise ProtocolError(
                    f"{rest} unexpected trailing bytes after {what}'s fixed fields at offset "
                    f"{r.off}; only {names} may follow"
                )
            values += _fields(r, optional[:k]) + [None] * (len(optional) - k)
        r.end(what)
        return cls(*values)

    return decode


#: reply type code -> decoder of its body, from the message table
_DECODERS = {spec["code"]: _decoder(name, spec) for name, spec in MESSAGES.items() if spec["dir"] == "reply"}


def _d_lookup(r: _Reader) -> LookupResult:
    """LOOKUP_RESULT field by field (what :func:`_lookup_fast` falls back to)."""
    return _DECODERS[_LOOKUP_RESULT](r)


_LOOKUP_STATUS = next(f["names"] for f in MESSAGES["LOOKUP_RESULT"]["fields"] if f["kind"] == "enum")
#: the layout _lookup_fast reads; it is used only while the table says LOOKUP_RESULT is this
_FAST_LAYOUT = ("str", "enum", "u32", "u32", "u32", "list", "u32", "list")
_FAST = tuple(f["kind"] for f in MESSAGES["LOOKUP_RESULT"]["fields"]) == _FAST_LAYOUT
_LOOKUP_ID_MAX = MESSAGES["LOOKUP_RESULT"]["fields"][0]["max"]
_LOOKUP_FIXED = struct.Struct("<BIIIB")  # status, epoch, hit tokens, hit chunks, tier count


def _lookup_fast(buf: bytes) -> LookupResult | None:
    """A well-formed LOOKUP_RESULT without its optional fields in a few struct calls (the reply a
    scheduler waits on); None for anything else, which :func:`_d_lookup` then decodes or refuses
    with its reason."""
    try:
        (n,) = _U16.unpack_from(buf, HEADER_BYTES)
        if n > _LOOKUP_ID_MAX:
            return None
        off = HEADER_BYTES + 2 + n
        code, epoch, hit_tokens, hit_chunks, nt = _LOOKUP_FIXED.unpack_from(buf, off)
        if code >= len(_LOOKUP_STATUS):
            return None
        lookup_id = buf[HEADER_BYTES + 2 : off].decode("utf-8")
        off += 14
        tiers = []
        for _ in range(nt):
            (tn,) = _U16.unpack_from(buf, off)
            end = off + 2 + tn
            (tokens,) = _U32.unpack_from(buf, end)  # also proves the name is all there
            tiers.append(TierTokens(buf[off + 2 : end].decode("utf-8"), tokens))
            off = end + 4
    except (struct.error, UnicodeDecodeError):
        return None
    if off != len(buf):
        return None
    return LookupResult(lookup_id, _LOOKUP_STATUS[code], epoch, hit_tokens, hit_chunks, tiers)


def peek_request_id(buf: bytes) -> int:
    """The request id of a frame of at least 8 bytes, else 0."""
    return _U32.unpack_from(buf, 4)[0] if len(buf) >= HEADER_BYTES else 0


def decode_header(buf: bytes) -> tuple[int, int]:
    """(type, request id) of a frame; checks length, magic and version, in that order.

    :raises ProtocolError: for a short frame, another magic or another version.
    """
    if len(buf) < HEADER_BYTES:
        raise ProtocolError(f"message is {len(buf)} bytes, shorter than the 8-byte header")
    magic, version, msg_type, request_id = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic 0x{magic:x}: not a kvtier message")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version} (this client speaks 1)")
    return msg_type, request_id


def decode_reply(buf: Any) -> tuple[int, int, Reply]:
    """Decodes one reply frame into ``(type code, request id, reply object)``.

    :raises ProtocolError: malformed frame (see the module docstring).
    :raises TooLargeError: a string declared longer than its limit.
    """
    if not isinstance(buf, bytes):
        buf = bytes(buf)
    msg_type, request_id = decode_header(buf)
    if msg_type == _LOOKUP_RESULT and _FAST:
        rep = _lookup_fast(buf)
        if rep is not None:
            return msg_type, request_id, rep
    dec = _DECODERS.get(msg_type)
    if dec is None:
        raise ProtocolError(f"unknown reply type 0x{msg_type:02x}")
    return msg_type, request_id, dec(_Reader(buf))
