"""Turning an engine's KV caches into a REGISTER registration (docs/protocol.md section 4.9).

The sidecar copies KV bytes itself, so a worker hands it *where* its KV cache lives: per layer a
K and a V region (one latent region for MLA), each a base location plus ``offsetBytes`` of block 0,
and one ``blockStrideBytes`` shared by every region. Two kinds of memory are supported:

* **host** (no GPU, and every CI test): numpy arrays or CPU tensors backed by a shared-memory file
  (``/dev/shm``), see :mod:`kvtier_vllm.host_memory`. :func:`allocate_host_kv_cache` makes such a
  cache; arrays that are views of an ``np.memmap`` or that lie in a file given to
  :func:`register_shared_file` are found by address.
* **cuda**: per-layer torch tensors. Each storage is exported with PyTorch's
  ``untyped_storage()._share_cuda_()``; :func:`parse_share_cuda` reads its handle format
  (a version byte and a type byte before the 64-byte ``cudaIpcMemHandle_t`` since PyTorch 2.2, the
  bare 64 bytes before that) and the storage's offset inside the ``cudaMalloc`` allocation.
  Memory from expandable segments cannot be opened with ``cudaIpcOpenMemHandle`` and is refused.

Per-layer shapes (logical, as vLLM's attention backends hand them to connectors):

============== =================================================== ===================
layout          shape                                               regions
============== =================================================== ===================
``flash_attn``  ``[2, num_blocks, block_size, kv_heads, head_dim]`` K = [0], V = [1]
``flashinfer``  ``[num_blocks, 2, block_size, kv_heads, head_dim]`` K = [:, 0], V = [:, 1]
``mla``         ``[num_blocks, block_size, latent_dim]``            one latent region
``kv_pair``     a ``(k, v)`` pair of ``[num_blocks, block_size, kv_heads, head_dim]``
============== =================================================== ===================

Inside a block the bytes are either token-major (``NHD``: ``[block_size, kv_heads, head_dim]``
contiguous) or head-major (``HND``: ``[kv_heads, block_size, head_dim]``, vLLM's
``kv_cache_layout=HND``, seen as a permuted view; vLLM's CPU backend allocates this shape). The
registration names the order as ``blockLayout``; the sidecar stores every chunk token-major and
reorders HND blocks on copy, so the order does not enter the namespace (``layoutVersion`` is
:data:`STORED_LAYOUT_VERSION` for every engine) and NHD and HND engines share KV. Everything here
except :func:`describe_cuda_tensor` works on duck-typed tensors (``shape``, ``stride()`` or
``strides``, ``itemsize`` or ``element_size()``), so it is testable without torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .errors import InvalidArgumentError
from .host_memory import (
    HostKvCache,
    RegionSource,
    allocate_host_kv_cache,
    describe_host_tensor,
    register_shared_file,
    unregister_shared_file,
)

__all__ = [
    "LAYOUTS",
    "LAYOUT_VERSIONS",
    "STORED_LAYOUT_VERSION",
    "ExpandableSegmentsError",
    "LayerGeometry",
    "RegionSource",
    "layer_geometry",
    "layout_version",
    "parse_share_cuda",
    "describe_host_tensor",
    "describe_cuda_tensor",
    "register_shared_file",
    "unregister_shared_file",
    "HostKvCache",
    "allocate_host_kv_cache",
    "order_layers",
    "build_registration",
]

#: Per-layer tensor layouts understood by :func:`layer_geometry`.
LAYOUTS = ("flash_attn", "flashinfer", "mla", "kv_pair")

#: ``layoutVersion`` of the stored form (token-major blocks), which enters the namespace. Until
#: the sidecar reordered HND blocks on copy, HND engines registered version 2 and stored HND bytes;
#: nothing derives version 2 any more, so those chunks are never read as this form.
STORED_LAYOUT_VERSION = 1

#: In-block byte order -> the ``layoutVersion`` that enters the namespace: the stored form's, for
#: both orders.
LAYOUT_VERSIONS = {"NHD": STORED_LAYOUT_VERSION, "HND": STORED_LAYOUT_VERSION}

_EXPANDABLE_HINT = (
    "CUDA memory from PyTorch expandable segments cannot be shared with the kvtier sidecar "
    "through cudaIpcOpenMemHandle; start vLLM with "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False (and do not enable expandable segments "
    "in vLLM's own allocator settings)"
)


class ExpandableSegmentsError(InvalidArgumentError):
    """The KV cache lives in PyTorch expandable segments, which CUDA IPC handles cannot cover."""

    def __init__(self, message: str = _EXPANDABLE_HINT, code: str | None = None) -> None:
        super().__init__(message, code)


def layout_version(in_block: str) -> int:
    """``layoutVersion`` of the namespace for an engine whose blocks are ``in_block`` (``'NHD'`` or
    ``'HND'``): :data:`STORED_LAYOUT_VERSION` for both, since the stored form does not depend on it.

    :raises InvalidArgumentError: for another name.
    """
    key = str(in_block).upper()
    if key not in LAYOUT_VERSIONS:
        raise InvalidArgumentError(f"kv layout must be one of {sorted(LAYOUT_VERSIONS)}, got {in_block!r}")
    return LAYOUT_VERSIONS[key]


# --------------------------------------------------------------------------- duck typing


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _itemsize(t: Any) -> int:
    if hasattr(t, "element_size") and callable(t.element_size):
        return int(t.element_size())
    if hasattr(t, "itemsize"):
        return int(t.itemsize)
    return int(t.dtype.itemsize)


def _strides_elems(t: Any) -> tuple[int, ...]:
    """Strides in elements: torch's ``stride()``, or numpy's byte ``strides`` / itemsize."""
    st = getattr(t, "stride", None)
    if callable(st):
        return tuple(int(s) for s in st())
    size = _itemsize(t)
    out = []
    for s in t.strides:
        if s % size:
            raise InvalidArgumentError(f"a stride of {s} bytes is not a whole number of {size}-byte elements")
        out.append(s // size)
    return tuple(out)


# --------------------------------------------------------------------------- geometry


@dataclass(frozen=True)
class LayerGeometry:
    """Where a layer's regions are, relative to its tensor's first element (bytes)."""

    layout: str
    in_block: str  # 'NHD' or 'HND'; 'any' when one head (or one token) makes them identical
    num_blocks: int
    block_size: int
    num_heads: int  # per rank; 1 for MLA
    head_dim: int  # latent width for MLA
    itemsize: int
    block_stride_bytes: int
    k_offset_bytes: int
    v_offset_bytes: int | None  # None for MLA

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of one region."""
        return self.block_size * self.num_heads * self.head_dim * self.itemsize

    @property
    def regions(self) -> int:
        return 1 if self.v_offset_bytes is None else 2


