"""One lookup per rank, answered with the minimum over the ranks.

A LOAD consumes the pins of the lookup it names (docs/protocol.md 4.9), for every namespace of
that lookup. With tensor or pipeline parallelism every rank loads its own share of each chunk
with its own LOAD, so the ranks must not share one lookup id: the first rank's LOAD would take
the pins the others need. :class:`RankLookup` therefore sends, for each scheduler lookup id
``L``, one LOOKUP per rank ``k`` named ``L + rank_suffix(k)`` and naming that rank's namespace
(on the sidecar that serves the rank), and answers the minimum once every rank answered. The
worker of rank ``k`` loads with the same suffixed id (:func:`rank_suffix`). With one rank the
suffix is empty and this is a plain lookup.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence, Tuple

from .lookup_rule import MAX_KEPT_DETAILS, LookupDetails, admitted_tokens

__all__ = ["RankLookup", "rank_suffix", "rank_index"]

_log = logging.getLogger("kvtier_vllm.rank_lookup")


def rank_index(tp_rank: int, pp_rank: int, tp_size: int) -> int:
    """The rank's index among the engine's ``tp_size * pp_size`` KV ranks."""
    return pp_rank * tp_size + tp_rank


def rank_suffix(index: int, world: int) -> str:
    """The lookup-id suffix of rank ``index`` out of ``world`` KV ranks (empty for one rank)."""
    return "" if world <= 1 else f"@r{index}"


class RankLookup:
    """The scheduler connector's lookup over every rank of the engine.

    :param targets: one ``(client, namespace, suffix)`` per rank: the rank's sidecar client
        (several ranks may share one), its namespace id (16 bytes) and its lookup-id suffix.
        Clients are owned: :meth:`close` closes each once.
    """

    def __init__(self, targets: Sequence[Tuple[Any, bytes, str]]) -> None:
        if not targets:
            raise ValueError("RankLookup needs at least one rank")
        self._targets = [(c, bytes(ns), str(sfx)) for c, ns, sfx in targets]
        if len({sfx for _, _, sfx in self._targets}) != len(self._targets):
            raise ValueError("every rank needs its own lookup-id suffix")
        self._answers: dict[str, dict[int, int]] = {}
        self._rank_details: dict[str, dict[int, LookupDetails]] = {}
        self._details: dict[str, LookupDetails] = {}

    def lookup(
        self,
        lookup_id: str,
        hashes: bytes,
        token_counts: Sequence[int],
        compute_tokens_per_s: float | None = None,
        timeout_ms: float | None = None,
        await_chunks: int | None = None,
        await_ms: int | None = None,
    ) -> int | None:
        """Never blocks: None until every rank answered, then the minimum (once).
        ``compute_tokens_per_s`` and ``timeout_ms`` go to every rank's lookup (see
        :meth:`~.client.KvtierClient.lookup`); :meth:`lookup_details` then gives the answer of
        the rank whose rule admitted the fewest tokens."""
        got = self._answers.setdefault(lookup_id, {})
        if not got:
            self._details.pop(lookup_id, None)
        extra = {} if compute_tokens_per_s is None else {
            "compute_tokens_per_s": compute_tokens_per_s, "timeout_ms": timeout_ms}
        if await_chunks:
            # a lookup that waits for a producer's save (disaggregated prefill)
            extra = {**extra, "await_chunks": await_chunks, "await_ms": await_ms}
        for i, (client, ns, sfx) in enumerate(self._targets):
            if i in got:
                continue
            answer = client.lookup(lookup_id + sfx, hashes, token_counts, [ns], **extra)
            if answer is not None:
                got[i] = int(answer)
                d = client.lookup_details(lookup_id + sfx) if extra else None
                if d is not None:
                    self._rank_details.setdefault(lookup_id, {})[i] = d
        if len(got) < len(self._targets):
            return None
        del self._answers[lookup_id]
        details = self._rank_details.pop(lookup_id, {})
        if details:
            self._details[lookup_id] = min(details.values(), key=admitted_tokens)
            while len(self._details) > MAX_KEPT_DETAILS:
                del self._details[next(iter(self._details))]
        low = min(got.values())
        if low == 0 and any(got.values()):
            # Nobody will load: release the pins the other ranks took.
            self.cancel(lookup_id)
        return low

    def lookup_details(self, lookup_id: str) -> LookupDetails | None:
        """The answer behind the number :meth:`lookup` returned, for a lookup that named the
        rate: the rank whose rule admitted the fewest tokens (once); None otherwise."""
        return self._details.pop(lookup_id, None)

    def _clients(self) -> list:
        seen: dict[int, Any] = {}
        for client, _, _ in self._targets:
            seen.setdefault(id(client), client)
        return list(seen.values())

    def poll(self) -> None:
        """Takes in replies and expires deadlines on every rank's client (once per step)."""
        for client in self._clients():
            poll = getattr(client, "poll", None)
            if callable(poll):
                poll()

    @property
    def reachable(self) -> bool:
        """False while any rank's sidecar counts as down."""
        return all(getattr(c, "reachable", True) for c in self._clients())

    def forget(self, lookup_id: str) -> None:
        """Drops a pending lookup on every rank (a CANCEL each)."""
        self._answers.pop(lookup_id, None)
        self._rank_details.pop(lookup_id, None)
        self._details.pop(lookup_id, None)
        for client, _, sfx in self._targets:
            client.forget(lookup_id + sfx)

    def cancel(self, lookup_id: str) -> None:
        """Releases an answered lookup's pins on every rank (fire and forget)."""
        self._answers.pop(lookup_id, None)
        self._rank_details.pop(lookup_id, None)
        self._details.pop(lookup_id, None)
        for client, _, sfx in self._targets:
            try:
                client.cancel(lookup_id + sfx)
            except Exception as err:  # the pin TTL is the backstop
                _log.debug("cancel of %s failed: %s", lookup_id + sfx, err)

    def close(self) -> None:
        """Closes every client once."""
        for client in self._clients():
            close = getattr(client, "close", None)
            if callable(close):
                close()
