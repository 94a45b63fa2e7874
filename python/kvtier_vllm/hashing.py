"""kvtier's default chunk hasher, byte-identical to docs/protocol.md section 9.1.

A chunk's key is a 32-byte SHA-256 chained over the whole prefix before it::

    seed  = SHA-256("kvtier/v1" || 0x00 || UTF-8(salt))                      # no LoRA
    seed  = SHA-256("kvtier/v1x" || 0x00 || u32le(len S) || S || u32le(len L) || L)  # LoRA L
    h[i]  = SHA-256(h[i-1] || u32le(tokens of chunk i))                      # no extra inputs
    p     = SHA-256("kvtier/v1/mm" || 0x00 || h[i-1] || e_i)                 # extra inputs e_i
    h[i]  = SHA-256(p || u32le(tokens of chunk i))

Never use Python's ``hash()`` for this: it is seeded per process.
"""

from __future__ import annotations

import hashlib
import re
import struct
from typing import Any, Iterable, NamedTuple, Sequence

from ._validate import require_int as _int
from .errors import InvalidArgumentError

__all__ = [
    "HASH_BYTES",
    "MAX_CHUNK_SIZE",
    "MAX_MM_ID_BYTES",
    "Chunk",
    "MmSpan",
    "hash_chunks",
    "hash_seed",
    "pack_hashes",
    "hash_to_hex",
    "hex_to_hash",
]

HASH_BYTES = 32
#: Largest accepted chunk size in tokens.
MAX_CHUNK_SIZE = 1 << 20
#: Largest id of an extra-input span, in bytes.
MAX_MM_ID_BYTES = 1024
_U32_MAX = 0xFFFF_FFFF

_DOMAIN = b"kvtier/v1\x00"
_DOMAIN_LORA = b"kvtier/v1x\x00"
_DOMAIN_MM = b"kvtier/v1/mm\x00"
_sha256 = hashlib.sha256
_HEX64 = re.compile(r"[0-9a-f]{64}")


class Chunk(NamedTuple):
    """Tokens ``[start, end)`` of the input and the chained 32-byte hash of that prefix."""

    start: int
    end: int
    hash: bytes

    @property
    def tokens(self) -> int:
        return self.end - self.start


class MmSpan(NamedTuple):
    """An extra input (multimodal item) placed over prompt tokens ``[offset, offset+length)``."""

    id: bytes
    offset: int
    length: int