def _in_block(strides: Sequence[int], bs: int, h: int, d: int) -> str | None:
    """NHD / HND / 'any' from the strides (elements) of the block's (bs, h, d) dims; None: neither."""
    sb, sh, sd = strides
    if d > 1 and sd != 1:
        return None
    nhd = (h == 1 or sh == d) and (bs == 1 or sb == h * d)
    hnd = (bs == 1 or sb == d) and (h == 1 or sh == bs * d)
    if nhd and hnd:
        return "any"
    return "NHD" if nhd else "HND" if hnd else None


def _guess_layout(shape: tuple[int, ...]) -> str:
    if len(shape) == 3:
        return "mla"
    if len(shape) != 5:
        raise InvalidArgumentError(
            f"cannot tell the KV layout of a tensor of shape {list(shape)}: expected "
            "[2, num_blocks, block_size, kv_heads, head_dim] (FlashAttention), "
            "[num_blocks, 2, block_size, kv_heads, head_dim] (FlashInfer) or "
            "[num_blocks, block_size, latent] (MLA)"
        )
    fa = shape[0] == 2
    fi = shape[1] == 2
    if fa and not fi:
        return "flash_attn"
    if fi and not fa:
        return "flashinfer"
    raise InvalidArgumentError(
        f"the KV layout of shape {list(shape)} is ambiguous; pass layout='flash_attn' or 'flashinfer'"
    )


