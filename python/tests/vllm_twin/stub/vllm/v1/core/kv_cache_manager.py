"""``KVCacheBlocks``: one list of blocks per KV cache group, as the scheduler hands them over."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class KVCacheBlocks:
    blocks: tuple[list[Any], ...]

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(tuple(a + b for a, b in zip(self.blocks, other.blocks)))

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)

    def get_unhashed_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]
