"""Protocol v1 request encoders (docs/protocol.md), re-exported by :mod:`.protocol`.

Each encoder builds one request frame (header included) and refuses, before sending, what the
wire cannot carry (:class:`~kvtier_vllm.errors.InvalidArgumentError` /
:class:`~kvtier_vllm.errors.TooLargeError`). Namespaces are 16 raw bytes (a 32-hex-digit string
or a ``Namespace`` is accepted too); hashes are packed 32-byte digests (a list of digests or
``Chunk`` objects is accepted too).
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from typing import Any, Iterable, Sequence

from .errors import InvalidArgumentError, TooLargeError
from .protocol_types import (
    _U32_MAX,
    CUDA_EVENT_BYTES,
    HASH_BYTES,
    MAGIC,
    MAX_BLOCKS_PER_MESSAGE,
    MAX_CHUNKS_PER_LOOKUP,
    MAX_CHUNKS_PER_MESSAGE,
    MAX_CONFIG_BYTES,
    MAX_ID_BYTES,
    MAX_LOOKUP_ID_BYTES,
    MAX_NAMESPACES_PER_LOOKUP,
    MAX_REGISTRATION_BYTES,
    NAMESPACE_BYTES,
    REQUEST_END_KINDS,
    VERSION,
    MsgType,
)

_HEADER = struct.Struct("<HBBI")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_LITTLE = sys.byteorder == "little"
#: array("I") holds little-endian u32s here: a list of counts or block ids packs through it
_ARRAY_U32 = _LITTLE and array("I").itemsize == 4
#: a LOOKUP's header and lookup id length, packed at once
_LOOKUP_HEAD = struct.Struct("<HBBIH")
_NO_CONFIG = _U32.pack(0)


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


def _u64(name: str, v: Any) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__") or not 0 <= v.__index__() < 1 << 64:
        raise InvalidArgumentError(f"{name} must be an integer in [0, 2^64), got {v!r}")
    return v.__index__()


def _id(name: str, s: Any, limit: int = MAX_ID_BYTES) -> bytes:
    """A `str` field: u16le length + UTF-8. Empty -> invalid, over the limit -> too large."""
    b = _id_bytes(name, s, limit)
    return _U16.pack(len(b)) + b


def _id_bytes(name: str, s: Any, limit: int) -> bytes:
    """The UTF-8 of a `str` field, checked like :func:`_id`."""
    if not isinstance(s, str) or s == "":
        raise InvalidArgumentError(f"{name} must be a non-empty string, got {s!r}")
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{name} is not valid Unicode (lone surrogate)") from None
    if len(b) > limit:
        raise TooLargeError(f"{name} is {len(b)} bytes, the limit is {limit}")
    return b


_NSN = [bytes((i,)) for i in range(MAX_NAMESPACES_PER_LOOKUP + 1)]


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
    if isinstance(values, list) and _ARRAY_U32:
        # array() converts a list of ints in C, about twice as fast as struct.pack(*values)
        try:
            return len(values), array("I", values).tobytes()
        except (TypeError, OverflowError, ValueError):
            pass  # refused below with the offending index, or packed by struct
    elif isinstance(values, array) and values.typecode in ("I", "L") and values.itemsize == 4:
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
    lid = _id_bytes("lookup id", lookup_id, MAX_LOOKUP_ID_BYTES)
    nsn = len(namespaces)
    if nsn == 1:
        (ns,) = namespaces
        if type(ns) is not bytes or len(ns) != NAMESPACE_BYTES:
            ns = namespace_bytes(ns)
    elif not 1 <= nsn <= MAX_NAMESPACES_PER_LOOKUP:
        raise InvalidArgumentError(
            f"lookup needs 1..{MAX_NAMESPACES_PER_LOOKUP} namespaces, got {nsn}"
        )
    else:
        ns = b"".join([namespace_bytes(x) for x in namespaces])
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
        cfg = None
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
            _LOOKUP_HEAD.pack(MAGIC, VERSION, MsgType.LOOKUP, request_id, len(lid)),
            lid,
            _NSN[nsn],
            ns,
            _U32.pack(n),
            packed,
            counts,
            _NO_CONFIG if cfg is None else _U32.pack(len(cfg)) + cfg,
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
    not_after_ns: int | None = None,
    cuda_event: bytes | None = None,
) -> bytes:
    """SAVE blocks as chunks (``engine_request_id`` is the engine's request, a string).
    ``not_after_ns`` (the host's monotonic clock, ns; ``time.monotonic_ns()``) adds the optional
    trailing field: the server copies nothing past it and discards a copy that finishes after it;
    None leaves it out. ``cuda_event`` (the 64-byte ``cudaIpcEventHandle_t`` of an interprocess
    event recorded after the blocks were written) follows it: the server's copies wait for the
    event on the GPU (``not_after_ns`` is then written as 0 when None)."""
    tail, _n = _blocks_and_hashes("save", block_ids, hashes)
    event = b""
    if cuda_event is not None:
        event = bytes(cuda_event)
        if len(event) != CUDA_EVENT_BYTES:
            raise InvalidArgumentError(f"cuda_event must be {CUDA_EVENT_BYTES} bytes (a cudaIpcEventHandle_t), got {len(event)}")
        if not_after_ns is None:
            not_after_ns = 0
    return b"".join(
        (
            encode_header(MsgType.SAVE, request_id),
            _id("engine id", engine_id),
            _id("request id", engine_request_id),
            _U32.pack(_u32("skip_chunks", skip_chunks)),
            tail,
            b"" if not_after_ns is None else _U64.pack(_u64("not_after_ns", not_after_ns)),
            event,
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
    not_after_ns: int | None = None,
) -> bytes:
    """LOAD pinned chunks into blocks. ``skip_blocks`` > 0 adds the optional trailing field
    (leading blocks of the first chunk the engine already holds, absent from ``block_ids``);
    0 leaves it out, so servers without it accept the frame. ``not_after_ns`` (as for
    :func:`encode_save`: no chunk starts past it) follows ``skip_blocks``, which is then written
    too, 0 included."""
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
            _U32.pack(skip) if skip or not_after_ns is not None else b"",
            b"" if not_after_ns is None else _U64.pack(_u64("not_after_ns", not_after_ns)),
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