def layer_geometry(tensor: Any, layout: str = "auto") -> LayerGeometry:
    """The region geometry of one layer's KV tensor (or ``(k, v)`` pair, see ``kv_pair``).

    Strides may be anything vLLM produces: the block dimension may be padded
    (``blockStrideBytes`` > block bytes), and the in-block order NHD or HND; a block's own bytes
    must be contiguous.

    :raises InvalidArgumentError: for an unknown or unsupported layout, non-contiguous blocks,
        or K and V regions of different shapes.
    """
    if isinstance(tensor, (tuple, list)):
        if len(tensor) != 2:
            raise InvalidArgumentError(f"a layer given as a sequence must be a (k, v) pair, got {len(tensor)} items")
        if layout not in ("auto", "kv_pair"):
            raise InvalidArgumentError(f"a (k, v) pair has layout 'kv_pair', not {layout!r}")
        return _pair_geometry(tensor[0], tensor[1])
    shape = _shape(tensor)
    if layout == "auto":
        layout = _guess_layout(shape)
    if layout not in LAYOUTS or layout == "kv_pair":
        raise InvalidArgumentError(f"layout must be 'auto' or one of {list(LAYOUTS[:3])}, got {layout!r}")
    strides = _strides_elems(tensor)
    size = _itemsize(tensor)
    if any(s < 0 for s in strides):
        raise InvalidArgumentError(f"negative strides are not supported: {list(strides)}")
    if layout == "mla":
        if len(shape) != 3:
            raise InvalidArgumentError(f"an MLA layer is [num_blocks, block_size, latent], got shape {list(shape)}")
        nb, bs, d = shape
        if not ((bs == 1 or strides[1] == d) and (d == 1 or strides[2] == 1)):
            raise InvalidArgumentError(f"an MLA block must be contiguous; strides {list(strides)} for shape {list(shape)}")
        geo = LayerGeometry("mla", "NHD", nb, bs, 1, d, size, strides[0] * size, 0, None)
    else:
        if len(shape) != 5:
            raise InvalidArgumentError(f"layout {layout!r} needs a 5-dimensional tensor, got shape {list(shape)}")
        if layout == "flash_attn":
            two, nb, bs, h, d = shape
            kv_stride, blk_stride = strides[0], strides[1]
        else:
            nb, two, bs, h, d = shape
            blk_stride, kv_stride = strides[0], strides[1]
        if two != 2:
            raise InvalidArgumentError(f"layout {layout!r}: the K/V dimension of shape {list(shape)} is not 2")
        order = _in_block(strides[2:], bs, h, d)
        if order is None:
            raise InvalidArgumentError(
                f"a KV block must be contiguous (NHD or HND); strides {list(strides)} for shape {list(shape)}"
            )
        geo = LayerGeometry(layout, order, nb, bs, h, d, size, blk_stride * size, 0, kv_stride * size)
    _check_blocks_disjoint(geo)
    return geo


def _pair_geometry(k: Any, v: Any) -> LayerGeometry:
    shapes = (_shape(k), _shape(v))
    if shapes[0] != shapes[1] or len(shapes[0]) != 4:
        raise InvalidArgumentError(f"a (k, v) pair needs two [num_blocks, block_size, kv_heads, head_dim] tensors, got {shapes}")
    sk, sv = _strides_elems(k), _strides_elems(v)
    if sk != sv or _itemsize(k) != _itemsize(v):
        raise InvalidArgumentError("the K and V tensors of a layer must have the same strides and dtype")
    nb, bs, h, d = shapes[0]
    order = _in_block(sk[1:], bs, h, d)
    if order is None:
        raise InvalidArgumentError(f"a KV block must be contiguous (NHD or HND); strides {list(sk)}")
    size = _itemsize(k)
    # V's offset is relative to V's own tensor: the caller describes each tensor's location.
    geo = LayerGeometry("kv_pair", order, nb, bs, h, d, size, sk[0] * size, 0, 0)
    _check_blocks_disjoint(geo)
    return geo


def _check_blocks_disjoint(geo: LayerGeometry) -> None:
    if geo.block_stride_bytes < geo.block_bytes:
        raise InvalidArgumentError(
            f"blocks overlap: block stride {geo.block_stride_bytes} bytes < block size {geo.block_bytes} bytes"
        )
    if geo.v_offset_bytes and geo.layout != "kv_pair":
        # K and V of one block must not overlap either (FlashInfer interleaves them per block).
        if abs(geo.v_offset_bytes) < geo.block_bytes:
            raise InvalidArgumentError("K and V regions overlap")


# --------------------------------------------------------------------------- CUDA


def parse_share_cuda(share: Sequence[Any]) -> tuple[int, bytes, int, int]:
    """Reads ``untyped_storage()._share_cuda_()``: ``(device_index, ipc_handle (64 bytes),
    storage_size_bytes, storage_offset_bytes)``.

    The tuple is ``(device, handle, size_bytes, offset_bytes, ref_counter, ref_counter_offset,
    event_handle, event_sync_required)``. ``handle`` is, since PyTorch 2.2, a version byte, a type
    byte (``'c'``: ``cudaMalloc`` memory, then the 64-byte ``cudaIpcMemHandle_t``; ``'e'``: an
    expandable segment) and the payload; before that, the 64 bytes alone. ``offset_bytes`` is the
    storage's offset inside the allocation the handle opens.

    :raises ExpandableSegmentsError: for expandable-segment memory.
    :raises InvalidArgumentError: for a handle in another format.
    """
    if len(share) < 4:
        raise InvalidArgumentError(f"_share_cuda_() returned {len(share)} items, expected 8")
    device, handle, size_bytes, offset_bytes = share[0], share[1], share[2], share[3]
    if handle is None:
        raise InvalidArgumentError("the CUDA storage has no memory (empty tensor)")
    handle = bytes(handle)
    if len(handle) == 64:
        raw = handle
    elif len(handle) >= 2 and handle[1:2] == b"e":
        raise ExpandableSegmentsError()
    elif len(handle) == 66 and handle[1:2] == b"c" and 1 <= handle[0] <= 16:
        raw = handle[2:]
    else:
        raise InvalidArgumentError(
            f"unrecognized PyTorch CUDA IPC handle ({len(handle)} bytes, starting {handle[:2].hex()}); "
            "expected 64 bytes, or a version byte, 'c' and 64 bytes"
        )
    return int(device), raw, int(size_bytes), int(offset_bytes)


