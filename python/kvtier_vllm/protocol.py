"""The kvtier protocol v1 codec (docs/protocol.md), the only encoder/decoder of the package.

Encoders build one request frame (header included) and refuse, before sending, what the wire
cannot carry (:class:`~kvtier_vllm.errors.InvalidArgumentError` /
:class:`~kvtier_vllm.errors.TooLargeError`). :func:`decode_reply` decodes one reply frame
strictly: a short frame, another magic or version, an unknown type, a truncated field, bytes
after the last field, invalid UTF-8 or malformed JSON raise
:class:`~kvtier_vllm.errors.ProtocolError`; a string declared longer than its limit raises
:class:`~kvtier_vllm.errors.TooLargeError`. An ERROR reply decodes to :class:`ErrorReply`
(an unknown code reads as ``KVT_INTERNAL``); it is returned, not raised.

Namespaces are 16 raw bytes (a 32-hex-digit string or a ``Namespace`` is accepted too); hashes
are packed 32-byte digests (a list of digests or ``Chunk`` objects is accepted too).
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from typing import Any, Iterable, NamedTuple, Sequence, Union

from .errors import ERROR_CODES, InvalidArgumentError, ProtocolError, TooLargeError

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_BYTES",
    "HASH_BYTES",
    "NAMESPACE_BYTES",
    "MAX_LOOKUP_ID_BYTES",
    "MAX_NAMESPACES_PER_LOOKUP",
    "MAX_CHUNKS_PER_LOOKUP",
    "MAX_CONFIG_BYTES",
    "MAX_ID_BYTES",
    "MAX_REGISTRATION_BYTES",
    "MAX_BLOCKS_PER_MESSAGE",
    "MAX_CHUNKS_PER_MESSAGE",
    "MsgType",
    "REQUEST_END_KINDS",
    "TierTokens",
    "LookupResult",
    "CancelResult",
    "ClearResult",
    "Pong",
    "StatsResult",
    "PutResult",
    "GetResult",
    "RegisterResult",
    "SaveResult",
    "LoadResult",
    "HoldResult",
    "RequestFinishedResult",
    "HeartbeatResult",
    "UnregisterResult",
    "ErrorReply",
    "Reply",
    "encode_header",
    "encode_lookup",
    "encode_cancel",
    "encode_clear",
    "encode_ping",
    "encode_stats",
    "encode_put",
    "encode_get",
    "encode_register",
    "encode_save",
    "encode_load",
    "encode_hold",
    "encode_request_finished",
    "encode_heartbeat",
    "encode_unregister",
    "decode_header",
    "decode_reply",
    "peek_request_id",
    "namespace_bytes",
    "pack_hashes",
]

MAGIC = 0x766B  # the bytes 6b 76, "kv"
VERSION = 1
HEADER_BYTES = 8
HASH_BYTES = 32
NAMESPACE_BYTES = 16
MAX_LOOKUP_ID_BYTES = 256
MAX_NAMESPACES_PER_LOOKUP = 16
MAX_CHUNKS_PER_LOOKUP = 65536  # wire maximum; servers default to 8192
MAX_CONFIG_BYTES = 4096
MAX_ID_BYTES = 256
MAX_REGISTRATION_BYTES = 1024 * 1024
MAX_BLOCKS_PER_MESSAGE = 262_144
MAX_CHUNKS_PER_MESSAGE = 65_536
MAX_ERROR_CODE_BYTES = 64
_U32_MAX = 0xFFFF_FFFF


class MsgType:
    """Message type codes; a reply's code is its request's with the high bit set."""

    LOOKUP = 0x01
    CANCEL = 0x02
    CLEAR = 0x03
    PING = 0x04
    PUT = 0x05
    GET = 0x06
    STATS = 0x07
    REGISTER = 0x08
    SAVE = 0x09
    LOAD = 0x0A
    HOLD = 0x0B
    REQUEST_FINISHED = 0x0C
    HEARTBEAT = 0x0D
    UNREGISTER = 0x0E
    LOOKUP_RESULT = 0x81
    CANCEL_RESULT = 0x82
    CLEAR_RESULT = 0x83
    PONG = 0x84
    PUT_RESULT = 0x85
    GET_RESULT = 0x86
    STATS_RESULT = 0x87
    REGISTER_RESULT = 0x88
    SAVE_RESULT = 0x89
    LOAD_RESULT = 0x8A
    HOLD_RESULT = 0x8B
    REQUEST_FINISHED_RESULT = 0x8C
    HEARTBEAT_RESULT = 0x8D
    UNREGISTER_RESULT = 0x8E
    ERROR = 0xFF


#: REQUEST_FINISHED kind names and their wire bytes.
REQUEST_END_KINDS = {"finished": 0, "aborted": 1, "preempted": 2}
_LOOKUP_STATUS = ("ok", "canceled", "stale")
_PUT_OUTCOME = ("stored", "exists", "dropped")

# ------------------------------------------------------------------------------------------
# Reply objects


class TierTokens(NamedTuple):
    tier: str
    tokens: int


class LookupResult(NamedTuple):
    """LOOKUP_RESULT: ``status`` is ``'ok'``, ``'canceled'`` or ``'stale'``."""

    lookup_id: str
    status: str
    epoch: int
    hit_tokens: int
    hit_chunks: int
    tiers: list


class CancelResult(NamedTuple):
    found: bool


class ClearResult(NamedTuple):
    epoch: int


class Pong(NamedTuple):
    info: dict


class StatsResult(NamedTuple):
    stats: dict


class PutResult(NamedTuple):
    """``outcome``: ``'stored'``, ``'exists'`` or ``'dropped'``."""

    outcome: str


class GetResult(NamedTuple):
    found: bool
    tokens: int
    payload: bytes


class RegisterResult(NamedTuple):
    engine_id: str
    namespace: bytes
    chunk_size: int
    block_size: int


class SaveResult(NamedTuple):
    saved: int
    skipped: int
    dropped: int


class LoadResult(NamedTuple):
    loaded_tokens: int
    invalid_block_ids: list


class HoldResult(NamedTuple):
    held_chunks: int


class RequestFinishedResult(NamedTuple):
    released: bool


class HeartbeatResult(NamedTuple):
    known: bool


class UnregisterResult(NamedTuple):
    released: bool


class ErrorReply(NamedTuple):
    """ERROR: ``code`` is a known code (unknown ones read as ``KVT_INTERNAL``); ``raw_code`` is
    what the server sent."""

    code: str
    message: str
    raw_code: str


Reply = Union[
    LookupResult,
    CancelResult,
    ClearResult,
    Pong,
    StatsResult,
    PutResult,
    GetResult,
    RegisterResult,
    SaveResult,
    LoadResult,
    HoldResult,
    RequestFinishedResult,
    HeartbeatResult,
    UnregisterResult,
    ErrorReply,
]

# ------------------------------------------------------------------------------------------
# Encoding

_HEADER = struct.Struct("<HBBI")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_LITTLE = sys.byteorder == "little"


def encode_header(msg_type: int, request_id: int) -> bytes:
    """The 8-byte header: magic, version 1, type, request id (a u32)."""
    if not 0 <= request_id <= _U32_MAX:
        raise InvalidArgumentError(f"request id must be in [0, 4294967295], got {request_id!r}")
    return _HEADER.pack(MAGIC, VERSION, msg_type, request_id)


def _u32(name: str, v: Any) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise InvalidArgumentError(f"{name} must be an integer in [0, 4294967295], got {v!r}")
    v = v.__index__()
    if not 0 <= v <= _U32_MAX:
        raise InvalidArgumentError(f"{name} must be an integer in [0, 4294967295], got {v!r}")
    return v


def _id(name: str, s: Any, limit: int = MAX_ID_BYTES) -> bytes:
    """A `str` field: u16le length + UTF-8. Empty -> invalid, over the limit -> too large."""
    if not isinstance(s, str) or s == "":
        raise InvalidArgumentError(f"{name} must be a non-empty string, got {s!r}")
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{name} is not valid Unicode (lone surrogate)") from None
    if len(b) > limit:
        raise TooLargeError(f"{name} is {len(b)} bytes, the limit is {limit}")
    return _U16.pack(len(b)) + b


def namespace_bytes(ns: Any) -> bytes:
    """A namespace id as 16 raw bytes, from bytes, 32 lowercase hex digits or a ``Namespace``.

    :raises InvalidArgumentError: for anything else.
    """
    if isinstance(ns, (bytes, bytearray, memoryview)):
        b = bytes(ns)
        if len(b) == NAMESPACE_BYTES:
            return b
    elif isinstance(ns, str):
        if len(ns) == 32 and ns == ns.lower():
            try:
                return bytes.fromhex(ns)
            except ValueError:
                pass
    elif isinstance(getattr(ns, "id", None), bytes) and len(ns.id) == NAMESPACE_BYTES:
        return ns.id
    raise InvalidArgumentError(
        f"a namespace id must be 16 bytes or 32 lowercase hex digits, got {ns!r}"
    )


def pack_hashes(hashes: Any) -> bytes:
    """Packed hashes (a multiple of 32 bytes) from packed bytes or a list of digests/Chunks."""
    if isinstance(hashes, bytes):
        packed = hashes
    elif isinstance(hashes, (bytearray, memoryview)):
        packed = bytes(hashes)
    else:
        parts = []
        for h in hashes:
            d = h if isinstance(h, (bytes, bytearray)) else getattr(h, "hash", None)
            if not isinstance(d, (bytes, bytearray)) or len(d) != HASH_BYTES:
                raise InvalidArgumentError(f"a chunk hash must be {HASH_BYTES} bytes, got {h!r}")
            parts.append(d)
        packed = b"".join(parts)
    if len(packed) % HASH_BYTES:
        raise InvalidArgumentError(
            f"packed hashes must be a multiple of {HASH_BYTES} bytes, got {len(packed)}"
        )
    return packed


def _u32_array(name: str, values: Any) -> tuple[int, bytes]:
    """(count, little-endian u32 bytes) of a sequence of ints, an array('I') or an int ndarray."""
    if isinstance(values, array) and values.typecode in ("I", "L") and values.itemsize == 4:
        if _LITTLE:
            return len(values), values.tobytes()
        values = values.tolist()
    dtype = getattr(values, "dtype", None)
    if dtype is not None:
        if getattr(values, "ndim", 1) != 1 or dtype.kind not in "ui":
            raise InvalidArgumentError(f"{name} must be a 1-d integer array")
        if len(values) and (int(values.min()) < 0 or int(values.max()) > _U32_MAX):
            raise InvalidArgumentError(f"{name} must hold integers in [0, 4294967295]")
        return len(values), values.astype("<u4", copy=False).tobytes()
    if not isinstance(values, (list, tuple)):
        values = list(values)
    n = len(values)
    try:
        return n, struct.pack(f"<{n}I", *values)
    except struct.error:
        for i, v in enumerate(values):
            _u32(f"{name}[{i}]", v)
        raise  # pragma: no cover


def encode_lookup(
    request_id: int,
    lookup_id: str,
    namespaces: Sequence[Any],
    hashes: Any,
    token_counts: Any,
    pin: bool = True,
    prefetch: bool = True,
    config: dict | None = None,
) -> bytes:
    """LOOKUP. ``token_counts``: one per hash (each sent as a u32; the server refuses 0 and
    counts over its ``maxTokensPerChunk``). The config JSON carries only non-default options
    (none -> 0 bytes), unless ``config`` is given: then that object is sent as compact JSON
    and ``pin``/``prefetch`` are ignored.
    """
    lid = _id("lookup id", lookup_id, MAX_LOOKUP_ID_BYTES)
    nsn = len(namespaces)
    if not 1 <= nsn <= MAX_NAMESPACES_PER_LOOKUP:
        raise InvalidArgumentError(
            f"lookup needs 1..{MAX_NAMESPACES_PER_LOOKUP} namespaces, got {nsn}"
        )
    ns = b"".join(namespace_bytes(x) for x in namespaces)
    packed = pack_hashes(hashes)
    n, counts = _u32_array("token_counts", token_counts)
    if len(packed) != n * HASH_BYTES:
        raise InvalidArgumentError(
            f"lookup has {len(packed)} hash bytes for {n} token counts (need {n * HASH_BYTES})"
        )
    if n > MAX_CHUNKS_PER_LOOKUP:
        raise TooLargeError(f"lookup has {n} chunks, the wire allows {MAX_CHUNKS_PER_LOOKUP}")
    if config is not None:
        if not isinstance(config, dict):
            raise InvalidArgumentError("lookup config must be a dict")
        cfg = json.dumps(config, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(cfg) > MAX_CONFIG_BYTES:
            raise TooLargeError(f"lookup config is longer than {MAX_CONFIG_BYTES} bytes")
    elif pin is True and prefetch is True:
        cfg = b""
    else:
        if not isinstance(pin, bool) or not isinstance(prefetch, bool):
            raise InvalidArgumentError("pin and prefetch must be booleans")
        parts = []
        if not pin:
            parts.append('"pin":false')
        if not prefetch:
            parts.append('"prefetch":false')
        cfg = ("{" + ",".join(parts) + "}").encode()
    return b"".join(
        (
            _HEADER.pack(MAGIC, VERSION, MsgType.LOOKUP, request_id),
            lid,
            bytes((nsn,)),
            ns,
            _U32.pack(n),
            packed,
            counts,
            _U32.pack(len(cfg)),
            cfg,
        )
    )


def encode_cancel(request_id: int, lookup_id: str) -> bytes:
    """CANCEL of a lookup id."""
    return encode_header(MsgType.CANCEL, request_id) + _id("lookup id", lookup_id, MAX_LOOKUP_ID_BYTES)


def encode_clear(request_id: int, namespaces: Iterable[Any] = ()) -> bytes:
    """CLEAR of these namespaces (none: every namespace)."""
    ns = [namespace_bytes(x) for x in namespaces]
    if len(ns) > 255:
        raise TooLargeError(f"clear names {len(ns)} namespaces, at most 255 fit")
    return encode_header(MsgType.CLEAR, request_id) + bytes((len(ns),)) + b"".join(ns)


def encode_ping(request_id: int) -> bytes:
    return encode_header(MsgType.PING, request_id)


def encode_stats(request_id: int) -> bytes:
    return encode_header(MsgType.STATS, request_id)


def _hash32(h: Any) -> bytes:
    if isinstance(h, str):
        try:
            b = bytes.fromhex(h) if len(h) == 64 and h == h.lower() else b""
        except ValueError:
            b = b""
    elif isinstance(h, (bytes, bytearray, memoryview)):
        b = bytes(h)
    else:
        b = getattr(h, "hash", b"")
    if len(b) != HASH_BYTES:
        raise InvalidArgumentError(
            f"a chunk hash must be {HASH_BYTES} bytes or 64 lowercase hex digits, got {h!r}"
        )
    return b


def encode_put(request_id: int, namespace: Any, hash: Any, tokens: int, payload: Any) -> bytes:
    """PUT one chunk's bytes."""
    data = bytes(payload) if not isinstance(payload, bytes) else payload
    if len(data) > _U32_MAX:
        raise TooLargeError(f"payload is {len(data)} bytes; a u32 length cannot carry it")
    return b"".join(
        (
            encode_header(MsgType.PUT, request_id),
            namespace_bytes(namespace),
            _hash32(hash),
            _U32.pack(_u32("tokens", tokens)),
            _U32.pack(len(data)),
            data,
        )
    )


