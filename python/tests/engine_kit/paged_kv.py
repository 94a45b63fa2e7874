"""Shared-memory KV caches in vLLM's per-layer layouts, and token-wise access to them.

vLLM's attention backends give every layer a tensor of their logical shape whose strides
follow the in-block order (``HND`` is a permuted view of head-major blocks):

============== ====================================== ==================================
backend         logical shape                          physical order (HND)
============== ====================================== ==================================
flash_attn      ``[2, blocks, block_size, heads, dim]`` ``[2, blocks, heads, block_size, dim]``
flashinfer      ``[blocks, 2, block_size, heads, dim]`` ``[blocks, 2, heads, block_size, dim]``
mla             ``[blocks, block_size, latent]``        (one latent per token)
============== ====================================== ==================================

Every layer lives in one file under /dev/shm, mapped shared (the sidecar opens the same file),
and is declared with :func:`kvtier_vllm.kv_caches.register_shared_file`; or, as vLLM's CPU
backend allocates it, in process memory (``in_process``).
"""

from __future__ import annotations

import os

import torch

from kvtier_vllm.kv_caches import register_shared_file, unregister_shared_file

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class PagedKv:
    """One worker's KV cache: ``layers[name]`` tensors in the backend's logical shape."""

    def __init__(
        self,
        path: str,
        *,
        backend: str,
        in_block: str,
        dtype: str,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        heads: int,
        head_dim: int,
        in_process: bool = False,
    ) -> None:
        self.path, self.backend, self.in_block = path, backend, in_block
        self.block_size, self.heads, self.head_dim = block_size, heads, head_dim
        self.kv = 1 if backend == "mla" else 2
        el = torch.empty((), dtype=DTYPES[dtype]).element_size()
        per_layer = self.kv * num_blocks * block_size * (1 if backend == "mla" else heads) * head_dim
        if in_process:
            # As vLLM's CPU backend allocates it: process memory, no file.
            self.path = None
            self.raw = torch.zeros(per_layer * el * num_layers, dtype=torch.uint8)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, per_layer * el * num_layers)
            finally:
                os.close(fd)
            self.raw = torch.from_file(path, shared=True, size=per_layer * el * num_layers, dtype=torch.uint8)
            register_shared_file(path, self.raw)
        flat = self.raw.view(DTYPES[dtype])
        self.layers: dict[str, torch.Tensor] = {}
        for i in range(num_layers):
            part = flat[i * per_layer : (i + 1) * per_layer]
            self.layers[f"model.layers.{i}.self_attn.attn"] = self._shape(part, num_blocks)

    def _shape(self, part: torch.Tensor, nb: int) -> torch.Tensor:
        bs, h, d = self.block_size, self.heads, self.head_dim
        if self.backend == "mla":
            return part.view(nb, bs, d)
        hnd = self.in_block == "HND"
        if self.backend == "flash_attn":
            if hnd:
                return part.view(2, nb, h, bs, d).permute(0, 1, 3, 2, 4)
            return part.view(2, nb, bs, h, d)
        if self.backend == "flashinfer":
            if hnd:
                return part.view(nb, 2, h, bs, d).permute(0, 1, 3, 2, 4)
            return part.view(nb, 2, bs, h, d)
        raise ValueError(f"unknown attention backend {self.backend!r}")

    def _index(self, block_table: list[int], start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(start, end)
        table = torch.tensor(block_table, dtype=torch.long)
        return table[pos // self.block_size], pos % self.block_size

    def _slot(self, layer: int, kv: int) -> torch.Tensor:
        # Views are taken from the layer tensors at each use, as vLLM's attention does: a tensor
        # moved to other storage in place (set_) is followed.
        t = list(self.layers.values())[layer].view(torch.int16)
        if self.backend == "mla":
            return t
        return t[kv] if self.backend == "flash_attn" else t.select(1, kv)

    def write(self, block_table: list[int], start: int, values, layers: range | None = None) -> None:
        """Writes int16 ``values[T, layers, kv, heads, dim]`` for tokens ``start ..``; with
        ``layers``, only those layers (``values`` still holds every layer)."""
        vals = torch.as_tensor(values)
        blk, off = self._index(block_table, start, start + vals.shape[0])
        for layer in layers if layers is not None else range(vals.shape[1]):
            for kv in range(self.kv):
                v = vals[:, layer, kv]
                self._slot(layer, kv)[blk, off] = v[:, 0] if self.backend == "mla" else v

    def read(self, block_table: list[int], start: int, end: int, layers: range | None = None) -> torch.Tensor:
        """int16 ``[T, layers, kv, heads, dim]`` of tokens ``start .. end-1`` (with ``layers``,
        of those layers only)."""
        blk, off = self._index(block_table, start, end)
        out = []
        for layer in layers if layers is not None else range(len(self.layers)):
            per_kv = []
            for kv in range(self.kv):
                v = self._slot(layer, kv)[blk, off]
                per_kv.append(v.unsqueeze(1) if self.backend == "mla" else v)
            out.append(torch.stack(per_kv, 1))
        return torch.stack(out, 1)

    def zero_blocks(self, block_ids: list[int]) -> None:
        """Zeroes whole blocks in every layer (vLLM's ``new_block_ids_to_zero``)."""
        if not block_ids:
            return
        ids = torch.tensor(block_ids, dtype=torch.long)
        for layer in range(len(self.layers)):
            for kv in range(self.kv):
                self._slot(layer, kv)[ids] = 0

    def close(self) -> None:
        self.layers = {}
        self.raw = None
        if self.path is None:
            return
        unregister_shared_file(self.path)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
