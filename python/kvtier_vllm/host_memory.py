"""Host-device KV caches: tensors in shared-memory files the sidecar opens (docs/protocol.md 4.9).

A host tensor is located in its file by address: arrays lying in a file declared with
:func:`register_shared_file` (which :func:`allocate_host_kv_cache` does), or views of an
``np.memmap``. A declaration lasts as long as the array it names (or until
:func:`unregister_shared_file`), so memory that later reuses the same addresses is never taken
for the old file.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgumentError

__all__ = [
    "RegionSource",
    "register_shared_file",
    "unregister_shared_file",
    "describe_host_tensor",
    "HostKvCache",
    "allocate_host_kv_cache",
]


def _data_ptr(t: Any) -> int:
    dp = getattr(t, "data_ptr", None)
    if callable(dp):
        return int(dp())
    return int(t.__array_interface__["data"][0])


@dataclass(frozen=True)
class RegionSource:
    """Where a tensor's first byte is: a host file, or a CUDA IPC allocation."""

    device: str  # 'host' | 'cuda'
    offset_bytes: int  # of the tensor's first element inside the file / allocation
    path: str | None = None
    ipc_handle: str | None = None  # 128 hex digits
    allocation_bytes: int | None = None
    device_index: int | None = None
    device_uuid: str | None = None


@dataclass
class _Shared:
    address: int
    length: int
    path: str
    file_offset: int
    alive: Any  # () -> bool: the declared array still exists


_shared_lock = threading.Lock()
_shared_files: list[_Shared] = []


def _liveness(array: Any):
    try:
        ref = weakref.ref(array)
    except TypeError:  # not weak-referenceable (e.g. a bytearray): lives until unregistered
        return lambda: True
    return lambda: ref() is not None


def register_shared_file(path: str, array: Any, file_offset: int = 0) -> None:
    """Declares that ``array``'s memory maps ``path`` from ``file_offset`` on, so tensors that lie
    inside it are found by :func:`describe_host_tensor`, for as long as ``array`` lives (keep it
    while the KV cache is in use) or until :func:`unregister_shared_file`. ``path`` must be
    absolute."""
    if not os.path.isabs(path):
        raise InvalidArgumentError(f"a shared-memory file path must be absolute, got {path!r}")
    nbytes = int(array.nbytes) if hasattr(array, "nbytes") else len(memoryview(array).cast("B"))
    entry = _Shared(_data_ptr(array), nbytes, path, int(file_offset), _liveness(array))
    with _shared_lock:
        _shared_files[:] = [e for e in _shared_files if e.alive()]
        _shared_files.append(entry)


def unregister_shared_file(path: str) -> int:
    """Forgets every declaration of ``path``; returns how many there were."""
    with _shared_lock:
        before = len(_shared_files)
        _shared_files[:] = [e for e in _shared_files if e.path != path and e.alive()]
        return before - len(_shared_files)


def _memmap_of(array: Any) -> tuple[str, int] | None:
    """(path, file offset of ``array``'s first byte) when it is a view of an ``np.memmap``: the
    memmap that owns the mapping (its base is the ``mmap``) holds its file offset; any view's
    offset is that plus the distance between their first bytes."""
    base = array
    while base is not None:
        parent = getattr(base, "base", None)
        if isinstance(parent, mmap.mmap) and getattr(base, "filename", None) and hasattr(base, "offset"):
            return os.path.abspath(base.filename), int(base.offset) + _data_ptr(array) - _data_ptr(base)
        base = parent
    return None