def _utf8(name: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be a string, got {type(value).__name__}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(
            f"{name} must be a well-formed Unicode string (it contains a lone surrogate)"
        ) from None


def hash_seed(salt: str = "", lora: str | None = None) -> bytes:
    """The chain seed ``h[-1]`` for a cache salt and an optional LoRA adapter name.

    :raises InvalidArgumentError: for a salt or LoRA name that is not a well-formed string.
    """
    s = _utf8("salt", salt)
    if lora is None or lora == "":
        return _sha256(_DOMAIN + s).digest()
    lo = _utf8("lora", lora)
    return _sha256(
        _DOMAIN_LORA + struct.pack("<I", len(s)) + s + struct.pack("<I", len(lo)) + lo
    ).digest()




def _spans(mm: Iterable[Any]) -> list[tuple[int, int, bytes]]:
    out = []
    for i, item in enumerate(mm):
        if isinstance(item, dict):
            raw_id, offset, length = item.get("id"), item.get("offset"), item.get("length")
        else:
            try:
                raw_id, offset, length = item
            except (TypeError, ValueError):
                raise InvalidArgumentError(
                    f"mm[{i}] must be (id, offset, length) or {{id, offset, length}}, got {item!r}"
                ) from None
        if isinstance(raw_id, str):
            ident = _utf8(f"mm[{i}].id", raw_id)
        elif isinstance(raw_id, (bytes, bytearray, memoryview)):
            ident = bytes(raw_id)
        else:
            raise InvalidArgumentError(f"mm[{i}].id must be bytes or a string, got {raw_id!r}")
        if not 1 <= len(ident) <= MAX_MM_ID_BYTES:
            raise InvalidArgumentError(
                f"mm[{i}].id must be 1..{MAX_MM_ID_BYTES} bytes, got {len(ident)}"
            )
        off = _int(f"mm[{i}].offset", offset, 0, _U32_MAX - 1)
        ln = _int(f"mm[{i}].length", length, 1, _U32_MAX)
        if off + ln > _U32_MAX:
            raise InvalidArgumentError(
                f"mm[{i}].length must keep offset + length < 2^32, got offset {off} and length {ln}"
            )
        out.append((off, ln, ident))
    out.sort()
    return out


def _pack_tokens(tokens: Any) -> bytes:
    dtype = getattr(tokens, "dtype", None)
    if dtype is not None and getattr(dtype, "kind", "") in "ui" and getattr(tokens, "ndim", 1) == 1:
        if len(tokens) == 0:
            return b""
        if int(tokens.min()) < 0 or int(tokens.max()) > _U32_MAX:
            tokens = tokens.tolist()  # falls through to the per-token error below
        else:
            return tokens.astype("<u4", copy=False).tobytes()
    elif dtype is not None:
        tokens = tokens.tolist()
    if not isinstance(tokens, (list, tuple)):
        tokens = list(tokens)
    try:
        return struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error:
        for i, t in enumerate(tokens):
            try:
                struct.pack("<I", t)
            except struct.error:
                raise InvalidArgumentError(
                    f"token {i} must be an integer in [0, 4294967295], got {t!r}"
                ) from None
        raise  # pragma: no cover


def hash_chunks(
    tokens: Sequence[int],
    chunk_size: int = 256,
    salt: str = "",
    partial: bool = False,
    lora: str | None = None,
    mm: Iterable[Any] | None = None,
) -> list[Chunk]:
    """Splits ``tokens`` into chunks of ``chunk_size`` and returns each chunk's chained hash.

    :param tokens: token ids, each an integer in [0, 2^32) (a list, tuple or integer array);
        every token is checked, including a trailing partial chunk that is not hashed.
    :param chunk_size: tokens per chunk, in [1, 2^20].
    :param salt: cache salt (tenant isolation), hashed as UTF-8.
    :param partial: also hash a trailing chunk shorter than ``chunk_size``.
    :param lora: the LoRA adapter's name (vLLM ``lora_request.lora_name``); None or "" = none.
    :param mm: extra-input spans, each ``(id, offset, length)`` or a dict with those keys:
        ``id`` bytes (or a string, hashed as UTF-8) of 1..1024 bytes, ``offset`` the first prompt
        token of the placeholder, ``length`` >= 1 tokens.
    :raises InvalidArgumentError: for a bad option or token (the message names it).
    """
    chunk_size = _int("chunk_size", chunk_size, 1, MAX_CHUNK_SIZE)
    if not isinstance(partial, bool):
        raise InvalidArgumentError(f"partial must be a boolean, got {partial!r}")
    prev = hash_seed(salt, lora)
    spans = _spans(mm) if mm else []
    packed = _pack_tokens(tokens)
    n = len(packed) // 4
    out: list[Chunk] = []
    start = 0
    while start < n:
        end = min(start + chunk_size, n)
        if end - start < chunk_size and not partial:
            break
        body = packed[start * 4 : end * 4]
        if spans:
            extra = b"".join(
                struct.pack("<III", off, ln, len(ident)) + ident
                for off, ln, ident in spans
                if off < end and off + ln > start
            )
            if extra:
                prev = _sha256(_sha256(_DOMAIN_MM + prev + extra).digest() + body).digest()
            else:
                prev = _sha256(prev + body).digest()
        else:
            prev = _sha256(prev + body).digest()
        out.append(Chunk(start, end, prev))
        start = end
    return out


def pack_hashes(chunks: Iterable[Chunk | bytes]) -> bytes:
    """The packed form of several hashes: the 32-byte digests concatenated in chunk order."""
    return b"".join(c if isinstance(c, (bytes, bytearray)) else c.hash for c in chunks)


def hash_to_hex(h: bytes) -> str:
    """A hash as 64 lowercase hex digits."""
    return bytes(h).hex()


def hex_to_hash(s: str) -> bytes:
    """Parses 64 lowercase hex digits; any other spelling is refused.

    :raises InvalidArgumentError: for anything but 64 lowercase hex digits.
    """
    if not isinstance(s, str) or _HEX64.fullmatch(s) is None:
        raise InvalidArgumentError(f"a hash must be 64 lowercase hex digits, got {s!r}")
    return bytes.fromhex(s)
