"""The scheduler's KV block pool with prefix caching, as vLLM's ``KVCacheManager`` behaves for
one full-attention group: a free queue that evicts the least recently freed block first, full
blocks cached by the hash of their whole prefix, blocks shared by reference count.

``reverse`` hands out free blocks from the other end of the id range, so two engines place the
same prompt in different blocks.
"""

from __future__ import annotations

from collections import OrderedDict

from vllm.v1.core.kv_cache_manager import KVCacheBlocks

from .checks import check


class Block:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_cnt})"


def block_hashes(tokens: list[int], block_size: int) -> list[int]:
    """The prefix hash of every full block of ``tokens``."""
    out, h = [], 0
    for i in range(len(tokens) // block_size):
        h = hash((h, tuple(tokens[i * block_size : (i + 1) * block_size])))
        out.append(h)
    return out


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True, reverse: bool = False) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        order = reversed(self.blocks) if reverse else iter(self.blocks)
        # free blocks, least recently freed first (evicted first)
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in order)
        self._cached: dict[int, Block] = {}
        self.req_blocks: dict[str, list[Block]] = {}
        self._num_cached: dict[str, int] = {}
        self.empty_kv_cache_blocks = KVCacheBlocks(([],))

    # ---------------------------------------------------------------- queries

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks((list(self.req_blocks.get(request_id, ())),))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def get_computed_blocks(self, request) -> tuple[KVCacheBlocks, int]:
        """The longest run of cached full blocks from the start of the request; never the whole
        request (the last token is always computed)."""
        if not self.enable_caching:
            return self.empty_kv_cache_blocks, 0
        limit = (request.num_tokens - 1) // self.block_size
        hit: list[Block] = []
        for h in block_hashes(request.all_token_ids, self.block_size)[:limit]:
            b = self._cached.get(h)
            if b is None:
                break
            hit.append(b)
        return KVCacheBlocks((hit,)), len(hit) * self.block_size

    # ---------------------------------------------------------------- changes

    def allocate_slots(
        self,
        request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
    ) -> KVCacheBlocks | None:
        """Blocks for the request's tokens so far plus ``num_new_tokens``; None when the pool
        cannot hold them (nothing changes then). Returns the newly allocated blocks."""
        rid = request.request_id
        computed = list(new_computed_blocks.blocks[0]) if new_computed_blocks is not None else []
        have = self.req_blocks.get(rid, [])
        total = request.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
        need = -(-(total + num_new_tokens) // self.block_size) - len(have) - len(computed)
        reusable = sum(1 for b in computed if b.ref_cnt == 0)
        if need > len(self._free) - reusable:
            return None
        for b in computed:
            if b.ref_cnt == 0:
                del self._free[b.block_id]
            b.ref_cnt += 1
        new = [self._take() for _ in range(max(0, need))]
        self.req_blocks[rid] = have + computed + new
        if computed:
            self._num_cached[rid] = self._num_cached.get(rid, 0) + len(computed)
        if not delay_cache_blocks:
            self.cache_blocks(request, min(total + num_new_tokens, request.num_tokens))
        return KVCacheBlocks((new,))

    def _take(self) -> Block:
        _, b = self._free.popitem(last=False)
        check(b.ref_cnt == 0, f"free block {b.block_id} has references")
        if b.block_hash is not None:
            if self._cached.get(b.block_hash) is b:
                del self._cached[b.block_hash]
            b.block_hash = None
        b.ref_cnt = 1
        return b

    def cache_blocks(self, request, num_tokens: int) -> None:
        """Makes the request's full blocks up to ``num_tokens`` findable by prefix."""
        if not self.enable_caching:
            return
        rid = request.request_id
        blocks = self.req_blocks.get(rid, [])
        done = self._num_cached.get(rid, 0)
        full = min(num_tokens // self.block_size, len(blocks))
        if full <= done:
            return
        hashes = block_hashes(request.all_token_ids[: full * self.block_size], self.block_size)
        for i in range(done, full):
            b = blocks[i]
            if b.block_hash is None and hashes[i] not in self._cached:
                b.block_hash = hashes[i]
                self._cached[hashes[i]] = b
        self._num_cached[rid] = full

    def free(self, request) -> None:
        """Drops the request's references; blocks nobody holds go back to the free queue, the
        request's last blocks first (they are evicted first)."""
        rid = request.request_id
        for b in reversed(self.req_blocks.pop(rid, [])):
            check(b.ref_cnt > 0, f"block {b.block_id} freed twice")
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self._free[b.block_id] = b
        self._num_cached.pop(rid, None)

    def evict_blocks(self, block_ids) -> None:
        for bid in block_ids:
            b = self.blocks[bid]
            if b.block_hash is not None and self._cached.get(b.block_hash) is b:
                del self._cached[b.block_hash]
            b.block_hash = None

    def leaked(self) -> list[Block]:
        """Blocks still referenced (the end-of-run leak check)."""
        return [b for b in self.blocks if b.ref_cnt != 0]
