"""Host-device KV caches located in their shared-memory files: views of an ``np.memmap`` at
their own offset, and a registered file never matched by memory that replaced it."""

from __future__ import annotations

import gc
import os
import uuid

import numpy as np
import pytest

from kvtier_vllm.client import KvtierClient
from kvtier_vllm.hashing import hash_chunks
from kvtier_vllm.kv_caches import allocate_host_kv_cache, build_registration, describe_host_tensor

NB, BS, H, D = 8, 4, 2, 8
BLOCK_BYTES = BS * H * D * 2


def _memmap_layers(path: str, layers: int):
    """vLLM-shaped FlashAttention layers as views of one np.memmap of ``path``."""
    per_layer = 2 * NB * BLOCK_BYTES
    mm = np.memmap(path, dtype=np.uint8, mode="w+", shape=(layers * per_layer,))
    return mm, [mm[i * per_layer : (i + 1) * per_layer].view(np.float16).reshape(2, NB, BS, H, D) for i in range(layers)]


def test_memmap_views_are_located_at_their_own_offset(tmp_path):
    path = str(tmp_path / "kv")
    mm, layers = _memmap_layers(path, 3)
    per_layer = 2 * NB * BLOCK_BYTES
    for i, layer in enumerate(layers):
        src = describe_host_tensor(layer)
        assert (src.path, src.offset_bytes) == (os.path.abspath(path), i * per_layer)
    assert describe_host_tensor(layers[2][1, 3]).offset_bytes == 2 * per_layer + NB * BLOCK_BYTES + 3 * BLOCK_BYTES
    del layers, mm


def test_saved_chunk_of_memmap_layers_holds_each_layers_bytes(sidecar):
    """End to end: the sidecar copies each layer's blocks from where that layer lives."""
    path = f"/dev/shm/kvtier-memmap-{uuid.uuid4().hex[:8]}"
    mm, layers = _memmap_layers(path, 2)
    try:
        rng = np.random.default_rng(5)
        for layer in layers:
            layer.view(np.uint16)[...] = rng.integers(0, 1 << 16, layer.shape, dtype=np.uint16)
        reg = build_registration(
            layers, engine_id="memmap", model_id="memmap-model", dtype="float16",
            num_kv_heads=H, head_dim=D, block_size=BS, chunk_size=16,
        )
        c = KvtierClient(sidecar.endpoint)
        try:
            ns = c.register(reg).namespace
            chunk = hash_chunks(list(range(16)), chunk_size=16)[0].hash
            assert c.save("memmap", "r", 0, [0, 1, 2, 3], chunk).saved == 1
            got = c.get(ns, chunk)
            assert got.found
            # payload: layer by layer, K then V, the chunk's 4 blocks each
            want = b"".join(layer[kv, 0:4].tobytes() for layer in layers for kv in range(2))
            assert bytes(got.payload) == want
        finally:
            c.close()
    finally:
        del layers, mm
        os.unlink(path)


def test_registered_file_is_not_matched_by_memory_that_replaced_it():
    tag = uuid.uuid4().hex[:8]
    a_path, b_path = f"/dev/shm/kvtier-stale-{tag}-a", f"/dev/shm/kvtier-stale-{tag}-b"
    a = allocate_host_kv_cache(a_path, num_layers=1, num_blocks=NB, block_size=BS, num_heads=H, head_dim=D)
    addr = a.layers[0].__array_interface__["data"][0]
    size = a.layers[0].nbytes
    a.close()
    del a
    gc.collect()
    # Linux hands the same range to the next mapping of that size.
    b = np.memmap(b_path, dtype=np.uint8, mode="w+", shape=(size,))
    try:
        if b.__array_interface__["data"][0] != addr:
            pytest.skip("the kernel placed the new mapping elsewhere; nothing to tell apart")
        src = describe_host_tensor(b)
        assert src.path == b_path, "the memory that replaced a closed cache is found in its own file"
    finally:
        del b
        os.unlink(b_path)


class _Tensor:
    """Any tensor at an address (duck-typed like a CPU torch tensor)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self._ptr, self.nbytes, self.shape = ptr, nbytes, (nbytes,)

    def data_ptr(self) -> int:
        return self._ptr


def test_a_closed_caches_entry_matches_nothing_at_its_old_address():
    a_path = f"/dev/shm/kvtier-stale-{uuid.uuid4().hex[:8]}"
    a = allocate_host_kv_cache(a_path, num_layers=1, num_blocks=NB, block_size=BS, num_heads=H, head_dim=D)
    addr, size = a.layers[0].__array_interface__["data"][0], a.layers[0].nbytes
    assert describe_host_tensor(_Tensor(addr, size)).path == a_path
    a.close()
    del a
    gc.collect()
    from kvtier_vllm.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="shared-memory file"):
        describe_host_tensor(_Tensor(addr, size))