def describe_host_tensor(tensor: Any, path: str | None = None, file_offset: int | None = None) -> RegionSource:
    """Locates a host tensor (numpy array or CPU torch tensor) in its shared-memory file.

    With ``path`` (and the file offset of the tensor's first byte) nothing is looked up;
    otherwise the tensor must lie in a file given to :func:`register_shared_file` (which
    :func:`allocate_host_kv_cache` does) or be a view of an ``np.memmap``.

    :raises InvalidArgumentError: when the tensor's file cannot be found.
    """
    if path is not None:
        if not os.path.isabs(path):
            raise InvalidArgumentError(f"path must be absolute, got {path!r}")
        return RegionSource("host", int(file_offset or 0), path=path)
    addr = _data_ptr(tensor)
    with _shared_lock:
        for e in reversed(_shared_files):
            if e.address <= addr < e.address + e.length and e.alive():
                return RegionSource("host", e.file_offset + addr - e.address, path=e.path)
    found = _memmap_of(tensor)
    if found is not None:
        return RegionSource("host", found[1], path=found[0])
    raise InvalidArgumentError(
        "a host KV tensor must live in a shared-memory file the sidecar can open: allocate it with "
        "kvtier_vllm.kv_caches.allocate_host_kv_cache, map it with np.memmap, or declare its file "
        "with register_shared_file"
    )


@dataclass
class HostKvCache:
    """A KV cache in one shared-memory file: ``layers[i]`` is layer i's array (``layout`` shape)."""

    path: str
    layers: list
    layout: str
    _mmap: Any = None

    def close(self, unlink: bool = True) -> None:
        """Drops the arrays and the file's declaration and, by default, removes the file."""
        unregister_shared_file(self.path)
        self.layers = []
        mm, self._mmap = self._mmap, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # numpy views still export the buffer; the mapping goes with them
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def allocate_host_kv_cache(
    path: str,
    *,
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_heads: int,
    head_dim: int,
    dtype: str = "float16",
    layout: str = "flash_attn",
    in_block: str = "NHD",
    block_pad_bytes: int = 0,
) -> HostKvCache:
    """Creates a KV cache in a new shared-memory file (e.g. under ``/dev/shm``) for the host device.

    Layer arrays are views of one ``mmap`` of ``path`` with the logical shape of ``layout``
    (``in_block='HND'`` gives vLLM's permuted view of head-major blocks). ``block_pad_bytes``
    adds padding after every block (and K/V pair), to exercise ``blockStrideBytes`` > block bytes.
    Needs numpy.
    """
    import numpy as np

    if layout not in ("flash_attn", "flashinfer", "mla"):
        raise InvalidArgumentError(f"layout must be flash_attn, flashinfer or mla, got {layout!r}")
    if not os.path.isabs(path):
        raise InvalidArgumentError(f"path must be absolute, got {path!r}")
    dt = np.dtype(dtype)
    heads = 1 if layout == "mla" else num_heads
    block_bytes = block_size * heads * head_dim * dt.itemsize
    if block_pad_bytes % dt.itemsize:
        raise InvalidArgumentError("block_pad_bytes must be a multiple of the element size")
    stride = block_bytes + block_pad_bytes
    regions = 1 if layout == "mla" else 2
    layer_bytes = regions * num_blocks * stride
    total = num_layers * layer_bytes
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, total)
        mm = mmap.mmap(fd, total)
    finally:
        os.close(fd)
    flat = np.frombuffer(mm, dtype=np.uint8)
    layers = []
    el = dt.itemsize
    for i in range(num_layers):
        base = flat[i * layer_bytes : (i + 1) * layer_bytes]
        typed = base.view(dt)
        if layout == "mla":
            arr = np.lib.stride_tricks.as_strided(
                typed, (num_blocks, block_size, head_dim), (stride, head_dim * el, el), writeable=True
            )
        else:
            if in_block.upper() == "NHD":
                inner_shape = (block_size, heads, head_dim)
                inner = (heads * head_dim * el, head_dim * el, el)
            else:
                inner_shape = (block_size, heads, head_dim)
                inner = (head_dim * el, block_size * head_dim * el, el)
            if layout == "flash_attn":
                arr = np.lib.stride_tricks.as_strided(
                    typed, (2, num_blocks) + inner_shape, (num_blocks * stride, stride) + inner, writeable=True
                )
            else:
                arr = np.lib.stride_tricks.as_strided(
                    typed, (num_blocks, 2) + inner_shape, (2 * stride, stride) + inner, writeable=True
                )
        layers.append(arr)
    register_shared_file(path, flat)
    return HostKvCache(path=path, layers=layers, layout=layout, _mmap=mm)
