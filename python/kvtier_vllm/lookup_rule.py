"""The engine side of "never slower than recomputing" (docs/connector.md): what a lookup that
named the engine's prefill rate answered (:class:`LookupDetails`, from
:meth:`~.client.KvtierClient.lookup_details`), how long such a lookup may take
(:func:`lookup_wait_ms`), whether it is worth making a request wait a step for
(:func:`worth_a_step`) and what of its answer to claim (:func:`admitted_tokens`). The
TypeScript reference is ``src/connector/claim-bound.ts``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from . import protocol as P

__all__ = ["LookupDetails", "MAX_KEPT_DETAILS", "admitted_tokens", "lookup_wait_ms", "worth_a_step"]

#: answers kept for ``lookup_details`` that nobody took; past it the oldest go
MAX_KEPT_DETAILS = 4096


class LookupDetails(NamedTuple):
    """The whole answer behind the number :meth:`KvtierClient.lookup` returned, for a lookup
    that named the engine's prefill rate (``compute_tokens_per_s``).

    ``status``: ``"ok"``, ``"canceled"``, ``"stale"`` (a CLEAR overtook it, or its epoch is
    below one this client saw), ``"timeout"`` (its deadline passed first) or ``"failed"`` (an
    error reply, a malformed reply, the sidecar down or the client closed). ``hit_tokens``: what
    :meth:`KvtierClient.lookup` returned. ``tiers``: where the ready tokens were found, in tier
    order (:class:`~.protocol.TierTokens`: ``tier``, ``tokens``). ``bytes_per_token``: the KV
    bytes per token the sidecar knows for the first namespace (0: none seen yet).
    ``tier_rates``: every tier of the sidecar in config order (:class:`~.protocol.TierRate`:
    ``tier``, ``decision`` — ``"load"``, ``"decline"`` or ``"none"`` — ``read_bytes_per_sec``
    (0: not measured), ``latency_us``, ``declined_tokens``). The last three are empty/None when no
    answer came, or when the sidecar predates the rates (it ignores the rate it was sent).
    """

    status: str
    hit_tokens: int
    tiers: list
    bytes_per_token: int | None
    tier_rates: list | None


def lookup_wait_ms(tokens: int, compute_tokens_per_s: float) -> int:
    """Milliseconds a lookup of ``tokens`` claimable tokens may take and still not be slower
    than computing them at ``compute_tokens_per_s``: a ``timeout_ms`` for
    :meth:`KvtierClient.lookup` (rounded up, at least 1)."""
    rate = P.check_rate(compute_tokens_per_s)
    return max(1, math.ceil(max(0, tokens) * 1000 / rate))


def admitted_tokens(details: LookupDetails) -> int:
    """The tokens of an answer the "never slower than recomputing" rule admits: all of them from
    a sidecar that reported no rates; otherwise the ready tokens up to the first tier below host
    memory (the first tier it reports) whose hits it did not report as loaded."""
    rates = details.tier_rates
    if not rates:
        return details.hit_tokens
    host = rates[0].tier
    decided = {r.tier: r.decision for r in rates}
    pos = 0
    for t in details.tiers:
        if t.tier != host and decided.get(t.tier) != "load":
            return pos
        pos += t.tokens
    return details.hit_tokens


def worth_a_step(claimable_tokens: int, compute_tokens_per_s: float, step_ms: float) -> bool:
    """Whether a request should wait for its pending lookup (``get_num_new_matched_tokens``
    answering None) rather than compute now: only when computing the ``claimable_tokens`` the
    lookup could let it claim takes longer than the engine's next step (``step_ms``: its last
    step's duration while requests run, 0 while it is idle), which is what the request waits
    before it is asked again. When it is not worth it, answer 0 and keep the lookup: if the
    request is asked again before it is admitted, the answer counts."""
    rate = P.check_rate(compute_tokens_per_s)
    return max(0, claimable_tokens) * 1000 / rate > step_ms
