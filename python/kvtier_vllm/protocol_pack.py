"""Packing of protocol v1 requests by the generated message table (:mod:`.protocol_table`):
:func:`encode_message` packs a request's fields in wire order, each by its kind, and refuses,
before sending, what the wire cannot carry (:class:`~kvtier_vllm.errors.InvalidArgumentError` /
:class:`~kvtier_vllm.errors.TooLargeError`). Namespaces are 16 raw bytes (a 32-hex-digit string
or a ``Namespace`` is accepted too); hashes are packed 32-byte digests (a list of digests or
``Chunk`` objects is accepted too); u32 arrays are lists, ``array('I')`` or integer ndarrays.
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from typing import Any

from .errors import InvalidArgumentError, TooLargeError
from .protocol_table import MESSAGES
from .protocol_types import _U32_MAX, HASH_BYTES, MAGIC, MAX_ID_BYTES, NAMESPACE_BYTES, VERSION

_HEADER = struct.Struct("<HBBI")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_LITTLE = sys.byteorder == "little"
#: array("I") holds little-endian u32s here: a list of counts or block ids packs through it
_ARRAY_U32 = _LITTLE and array("I").itemsize == 4
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


def _str(f: dict, v: Any) -> bytes:
    if not f.get("non_empty") and v == "":
        return _U16.pack(0)
    return _id(f["key"], v, f["max"])


def _ns_list(f: dict, v: Any) -> bytes:
    items = list(v)
    n = len(items)
    if n == 1 and f["min"] <= 1 and type(items[0]) is bytes and len(items[0]) == NAMESPACE_BYTES:
        return b"\x01" + items[0]  # the usual LOOKUP: one namespace, already 16 raw bytes
    if n > 255:
        raise TooLargeError(f"{f['key']} has {n} namespaces, at most 255 fit")
    if not f["min"] <= n <= f["max"]:
        raise InvalidArgumentError(f"{f['key']} needs {f['min']}..{f['max']} namespaces, got {n}")
    return bytes((n,)) + b"".join([namespace_bytes(x) for x in items])


def _hashes(f: dict, v: Any) -> bytes:
    packed = pack_hashes(v)
    n = len(packed) // HASH_BYTES
    if n > f["max"]:
        raise TooLargeError(f"{f['key']} has {n} chunks, the limit is {f['max']}")
    return _U32.pack(n) + packed


def _u32s(f: dict, v: Any, values: dict) -> bytes:
    n, packed = _u32_array(f["key"], v)
    of = f.get("count_of")
    if of is not None:
        want = len(values[of]) - 4 >> 5  # the packed hashes of `of`, after their u32 count
        if n != want:
            raise InvalidArgumentError(f"{f['key']} has {n} values for {want} chunks (need {want})")
        return packed
    if "max" in f and n > f["max"]:
        raise TooLargeError(f"{f['key']} has {n} values, the limit is {f['max']}")
    return _U32.pack(n) + packed


def _json(f: dict, v: Any) -> bytes:
    if not isinstance(v, dict):
        raise InvalidArgumentError(f"{f['key']} must be a dict")
    if not v and f.get("omit_empty"):
        return _NO_CONFIG
    try:
        text = json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        body = text.encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError) as err:
        raise InvalidArgumentError(f"{f['key']} is not JSON-serialisable: {err}") from None
    if "max" in f and len(body) > f["max"]:
        raise TooLargeError(f"{f['key']} JSON is {len(body)} bytes, the limit is {f['max']}")
    return _U32.pack(len(body)) + body


def _enum(f: dict, v: Any) -> bytes:
    names = f["names"]
    if not isinstance(v, str) or v not in names:
        raise InvalidArgumentError(f"{f['key']} must be one of {', '.join(names)}, got {v!r}")
    return bytes((names.index(v),))


def _i32(f: dict, v: Any) -> bytes:
    if isinstance(v, bool) or not isinstance(v, int) or not f["min"] <= v <= 0x7FFF_FFFF:
        raise InvalidArgumentError(f"{f['key']} must be an integer in [{f['min']}, 2^31), got {v!r}")
    return _I32.pack(v)


def _fixed(f: dict, v: Any) -> bytes:
    b = bytes(v)
    if len(b) != f["size"]:
        raise InvalidArgumentError(f"{f['key']} must be {f['size']} bytes, got {len(b)}")
    return b


def _blob(f: dict, v: Any) -> bytes:
    data = v if isinstance(v, bytes) else bytes(v)
    if len(data) > _U32_MAX:
        raise TooLargeError(f"{f['key']} is {len(data)} bytes; a u32 length cannot carry it")
    return _U32.pack(len(data)) + data


#: field kind -> packer of one request field (``values`` holds the fields packed so far)
_PACK = {
    "bool": lambda f, v, values: b"\x01" if v else b"\x00",
    "u32": lambda f, v, values: _U32.pack(_u32(f["key"], v)),
    "i32": lambda f, v, values: _i32(f, v),
    "u64": lambda f, v, values: _U64.pack(_u64(f["key"], v)),
    "enum": lambda f, v, values: _enum(f, v),
    "str": lambda f, v, values: _str(f, v),
    "ns": lambda f, v, values: namespace_bytes(v),
    "hash": lambda f, v, values: _hash32(v),
    "nsList": lambda f, v, values: _ns_list(f, v),
    "hashes": lambda f, v, values: _hashes(f, v),
    "u32s": _u32s,
    "json": lambda f, v, values: _json(f, v),
    "blob": lambda f, v, values: _blob(f, v),
    "bytes": lambda f, v, values: _fixed(f, v),
}


def _check_rules(rules: tuple, values: dict, packed: dict) -> None:
    for rule in rules:
        v = values.get(rule["field"])
        n = len(packed[rule["of"]]) - 4 >> 5
        if v is None:
            continue
        if rule["rule"] == "atMostCount" and v > n:
            raise InvalidArgumentError(f"{rule['field']} is {v}, more than the {n} chunks")
        if rule["rule"] == "zeroWithoutCount" and v > 0 and n == 0:
            raise InvalidArgumentError(f"{rule['field']} > 0 needs at least one chunk")


def encode_message(name: str, request_id: int, values: dict) -> bytes:
    """One request frame of message ``name`` (a key of :data:`MESSAGES`) from ``values`` by
    snake_case field name, laid out by the generated message table. Trailing optional fields
    are written up to the last one not None (earlier ones as 0).

    :raises InvalidArgumentError: a value the message cannot carry.
    :raises TooLargeError: a value over its wire limit.
    """
    spec = MESSAGES[name]
    fields = spec["fields"]
    count = len(fields)
    while count and fields[count - 1].get("optional") and values.get(fields[count - 1]["key"]) is None:
        count -= 1
    packed = {}
    for f in fields[:count]:
        v = values.get(f["key"])
        if v is None and f.get("optional"):
            v = 0
        packed[f["key"]] = _PACK[f["kind"]](f, v, packed)
    if spec["rules"]:
        _check_rules(spec["rules"], values, packed)
    return encode_header(spec["code"], request_id) + b"".join(packed.values())
