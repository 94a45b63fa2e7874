"""The twin's failures: vLLM's own assertions, and the twin's invariants."""

from __future__ import annotations


class TwinAssertionError(AssertionError):
    """vLLM would have raised here (its ``assert`` statements are live in the twin) or an
    invariant of the run broke (wrong KV bytes, a leak, a request that never finishes)."""


def check(cond: object, message: str) -> None:
    if not cond:
        raise TwinAssertionError(message)
