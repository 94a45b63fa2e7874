"""The engine side of "never slower than recomputing" (docs/connector.md): what a lookup that
named the engine's prefill rate answered (:class:`LookupDetails`, from
:meth:`~.client.KvtierClient.lookup_details`), how long such a lookup may take
(:func:`lookup_wait_ms`), whether it is worth making a request wait a step for
(:func:`worth_a_step`) and what of its answer to claim (:func:`admitted_tokens`). The
TypeScript reference is ``src/connector/claim-bound.ts``.
"""

from __future__ import annotations

import math
import time
from typing import Callable, NamedTuple

from . import protocol as P

__all__ = [
    "LookupDetails",
    "MAX_KEPT_DETAILS",
    "StepClock",
    "admitted_tokens",
    "lookup_wait_ms",
    "worth_a_step",
]

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


class StepClock:
    """The engine's pace, learned from its own steps (one :meth:`step` per scheduler step, from
    ``build_connector_meta``): how long its last step took and how many tokens per second it
    computes (the rate "never slower than recomputing" compares loads against).

    A step's duration is the time from its schedule to the next one (vLLM schedules the next
    step once the last one's output is in, also with async scheduling, where the schedules run
    one step ahead). Its rate is the tokens it scheduled over that time; only steps of at least
    ``min_tokens`` tokens count (decode-only steps are bound by memory, not compute, and would
    understate the prefill rate), and none that took longer than ``longest_step_s`` (the engine
    was held up by something else). The rate is an exponentially weighted mean (weight
    ``alpha``) and is reported once ``min_samples`` steps counted.

    :param clock: monotonic seconds (tests inject one).
    """

    def __init__(
        self,
        min_tokens: int,
        clock: Callable[[], float] = time.monotonic,
        alpha: float = 0.25,
        min_samples: int = 3,
        longest_step_s: float = 5.0,
    ) -> None:
        self._min_tokens = max(1, int(min_tokens))
        self._clock = clock
        self._alpha = float(alpha)
        self._min_samples = max(1, int(min_samples))
        self._longest_s = float(longest_step_s)
        self._last: tuple[float, int] | None = None
        self._rate = 0.0
        self._samples = 0
        #: The last step's duration, ms (0 before two steps were seen).
        self.step_ms = 0.0

    @property
    def samples(self) -> int:
        """Steps that counted towards the rate."""
        return self._samples

    @property
    def tokens_per_s(self) -> float | None:
        """The learned rate, tokens/s; None until ``min_samples`` steps counted."""
        return self._rate if self._samples >= self._min_samples else None

    def step(self, tokens: int) -> None:
        """A step was scheduled with ``tokens`` tokens (0: nothing ran)."""
        now = self._clock()
        last, self._last = self._last, ((now, int(tokens)) if tokens > 0 else None)
        if last is None:
            return
        took = now - last[0]
        if took <= 0 or took > self._longest_s:
            return
        self.step_ms = took * 1000.0
        if last[1] < self._min_tokens:
            return
        sample = last[1] / took
        self._rate = sample if self._samples == 0 else self._rate + self._alpha * (sample - self._rate)
        self._samples += 1
