"""Argument checks shared by the package's modules."""

from __future__ import annotations

from typing import Any

from .errors import InvalidArgumentError


def require_int(name: str, v: Any, lo: int = 0, hi: int = 2**53) -> int:
    """``v`` as an int in ``[lo, hi]`` (anything with ``__index__`` but a bool).

    :raises InvalidArgumentError: naming ``name`` and the allowed range.
    """
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise InvalidArgumentError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
    v = v.__index__()
    if v < lo or v > hi:
        raise InvalidArgumentError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return v