def encode_get(request_id: int, namespace: Any, hash: Any) -> bytes:
    """GET one chunk's bytes."""
    return encode_header(MsgType.GET, request_id) + namespace_bytes(namespace) + _hash32(hash)


def encode_register(request_id: int, registration: dict) -> bytes:
    """REGISTER: the registration object as compact UTF-8 JSON."""
    if not isinstance(registration, dict):
        raise InvalidArgumentError("registration must be a dict")
    try:
        text = json.dumps(registration, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        body = text.encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError) as err:
        raise InvalidArgumentError(f"registration is not JSON-serialisable: {err}") from None
    if len(body) > MAX_REGISTRATION_BYTES:
        raise TooLargeError(
            f"registration JSON is {len(body)} bytes, the limit is {MAX_REGISTRATION_BYTES}"
        )
    return encode_header(MsgType.REGISTER, request_id) + _U32.pack(len(body)) + body


def _blocks_and_hashes(what: str, block_ids: Any, hashes: Any) -> tuple[bytes, int]:
    m, ids = _u32_array(f"{what} block_ids", block_ids)
    if m > MAX_BLOCKS_PER_MESSAGE:
        raise TooLargeError(f"{what} has {m} block ids, the limit is {MAX_BLOCKS_PER_MESSAGE}")
    packed = pack_hashes(hashes)
    n = len(packed) // HASH_BYTES
    if n > MAX_CHUNKS_PER_MESSAGE:
        raise TooLargeError(f"{what} has {n} chunks, the limit is {MAX_CHUNKS_PER_MESSAGE}")
    return b"".join((_U32.pack(m), ids, _U32.pack(n), packed)), n