def describe_cuda_tensor(tensor: Any) -> RegionSource:
    """Exports a CUDA tensor's storage for the sidecar: IPC handle, allocation size seen so far,
    offset of the tensor's first element inside the allocation, device index and UUID. Needs torch.

    :raises ExpandableSegmentsError: when the storage comes from expandable segments.
    """
    import torch

    storage = tensor.untyped_storage()
    try:
        share = storage._share_cuda_()
    except RuntimeError as err:  # older PyTorch refuses expandable segments itself
        if "expandable_segments" in str(err):
            raise ExpandableSegmentsError() from err
        raise
    device, handle, size_bytes, storage_offset = parse_share_cuda(share)
    within_storage = int(tensor.data_ptr()) - int(storage.data_ptr())
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    uuid_text = None if uuid is None else str(uuid)
    if uuid_text is not None and not uuid_text.upper().startswith("GPU-"):
        uuid_text = "GPU-" + uuid_text
    return RegionSource(
        "cuda",
        storage_offset + within_storage,
        ipc_handle=handle.hex(),
        allocation_bytes=storage_offset + size_bytes,
        device_index=device,
        device_uuid=uuid_text,
    )


# --------------------------------------------------------------------------- registration

_INT = re.compile(r"\d+")


def order_layers(kv_caches: Mapping[str, Any] | Sequence[Any]) -> list[tuple[str, Any]]:
    """Layers in model order: by the layer index in each name (vLLM: ``model.layers.<i>.…``)
    when every name has one, else in the given order."""
    if not isinstance(kv_caches, Mapping):
        return [(str(i), t) for i, t in enumerate(kv_caches)]
    items = list(kv_caches.items())
    keys = []
    for name, _ in items:
        nums = _INT.findall(name)
        if not nums:
            return items
        keys.append(tuple(int(n) for n in nums))
    order = sorted(range(len(items)), key=lambda i: keys[i])
    return [items[i] for i in order]


def _describe(t: Any, device: str) -> RegionSource:
    return describe_cuda_tensor(t) if device == "cuda" else describe_host_tensor(t)


def _is_cuda(t: Any) -> bool:
    if isinstance(t, (tuple, list)):
        return _is_cuda(t[0])
    return bool(getattr(t, "is_cuda", False))


def _region(src: RegionSource, extra: int) -> dict:
    if src.device == "host":
        return {"path": src.path, "offsetBytes": src.offset_bytes + extra}
    return {
        "ipcHandle": src.ipc_handle,
        "allocationBytes": src.allocation_bytes,
        "offsetBytes": src.offset_bytes + extra,
    }


