"""Protocol v1 reply decoding (docs/protocol.md), re-exported by :mod:`.protocol`.

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

from .errors import ERROR_CODES, ProtocolError, TooLargeError
from .protocol_types import (
    _LOOKUP_STATUS,
    _PUT_OUTCOME,
    HEADER_BYTES,
    MAGIC,
    MAX_ERROR_CODE_BYTES,
    MAX_ID_BYTES,
    MAX_LOOKUP_ID_BYTES,
    NAMESPACE_BYTES,
    VERSION,
    CancelResult,
    ClearResult,
    ErrorReply,
    GetResult,
    HeartbeatResult,
    HoldResult,
    LoadResult,
    LookupResult,
    MsgType,
    Pong,
    PutResult,
    RegisterResult,
    Reply,
    RequestFinishedResult,
    SaveResult,
    StatsResult,
    TierTokens,
    UnregisterResult,
)

_HEADER = struct.Struct("<HBBI")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_LOOKUP_RESULT = MsgType.LOOKUP_RESULT


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


_LOOKUP_FIXED = struct.Struct("<BIIIB")  # status, epoch, hit tokens, hit chunks, tier count


def _lookup_fast(buf: bytes) -> LookupResult | None:
    """A well-formed LOOKUP_RESULT in a few struct calls (the reply a scheduler waits on);
    None for anything else, which :func:`_d_lookup` then decodes or refuses with its reason."""
    try:
        (n,) = _U16.unpack_from(buf, HEADER_BYTES)
        if n > MAX_LOOKUP_ID_BYTES:
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
    if msg_type == _LOOKUP_RESULT:
        rep = _lookup_fast(buf)
        if rep is not None:
            return msg_type, request_id, rep
    dec = _DECODERS.get(msg_type)
    if dec is None:
        raise ProtocolError(f"unknown reply type 0x{msg_type:02x}")
    return msg_type, request_id, dec(_Reader(buf))
