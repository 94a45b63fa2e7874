"""Deterministic stand-in KV: what a model would compute for each token, and its next token.

The KV of token ``p`` depends on every token up to ``p`` (a chained 64-bit hash of the
prefix), the layer, K or V, the head and the position in the head: a block loaded from anywhere
can be checked bit for bit, and a block holding another prefix's KV never passes. Values are
raw 16-bit patterns written through an ``int16`` view of the fp16 or bf16 cache.
"""

from __future__ import annotations

import numpy as np

_MASK = (1 << 64) - 1
_SEED = 0x6B767469_65722D74


def _mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _mix_np(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class PrefixHashes:
    """The chained hash of every prefix of a growing token list."""

    def __init__(self, salt: int = 0) -> None:
        self.tokens: list[int] = []
        self.hashes: list[int] = []
        self._seed = _mix(_SEED ^ salt)

    def extend(self, tokens) -> None:
        h = self.hashes[-1] if self.hashes else self._seed
        for t in tokens:
            h = _mix(h ^ ((int(t) + 1) * 0x100000001B3 & _MASK))
            self.tokens.append(int(t))
            self.hashes.append(h)

    def reset(self, tokens) -> None:
        self.tokens, self.hashes = [], []
        self.extend(tokens)


def next_token(prefix_hash: int, vocab: int = 32000) -> int:
    """The token the stand-in model samples after a prefix."""
    return (_mix(prefix_hash ^ 0x5A5A) >> 17) % vocab


def token_kv(hashes, layers: int, kv: int, heads: tuple[int, int], head_dim: int) -> np.ndarray:
    """The KV of tokens with these prefix hashes: int16 ``[T, layers, kv, heads, head_dim]`` for
    global heads ``heads[0] .. heads[1]-1`` (kv = 2 for K and V, 1 for an MLA latent)."""
    h = np.asarray(hashes, dtype=np.uint64).reshape(-1, 1, 1, 1, 1)
    layer = np.arange(layers, dtype=np.uint64).reshape(1, -1, 1, 1, 1) << np.uint64(48)
    which = np.arange(kv, dtype=np.uint64).reshape(1, 1, -1, 1, 1) << np.uint64(44)
    head = np.arange(heads[0], heads[1], dtype=np.uint64).reshape(1, 1, 1, -1, 1) << np.uint64(32)
    dim = np.arange(head_dim, dtype=np.uint64).reshape(1, 1, 1, 1, -1)
    with np.errstate(over="ignore"):
        v = _mix_np(h ^ layer ^ which ^ head ^ dim)
    return (v & np.uint64(0xFFFF)).astype(np.uint16).view(np.int16)