def encode_save(
    request_id: int,
    engine_id: str,
    engine_request_id: str,
    skip_chunks: int,
    block_ids: Any,
    hashes: Any,
) -> bytes:
    """SAVE blocks as chunks (``engine_request_id`` is the engine's request, a string)."""
    tail, _n = _blocks_and_hashes("save", block_ids, hashes)
    return b"".join(
        (
            encode_header(MsgType.SAVE, request_id),
            _id("engine id", engine_id),
            _id("request id", engine_request_id),
            _U32.pack(_u32("skip_chunks", skip_chunks)),
            tail,
        )
    )


def encode_load(
    request_id: int,
    engine_id: str,
    engine_request_id: str,
    lookup_id: str,
    block_ids: Any,
    hashes: Any,
    deadline_ms: int = 0,
    state_slot: int = -1,
    skip_blocks: int = 0,
) -> bytes:
    """LOAD pinned chunks into blocks. ``skip_blocks`` > 0 adds the optional trailing field
    (leading blocks of the first chunk the engine already holds, absent from ``block_ids``);
    0 leaves it out, so servers without it accept the frame."""
    if isinstance(state_slot, bool) or not isinstance(state_slot, int) or not -1 <= state_slot <= 0x7FFF_FFFF:
        raise InvalidArgumentError(
            f"state_slot must be -1 (none) or an integer in [0, 2^31), got {state_slot!r}"
        )
    skip = _u32("skip_blocks", skip_blocks)
    tail, n = _blocks_and_hashes("load", block_ids, hashes)
    if skip > 0 and n == 0:
        raise InvalidArgumentError("skip_blocks > 0 needs at least one chunk")
    return b"".join(
        (
            encode_header(MsgType.LOAD, request_id),
            _id("engine id", engine_id),
            _id("request id", engine_request_id),
            _id("lookup id", lookup_id),
            _U32.pack(_u32("deadline_ms", deadline_ms)),
            _I32.pack(state_slot),
            tail,
            _U32.pack(skip) if skip else b"",
        )
    )


