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


# Packers: each appends one request field's bytes to ``out``; a hash list records its count in
# ``counts`` (for a u32 array counted by it, and for the rules).


def _str(f: dict, v: Any, out: list, counts: dict) -> None:
    if not f.get("non_empty") and v == "":
        out.append(_U16.pack(0))
    else:
        out.append(_id(f["key"], v, f["max"]))


def _ns_list(f: dict, v: Any, out: list, counts: dict) -> None:
    items = v if isinstance(v, (list, tuple)) else list(v)
    n = len(items)
    if n == 1 and f["min"] <= 1 and type(items[0]) is bytes and len(items[0]) == NAMESPACE_BYTES:
        out.append(b"\x01")  # the usual LOOKUP: one namespace, already 16 raw bytes
        out.append(items[0])
        return
    if n > 255:
        raise TooLargeError(f"{f['key']} has {n} namespaces, at most 255 fit")
    if not f["min"] <= n <= f["max"]:
        raise InvalidArgumentError(f"{f['key']} needs {f['min']}..{f['max']} namespaces, got {n}")
    out.append(bytes((n,)))
    out.extend([namespace_bytes(x) for x in items])


def _hashes(f: dict, v: Any, out: list, counts: dict) -> None:
    packed = pack_hashes(v)
    n = len(packed) >> 5
    if n > f["max"]:
        raise TooLargeError(f"{f['key']} has {n} chunks, the limit is {f['max']}")
    counts[f["key"]] = n
    out.append(_U32.pack(n))
    out.append(packed)


def _u32s(f: dict, v: Any, out: list, counts: dict) -> None:
    n, packed = _u32_array(f["key"], v)
    of = f.get("count_of")
    if of is not None:
        if n != counts[of]:
            raise InvalidArgumentError(f"{f['key']} has {n} values for {counts[of]} chunks")
    elif "max" in f and n > f["max"]:
        raise TooLargeError(f"{f['key']} has {n} values, the limit is {f['max']}")
    else:
        out.append(_U32.pack(n))
    out.append(packed)


def _json(f: dict, v: Any, out: list, counts: dict) -> None:
    if not isinstance(v, dict):
        raise InvalidArgumentError(f"{f['key']} must be a dict")
    if not v and f.get("omit_empty"):
        out.append(_NO_CONFIG)
        return
    try:
        text = json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        body = text.encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError) as err:
        raise InvalidArgumentError(f"{f['key']} is not JSON-serialisable: {err}") from None
    if "max" in f and len(body) > f["max"]:
        raise TooLargeError(f"{f['key']} JSON is {len(body)} bytes, the limit is {f['max']}")
    out.append(_U32.pack(len(body)))
    out.append(body)


def _enum(f: dict, v: Any, out: list, counts: dict) -> None:
    names = f["names"]
    if not isinstance(v, str) or v not in names:
        raise InvalidArgumentError(f"{f['key']} must be one of {', '.join(names)}, got {v!r}")
    out.append(bytes((names.index(v),)))


def _i32(f: dict, v: Any, out: list, counts: dict) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not f["min"] <= v <= 0x7FFF_FFFF:
        raise InvalidArgumentError(f"{f['key']} must be an integer in [{f['min']}, 2^31), got {v!r}")
    out.append(_I32.pack(v))


def _fixed(f: dict, v: Any, out: list, counts: dict) -> None:
    b = bytes(v)
    if len(b) != f["size"]:
        raise InvalidArgumentError(f"{f['key']} must be {f['size']} bytes, got {len(b)}")
    out.append(b)


def _blob(f: dict, v: Any, out: list, counts: dict) -> None:
    data = v if isinstance(v, bytes) else bytes(v)
    if len(data) > _U32_MAX:
        raise TooLargeError(f"{f['key']} is {len(data)} bytes; a u32 length cannot carry it")
    out.append(_U32.pack(len(data)))
    out.append(data)


_PACK = {
    "bool": lambda f, v, out, counts: out.append(b"\x01" if v else b"\x00"),
    "u32": lambda f, v, out, counts: out.append(_U32.pack(_u32(f["key"], v))),
    "i32": _i32,
    "u64": lambda f, v, out, counts: out.append(_U64.pack(_u64(f["key"], v))),
    "enum": _enum,
    "str": _str,
    "ns": lambda f, v, out, counts: out.append(namespace_bytes(v)),
    "hash": lambda f, v, out, counts: out.append(_hash32(v)),
    "nsList": _ns_list,
    "hashes": _hashes,
    "u32s": _u32s,
    "json": _json,
    "blob": _blob,
    "bytes": _fixed,
}

#: request name -> (type code, ((field, key, packer, optional), ...), rules), from the table
_PLANS = {
    name: (
        spec["code"],
        tuple((f, f["key"], _PACK[f["kind"]], bool(f.get("optional"))) for f in spec["fields"]),
        spec["rules"],
    )
    for name, spec in MESSAGES.items()
    if spec["dir"] == "request"
}


def _check_rules(rules: tuple, values: dict, counts: dict) -> None:
    for rule in rules:
        v = values.get(rule["field"])
        n = counts[rule["of"]]
        if v is None:
            continue
        if rule["rule"] == "atMostCount" and v > n:
            raise InvalidArgumentError(f"{rule['field']} is {v}, more than the {n} chunks")
        if rule["rule"] == "zeroWithoutCount" and v > 0 and n == 0:
            raise InvalidArgumentError(f"{rule['field']} > 0 needs at least one chunk")


def encode_message(name: str, request_id: int, values: dict) -> bytes:
    """One request frame of message ``name`` (a key of :data:`MESSAGES`) from ``values`` by
    snake_case field name, laid out by the generated message table. Trailing optional fields
    are written up to the last one not None (earlier ones as 0, or zero bytes).

    :raises InvalidArgumentError: a value the message cannot carry.
    :raises TooLargeError: a value over its wire limit.
    """
    code, fields, rules = _PLANS[name]
    count = len(fields)
    while count and fields[count - 1][3] and values.get(fields[count - 1][1]) is None:
        count -= 1
    out = [encode_header(code, request_id)]
    counts: dict = {}
    for f, key, pack, optional in fields[:count] if count < len(fields) else fields:
        v = values.get(key)
        if v is None and optional:  # absent before a present one: zeros (bytes) or 0
            v = bytes(f["size"]) if f["kind"] == "bytes" else 0
        pack(f, v, out, counts)
    if rules:
        _check_rules(rules, values, counts)
    return b"".join(out)