def build_registration(
    kv_caches: Mapping[str, Any] | Sequence[Any],
    *,
    engine_id: str,
    model_id: str,
    dtype: str,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    tp_size: int = 1,
    tp_rank: int = 0,
    mla: bool = False,
    chunk_size: int = 256,
    layout: str = "auto",
    kv_layout: str | None = None,
    pp_size: int = 1,
    pp_rank: int = 0,
    pp_first_layer: int = 0,
    device: str = "auto",
    describe: Any = None,
    state_file: Mapping[str, Any] | None = None,
) -> dict:
    """The REGISTER JSON for a worker's KV caches (``kv_caches``: layer name -> tensor, or a list
    in model order). ``num_kv_heads`` is the model's total KV heads (per-rank heads are derived by
    the sidecar); for MLA the latents per layer (1) and ``head_dim`` the latent width.

    The in-block order the tensors show (NHD or HND) is sent as ``blockLayout``; it does not enter
    the namespace (``layoutVersion`` is :data:`STORED_LAYOUT_VERSION`), so it never has to match
    what the scheduler assumes. ``kv_layout`` (``'NHD'``/``'HND'``) is checked for its spelling and
    used only when the tensors cannot show an order (one head and one token per block, where both
    are the same bytes). ``describe`` replaces the tensor locator (tests).

    :raises InvalidArgumentError: for tensors that do not match the model shape or each other.
    :raises ExpandableSegmentsError: for CUDA memory from expandable segments.
    """
    layers = order_layers(kv_caches)
    if not layers:
        raise InvalidArgumentError("no KV cache layers to register")
    if device == "auto":
        device = "cuda" if _is_cuda(layers[0][1]) else "host"
    if device not in ("host", "cuda"):
        raise InvalidArgumentError(f"device must be 'auto', 'host' or 'cuda', got {device!r}")
    locate = describe or (lambda t: _describe(t, device))
    geos = [layer_geometry(t, "auto" if isinstance(t, (tuple, list)) else layout) for _, t in layers]
    g0 = geos[0]
    for (name, _), g in zip(layers, geos):
        if (g.num_blocks, g.block_size, g.block_stride_bytes, g.block_bytes) != (
            g0.num_blocks,
            g0.block_size,
            g0.block_stride_bytes,
            g0.block_bytes,
        ):
            raise InvalidArgumentError(
                f"layer {name}: {g.num_blocks} blocks of {g.block_bytes} bytes every {g.block_stride_bytes} "
                f"differs from the first layer's {g0.num_blocks} of {g0.block_bytes} every {g0.block_stride_bytes}; "
                "kvtier needs one block geometry for every layer"
            )
    if (g0.layout == "mla") != bool(mla):
        raise InvalidArgumentError(f"mla={bool(mla)} but the KV tensors have layout {g0.layout!r}")
    if g0.block_size != block_size:
        raise InvalidArgumentError(f"the KV tensors hold {g0.block_size} tokens per block, the config says {block_size}")
    shown = {g.in_block for g in geos} - {"any"}
    if len(shown) > 1:
        raise InvalidArgumentError("layers mix NHD and HND blocks")
    if kv_layout:
        layout_version(kv_layout)
    order = "NHD" if mla else (shown.pop() if shown else str(kv_layout or "NHD").upper())

    regions_by_handle: dict[str, int] = {}
    uuids: set = set()
    layer_specs: list[tuple[dict, dict | None]] = []
    for (name, t), g in zip(layers, geos):
        if g.layout == "kv_pair":
            ks, vs = locate(t[0]), locate(t[1])
            k, v = _region(ks, 0), _region(vs, 0)
            srcs = (ks, vs)
        else:
            s = locate(t)
            k = _region(s, g.k_offset_bytes)
            v = None if g.v_offset_bytes is None else _region(s, g.v_offset_bytes)
            srcs = (s,)
        for src in srcs:
            if src.device == "cuda":
                uuids.add(src.device_uuid)
                h = src.ipc_handle
                regions_by_handle[h] = max(regions_by_handle.get(h, 0), int(src.allocation_bytes or 0))
        layer_specs.append((k, v))
    reg: dict[str, Any] = {
        "engineId": engine_id,
        "device": device,
        "modelId": model_id,
        "dtype": str(dtype),
        "numKvHeads": int(num_kv_heads),
        "headDim": int(head_dim),
        "tpSize": int(tp_size),
        "tpRank": int(tp_rank),
        "mla": bool(mla),
        "numBlocks": g0.num_blocks,
        "blockSize": g0.block_size,
        "blockStrideBytes": g0.block_stride_bytes,
        "bytesPerTokenPerLayer": g0.block_bytes // g0.block_size,
        "chunkSize": int(chunk_size),
        "layoutVersion": STORED_LAYOUT_VERSION,
        "layers": [],
    }
    if not mla:
        reg["blockLayout"] = order
    if pp_size != 1:
        reg.update({"ppSize": int(pp_size), "ppRank": int(pp_rank), "ppFirstLayer": int(pp_first_layer)})
    for k, v in layer_specs:
        for r in (k, v):
            if r is not None and "ipcHandle" in r:
                # The sidecar opens each allocation once: give every region of it the largest extent seen.
                r["allocationBytes"] = regions_by_handle[r["ipcHandle"]]
        reg["layers"].append({"k": k} if v is None else {"k": k, "v": v})
    uuids.discard(None)
    if len(uuids) > 1:
        raise InvalidArgumentError(f"the KV tensors are on several GPUs: {sorted(uuids)}")
    if uuids:
        reg["deviceUuid"] = uuids.pop()
    if state_file is not None:
        reg["stateFile"] = dict(state_file)
    return reg