def encode_hold(request_id: int, engine_id: str, engine_request_id: str, lookup_id: str) -> bytes:
    """HOLD a lookup's pins for an engine request."""
    return b"".join(
        (
            encode_header(MsgType.HOLD, request_id),
            _id("engine id", engine_id),
            _id("request id", engine_request_id),
            _id("lookup id", lookup_id),
        )
    )


def encode_request_finished(
    request_id: int, engine_id: str, engine_request_id: str, kind: str
) -> bytes:
    """REQUEST_FINISHED: ``kind`` is ``'finished'``, ``'aborted'`` or ``'preempted'``."""
    code = REQUEST_END_KINDS.get(kind) if isinstance(kind, str) else None
    if code is None:
        raise InvalidArgumentError(
            f"kind must be one of {', '.join(REQUEST_END_KINDS)}, got {kind!r}"
        )
    return b"".join(
        (
            encode_header(MsgType.REQUEST_FINISHED, request_id),
            _id("engine id", engine_id),
            _id("request id", engine_request_id),
            bytes((code,)),
        )
    )


def encode_heartbeat(request_id: int, engine_id: str) -> bytes:
    return encode_header(MsgType.HEARTBEAT, request_id) + _id("engine id", engine_id)


def encode_unregister(request_id: int, engine_id: str) -> bytes:
    return encode_header(MsgType.UNREGISTER, request_id) + _id("engine id", engine_id)


