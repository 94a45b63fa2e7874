"""Namespace ids, byte-identical to docs/protocol.md section 9.2.

Every stored chunk belongs to a namespace capturing everything that changes its bytes; two
engines share KV exactly when their namespace ids are equal. The id is the first 16 bytes of the
SHA-256 of a canonical text encoding of the engine's configuration.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, NamedTuple

from ._validate import require_int as _int
from .errors import InvalidArgumentError

__all__ = [
    "DTYPE_BYTES",
    "MAX_PP_SIZE",
    "Namespace",
    "bytes_per_token",
    "canonical_encoding",
    "derive_namespace",
    "head_covers",
    "kv_head_range",
    "normalize_dtype",
]

NAMESPACE_TAG = "kvtier-ns/v2"
MAX_PP_SIZE = 1024
_MAX_DIM = 1 << 20
_MAX_LAYERS = 100_000
_MAX_MODEL_ID = 512

#: Canonical dtype names and their element size in bytes.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}

# `fp8` is vLLM's name for e4m3; float8_e4m3fnuz differs bit for bit and is deliberately absent.
_ALIASES: dict[str, str] = {
    "float32": "float32",
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
    "float16": "float16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float8_e4m3": "float8_e4m3",
    "float8_e4m3fn": "float8_e4m3",
    "fp8": "float8_e4m3",
    "fp8_e4m3": "float8_e4m3",
    "e4m3": "float8_e4m3",
    "float8_e5m2": "float8_e5m2",
    "fp8_e5m2": "float8_e5m2",
    "e5m2": "float8_e5m2",
    "int8": "int8",
    "uint8": "uint8",
}

# What JavaScript's String.prototype.trim() removes (the reference refuses ids it would change).
_JS_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_CONTROL = re.compile("[\x00-\x1f\x7f]")


class Namespace(NamedTuple):
    """A derived namespace: ``id`` (16 raw bytes, what the wire carries), ``hex`` (32 lowercase
    hex digits), ``label`` (for people and metrics; not hashed) and the canonical ``encoding``."""

    id: bytes
    hex: str
    label: str
    encoding: str


def normalize_dtype(dtype: Any, name: str = "dtype") -> str:
    """Maps a dtype spelling (``bf16``, ``torch.float16``, a ``torch.dtype``...) to its canonical
    name. Case-insensitive after trimming and removing a ``torch.`` prefix.

    :raises InvalidArgumentError: for an unknown dtype, ``auto`` and ``float8_e4m3fnuz`` included.
    """
    raw = dtype
    if not isinstance(dtype, str):
        # torch.dtype prints as "torch.bfloat16", numpy's dtype as "float16"
        raw = str(dtype) if type(dtype).__module__.split(".")[0] in ("torch", "numpy") else None
    if raw is None or raw == "":
        raise InvalidArgumentError(f"{name} must be a non-empty string, got {dtype!r}")
    key = raw.strip(_JS_SPACE).lower()
    if key.startswith("torch."):
        key = key[len("torch.") :]
    canonical = _ALIASES.get(key)
    if canonical is None:
        raise InvalidArgumentError(
            f"{name} must be one of {', '.join(DTYPE_BYTES)} (or an alias such as bf16, fp16, "
            f"half, fp8), got {dtype!r}"
        )
    return canonical




def _model_id(v: Any) -> str:
    if not isinstance(v, str) or v == "":
        raise InvalidArgumentError(f"namespace.model_id must be a non-empty string, got {v!r}")
    problem = None
    try:
        units = len(v.encode("utf-16-le", "surrogatepass")) // 2
    except UnicodeEncodeError:  # pragma: no cover - surrogatepass encodes everything
        units = len(v)
    if units > _MAX_MODEL_ID:
        problem = f"at most {_MAX_MODEL_ID} characters"
    elif v.strip(_JS_SPACE) != v:
        problem = "without leading or trailing whitespace"
    elif _CONTROL.search(v):
        problem = "without control characters"
    else:
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            problem = "well-formed Unicode (no lone surrogates)"
    if problem is not None:
        raise InvalidArgumentError(f"namespace.model_id must be {problem}, got {v!r}")
    return v


def _spec(
    model_id: Any,
    dtype: Any,
    num_layers: Any,
    num_kv_heads: Any,
    head_dim: Any,
    block_size: Any,
    tp_size: Any,
    tp_rank: Any,
    mla: Any,
    layout_version: Any,
    pp_size: Any,
    pp_rank: Any,
    pp_first_layer: Any,
) -> dict[str, Any]:
    s: dict[str, Any] = {}
    s["model_id"] = _model_id(model_id)
    s["dtype"] = normalize_dtype(dtype, "namespace.dtype")
    s["num_layers"] = _int("namespace.num_layers", num_layers, 1, _MAX_LAYERS)
    s["num_kv_heads"] = _int("namespace.num_kv_heads", num_kv_heads, 1, _MAX_DIM)
    s["head_dim"] = _int("namespace.head_dim", head_dim, 1, _MAX_DIM)
    s["block_size"] = _int("namespace.block_size", block_size, 1, _MAX_DIM)
    if not isinstance(mla, bool):
        raise InvalidArgumentError(f"namespace.mla must be a boolean, got {mla!r}")
    s["mla"] = mla
    s["tp_size"] = _int("namespace.tp_size", tp_size, 1, 65536)
    s["tp_rank"] = _int("namespace.tp_rank", tp_rank, 0, s["tp_size"] - 1)
    s["layout_version"] = _int("namespace.layout_version", layout_version, 1, 65535)
    s["pp_size"] = _int("namespace.pp_size", pp_size, 1, MAX_PP_SIZE)
    s["pp_rank"] = _int("namespace.pp_rank", pp_rank, 0, s["pp_size"] - 1)
    s["pp_first_layer"] = _int("namespace.pp_first_layer", pp_first_layer, 0, _MAX_LAYERS)
    if s["pp_size"] == 1 and s["pp_first_layer"] != 0:
        raise InvalidArgumentError(
            "namespace.pp_first_layer must be 0 when namespace.pp_size is 1 (the only stage "
            f"starts at layer 0), got {s['pp_first_layer']}"
        )
    heads, tp = s["num_kv_heads"], s["tp_size"]
    if not mla and heads % tp != 0 and tp % heads != 0:
        raise InvalidArgumentError(
            f"namespace.num_kv_heads ({heads}) and namespace.tp_size ({tp}) must divide one "
            "another (heads are split or replicated across ranks)"
        )
    return s


def _head_range(s: dict[str, Any]) -> tuple[int, int]:
    heads, tp, rank = s["num_kv_heads"], s["tp_size"], s["tp_rank"]
    if s["mla"]:
        return (0, heads)
    if tp >= heads:
        h = rank * heads // tp
        return (h, h + 1)
    per = heads // tp
    return (rank * per, (rank + 1) * per)


def _encode(s: dict[str, Any], heads: tuple[int, int]) -> str:
    mla = s["mla"]
    lines = [
        NAMESPACE_TAG,
        f"model_id={s['model_id']}",
        f"dtype={s['dtype']}",
        f"num_layers={s['num_layers']}",
        f"num_kv_heads={s['num_kv_heads']}",
        f"head_dim={s['head_dim']}",
        f"block_size={s['block_size']}",
        f"mla={1 if mla else 0}",
        f"kv_head_start={'*' if mla else heads[0]}",
        f"kv_head_end={'*' if mla else heads[1]}",
        f"layout_version={s['layout_version']}",
    ]
    if s["pp_size"] > 1:
        lines += [
            f"pp_size={s['pp_size']}",
            f"pp_rank={s['pp_rank']}",
            f"pp_first_layer={s['pp_first_layer']}",
        ]
    return "\n".join(lines) + "\n"


def canonical_encoding(**kwargs: Any) -> str:
    """The canonical text whose SHA-256 prefix is the id (same arguments as
    :func:`derive_namespace`)."""
    return derive_namespace(**kwargs).encoding


def derive_namespace(
    *,
    model_id: str,
    dtype: Any,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    tp_size: int = 1,
    tp_rank: int = 0,
    mla: bool = False,
    layout_version: int = 1,
    pp_size: int = 1,
    pp_rank: int = 0,
    pp_first_layer: int = 0,
) -> Namespace:
    """Derives the namespace of an engine rank: it holds the KV heads of the rank
    (:func:`kv_head_range`), not its TP size and rank, so a rank of an engine at another TP size
    that holds the same heads has the same namespace.

    ``num_kv_heads`` is the model's total KV heads (for MLA: latents per layer, 1 for DeepSeek);
    ``head_dim`` the head (or latent) width; with ``pp_size`` > 1, ``num_layers`` is this stage's
    layer count and ``pp_first_layer`` the model index of its first layer. MLA ranks share one
    namespace (tp does not enter the id); pipeline stages never do.

    :raises InvalidArgumentError: naming the first bad field and what is allowed.
    """
    s = _spec(
        model_id,
        dtype,
        num_layers,
        num_kv_heads,
        head_dim,
        block_size,
        tp_size,
        tp_rank,
        mla,
        layout_version,
        pp_size,
        pp_rank,
        pp_first_layer,
    )
    return _derive(s, _head_range(s))


def _derive(s: dict[str, Any], heads: tuple[int, int]) -> Namespace:
    enc = _encode(s, heads)
    ident = hashlib.sha256(enc.encode("utf-8")).digest()[:16]
    parallel = "mla" if s["mla"] else f"h{heads[0]}-{heads[1]}"
    if s["pp_size"] > 1:
        parallel += f"/pp{s['pp_size']}r{s['pp_rank']}@L{s['pp_first_layer']}"
    label = (
        f"{s['model_id']}/{s['dtype']}/L{s['num_layers']}/H{s['num_kv_heads']}x{s['head_dim']}"
        f"/B{s['block_size']}/{parallel}/v{s['layout_version']}"
    )
    return Namespace(ident, ident.hex(), label, enc)


def _spec_of(kwargs: dict[str, Any]) -> dict[str, Any]:
    return _spec(
        kwargs["model_id"],
        kwargs["dtype"],
        kwargs["num_layers"],
        kwargs["num_kv_heads"],
        kwargs["head_dim"],
        kwargs["block_size"],
        kwargs.get("tp_size", 1),
        kwargs.get("tp_rank", 0),
        kwargs.get("mla", False),
        kwargs.get("layout_version", 1),
        kwargs.get("pp_size", 1),
        kwargs.get("pp_rank", 0),
        kwargs.get("pp_first_layer", 0),
    )


def kv_head_range(**kwargs: Any) -> tuple[int, int]:
    """The KV heads ``[start, end)`` the rank holds (same arguments as :func:`derive_namespace`):
    ``num_kv_heads / tp_size`` heads from ``tp_rank * num_kv_heads / tp_size``; with more ranks
    than heads the one head ``tp_rank * num_kv_heads // tp_size`` (replicated as vLLM does); all
    of them for MLA."""
    return _head_range(_spec_of(kwargs))


def head_covers(**kwargs: Any) -> list[tuple[int, list[tuple[int, int, Namespace]]]]:
    """Every way the rank can assemble its KV heads from chunks saved at another TP size (same
    arguments as :func:`derive_namespace`): for each other divisor ``width`` of ``num_kv_heads``,
    ``(width, [(start, end, namespace), ...])``, the shards of that width overlapping the rank's
    heads in head order; fewest shards first, then by width. Empty for MLA. Mirrors
    ``headCovers`` in src/namespace/namespace.ts."""
    s = _spec_of(kwargs)
    if s["mla"]:
        return []
    a, b = _head_range(s)
    heads = s["num_kv_heads"]
    out = []
    for width in range(1, heads + 1):
        if heads % width != 0 or width == b - a:
            continue
        shards = [
            (start, start + width, _derive(s, (start, start + width)))
            for start in range(a // width * width, b, width)
        ]
        out.append((width, shards))
    out.sort(key=lambda c: (len(c[1]), c[0]))
    return out


def bytes_per_token(
    *,
    dtype: Any,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    tp_size: int = 1,
    mla: bool = False,
    **_ignored: Any,
) -> int:
    """KV bytes one rank stores per token over all its layers:
    ``2 * num_layers * max(1, num_kv_heads / tp_size) * head_dim * dtype_bytes``, or for MLA
    ``num_layers * num_kv_heads * head_dim * dtype_bytes`` on every rank. Accepts (and ignores)
    the other keyword arguments of :func:`derive_namespace`.

    :raises InvalidArgumentError: for invalid values.
    """
    size = DTYPE_BYTES[normalize_dtype(dtype)]
    layers = _int("num_layers", num_layers, 1, _MAX_LAYERS)
    heads = _int("num_kv_heads", num_kv_heads, 1, _MAX_DIM)
    dim = _int("head_dim", head_dim, 1, _MAX_DIM)
    if mla:
        return layers * heads * dim * size
    tp = _int("tp_size", tp_size, 1, 65536)
    if heads % tp != 0 and tp % heads != 0:
        raise InvalidArgumentError(
            f"num_kv_heads ({heads}) and tp_size ({tp}) must divide one another"
        )
    return 2 * layers * max(1, heads // tp) * dim * size
