"""The hand-written part of the request encoders: where a request's Python arguments are not
its wire fields one for one, the generated encoder of :mod:`.protocol_encode` calls a helper
here (scripts/gen-python-requests.ts names it for the message) to turn them into the fields.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import InvalidArgumentError

#: a LOOKUP config with every option at its default: sent as 0 bytes
_DEFAULTS: dict = {}


def lookup_config(pin: Any, prefetch: Any, config: dict | None, compute_tokens_per_s: Any) -> dict:
    """LOOKUP's ``config`` field. It carries only non-default options (none -> 0 bytes), unless
    ``config`` is given: then that object is sent as compact JSON and ``pin``/``prefetch`` are
    ignored. ``compute_tokens_per_s`` (see :func:`check_rate`) adds ``computeTokensPerSec``.

    :raises InvalidArgumentError: ``pin`` or ``prefetch`` not a bool, or a bad rate.
    """
    if config is None:
        if pin is True and prefetch is True:
            config = _DEFAULTS
        elif not isinstance(pin, bool) or not isinstance(prefetch, bool):
            raise InvalidArgumentError("pin and prefetch must be booleans")
        else:
            config = {k: False for k, on in (("pin", pin), ("prefetch", prefetch)) if not on}
    if compute_tokens_per_s is not None:
        config = {**config, "computeTokensPerSec": check_rate(compute_tokens_per_s)}
    return config


def check_rate(tokens_per_s: Any) -> float:
    """``tokens_per_s`` as a LOOKUP's ``computeTokensPerSec``.

    :raises InvalidArgumentError: unless it is a positive finite number (not a bool).
    """
    if (
        isinstance(tokens_per_s, bool)
        or not isinstance(tokens_per_s, (int, float))
        or not math.isfinite(tokens_per_s)
        or tokens_per_s <= 0
    ):
        raise InvalidArgumentError(f"compute_tokens_per_s must be a positive finite number, got {tokens_per_s!r}")
    return tokens_per_s


def split_fence(fence: Any) -> tuple[Any, Any]:
    """SAVE's ``fenceSlot`` and ``fenceTicket`` from ``fence`` = ``(slot, ticket)``; None: neither.

    :raises InvalidArgumentError: ``fence`` is not a pair.
    """
    if fence is None:
        return None, None
    try:
        slot, ticket = fence
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"fence must be a (slot, ticket) pair, got {fence!r}") from None
    return slot, ticket