# ------------------------------------------------------------------------------------------
# Decoding


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


def _json(r: _Reader, what: str) -> dict:
    n = r.u32(f"{what} length")
    raw = r.bytes(n, what)
    r.end(what)
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(f"{what} is not valid UTF-8 JSON") from None
    return obj if isinstance(obj, dict) else {}


def _d_lookup(r: _Reader) -> LookupResult:
    lookup_id = r.str("lookup id", MAX_LOOKUP_ID_BYTES)
    code = r.u8("status")
    if code >= len(_LOOKUP_STATUS):
        raise ProtocolError(f"unknown lookup status {code}")
    r.need(13, "epoch, hit tokens, hit chunks, tier count")
    epoch, hit_tokens, hit_chunks, nt = struct.unpack_from("<IIIB", r.buf, r.off)
    r.off += 13
    tiers = []
    for _ in range(nt):
        tiers.append(TierTokens(r.str("tier name", 0xFFFF), r.u32("tier tokens")))
    r.end("lookup result")
    return LookupResult(lookup_id, _LOOKUP_STATUS[code], epoch, hit_tokens, hit_chunks, tiers)


def _d_cancel(r: _Reader) -> CancelResult:
    found = r.u8("found") == 1
    r.end("cancel result")
    return CancelResult(found)


def _d_clear(r: _Reader) -> ClearResult:
    epoch = r.u32("epoch")
    r.end("clear result")
    return ClearResult(epoch)


def _d_pong(r: _Reader) -> Pong:
    return Pong(_json(r, "pong json"))


def _d_stats(r: _Reader) -> StatsResult:
    return StatsResult(_json(r, "stats json"))


def _d_put(r: _Reader) -> PutResult:
    code = r.u8("outcome")
    if code >= len(_PUT_OUTCOME):
        raise ProtocolError(f"unknown put outcome {code}")
    r.end("put result")
    return PutResult(_PUT_OUTCOME[code])


def _d_get(r: _Reader) -> GetResult:
    found = r.u8("found") == 1
    tokens = r.u32("tokens")
    n = r.u32("payload length")
    payload = r.bytes(n, "payload")
    r.end("get result")
    return GetResult(found, tokens, payload)


def _d_register(r: _Reader) -> RegisterResult:
    engine_id = r.str("engine id", MAX_ID_BYTES)
    ns = r.bytes(NAMESPACE_BYTES, "namespace id")
    chunk_size = r.u32("chunk size")
    block_size = r.u32("block size")
    r.end("register result")
    return RegisterResult(engine_id, ns, chunk_size, block_size)


def _d_save(r: _Reader) -> SaveResult:
    saved, skipped, dropped = r.u32("saved"), r.u32("skipped"), r.u32("dropped")
    r.end("save result")
    return SaveResult(saved, skipped, dropped)


def _d_load(r: _Reader) -> LoadResult:
    loaded = r.u32("loaded tokens")
    n = r.u32("invalid count")
    r.need(4 * n, "invalid block ids")
    ids = list(struct.unpack_from(f"<{n}I", r.buf, r.off)) if n else []
    r.off += 4 * n
    r.end("load result")
    return LoadResult(loaded, ids)


def _d_hold(r: _Reader) -> HoldResult:
    held = r.u32("held chunks")
    r.end("hold result")
    return HoldResult(held)


def _d_request_finished(r: _Reader) -> RequestFinishedResult:
    released = r.u8("released") == 1
    r.end("request finished result")
    return RequestFinishedResult(released)


def _d_heartbeat(r: _Reader) -> HeartbeatResult:
    known = r.u8("known") == 1
    r.end("heartbeat result")
    return HeartbeatResult(known)


def _d_unregister(r: _Reader) -> UnregisterResult:
    released = r.u8("released") == 1
    r.end("unregister result")
    return UnregisterResult(released)


def _d_error(r: _Reader) -> ErrorReply:
    raw = r.str("error code", MAX_ERROR_CODE_BYTES)
    message = r.str("error message", 0xFFFF)
    r.end("error reply")
    return ErrorReply(raw if raw in ERROR_CODES else "KVT_INTERNAL", message, raw)


_DECODERS = {
    MsgType.LOOKUP_RESULT: _d_lookup,
    MsgType.CANCEL_RESULT: _d_cancel,
    MsgType.CLEAR_RESULT: _d_clear,
    MsgType.PONG: _d_pong,
    MsgType.PUT_RESULT: _d_put,
    MsgType.GET_RESULT: _d_get,
    MsgType.STATS_RESULT: _d_stats,
    MsgType.REGISTER_RESULT: _d_register,
    MsgType.SAVE_RESULT: _d_save,
    MsgType.LOAD_RESULT: _d_load,
    MsgType.HOLD_RESULT: _d_hold,
    MsgType.REQUEST_FINISHED_RESULT: _d_request_finished,
    MsgType.HEARTBEAT_RESULT: _d_heartbeat,
    MsgType.UNREGISTER_RESULT: _d_unregister,
    MsgType.ERROR: _d_error,
}


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
    dec = _DECODERS.get(msg_type)
    if dec is None:
        raise ProtocolError(f"unknown reply type 0x{msg_type:02x}")
    return msg_type, request_id, dec(_Reader(buf))
