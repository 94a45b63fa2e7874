"""One rank's lookup that also finds chunks saved at other tensor-parallel sizes.

A rank's chunks live in the namespace of the KV heads it holds (docs/protocol.md 9.2). An engine
at another TP size saved the same prefix as head shards of another width; the rank can assemble
its heads from every *cover* of them (:func:`~kvtier_vllm.namespace.head_covers`). A LOAD copies
from a cover when the lookup it names named exactly that cover's namespaces (the sidecar's data
plane matches them to the engine's heads), so the worker needs no change: what has to be right is
which namespaces the lookup named under the id the worker loads with.

:class:`CoverLookupClient` stands in for a rank's :class:`~kvtier_vllm.client.KvtierClient` in
:class:`~kvtier_vllm.rank_lookup.RankLookup`. For lookup id ``L`` it asks, at once, for the rank's
own namespace under ``L`` and for each cover under ``L~c<i>``. When all answered: if the own
namespace holds at least as many tokens as the best cover, that is the answer and the covers'
pins are released; otherwise ``L`` is asked again naming the best cover's namespaces (its chunks
are in host memory and pinned by then, so the second answer is quick) and the first cover lookup
is released once it is in. Each cover costs one more lookup per rank on the sidecar.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["CoverLookupClient", "COVER_SUFFIX"]

#: What separates a lookup id from the index of the cover it asks about.
COVER_SUFFIX = "~c"


class _State:
    __slots__ = ("args", "extra", "own", "covers", "winner", "again")

    def __init__(self, args: tuple, extra: dict, n: int) -> None:
        self.args = args
        self.extra = extra
        self.own: int | None = None
        self.covers: list[int | None] = [None] * n
        self.winner: int | None = None
        self.again = False


class CoverLookupClient:
    """A rank's lookup over its own namespace and every cover of its heads.

    :param client: the rank's sidecar client (not owned: several ranks may share it; :meth:`poll`
        and :meth:`close` reach it once per :class:`CoverLookupClient`, which a shared client
        tolerates).
    :param covers: the namespace ids (16 bytes each) of each cover, in the order to prefer them
        on a tie (:func:`~kvtier_vllm.namespace.head_covers` order).
    """

    def __init__(self, client: Any, covers: Sequence[Sequence[bytes]]) -> None:
        self.client = client
        self.covers = [[bytes(n) for n in c] for c in covers]
        self._state: dict[str, _State] = {}

    def _cover_id(self, lookup_id: str, i: int) -> str:
        return f"{lookup_id}{COVER_SUFFIX}{i}"

    def lookup(
        self, lookup_id: str, hashes: Any, token_counts: Any, namespaces: Sequence[Any], *rest: Any, **extra: Any
    ) -> int | None:
        """As :meth:`~kvtier_vllm.client.KvtierClient.lookup` for the rank's own namespaces:
        None while any of the lookups is pending, then the hit tokens once."""
        if not self.covers or extra.get("await_chunks"):
            # a consumer's lookup that waits for a producer's save (disaggregated prefill) waits
            # in the producer's namespace only: cover lookups would wait out the bound for nothing
            return self.client.lookup(lookup_id, hashes, token_counts, namespaces, *rest, **extra)
        s = self._state.get(lookup_id)
        if s is None:
            s = self._state[lookup_id] = _State((hashes, token_counts, namespaces) + tuple(rest), extra, len(self.covers))
        if s.winner is not None:
            # the second lookup of L, naming the winning cover
            answer = self.client.lookup(lookup_id, *s.args[:2], self.covers[s.winner], *s.args[3:], **s.extra)
            if answer is None:
                return None
            self.client.cancel(self._cover_id(lookup_id, s.winner))
            del self._state[lookup_id]
            return answer
        if s.own is None:
            s.own = self.client.lookup(lookup_id, *s.args, **s.extra)
        for i, cover in enumerate(self.covers):
            if s.covers[i] is None:
                s.covers[i] = self.client.lookup(
                    self._cover_id(lookup_id, i), *s.args[:2], cover, *s.args[3:], **s.extra
                )
        if s.own is None or any(c is None for c in s.covers):
            return None
        best = max(range(len(self.covers)), key=lambda i: (s.covers[i], -i))
        if s.own >= s.covers[best]:  # type: ignore[operator]
            for i in range(len(self.covers)):
                self.client.cancel(self._cover_id(lookup_id, i))
            del self._state[lookup_id]
            return s.own
        # A cover holds more: L is asked again naming it (the new LOOKUP of the id cancels the
        # old one on the sidecar, docs/protocol.md 4.1); the other covers' pins are released.
        for i in range(len(self.covers)):
            if i != best:
                self.client.cancel(self._cover_id(lookup_id, i))
        s.winner = best
        return self.lookup(lookup_id, *s.args, **s.extra)

    def lookup_details(self, lookup_id: str) -> Any:
        """The details of the answer :meth:`lookup` returned (the own or the re-asked lookup's)."""
        return self.client.lookup_details(lookup_id)

    def _ids(self, lookup_id: str) -> list[str]:
        return [lookup_id] + [self._cover_id(lookup_id, i) for i in range(len(self.covers))]

    def forget(self, lookup_id: str) -> None:
        """Drops the lookup and its cover lookups (a CANCEL each)."""
        self._state.pop(lookup_id, None)
        for i in self._ids(lookup_id):
            self.client.forget(i)

    def cancel(self, lookup_id: str) -> None:
        """Releases the lookup's pins and its cover lookups' (fire and forget)."""
        self._state.pop(lookup_id, None)
        for i in self._ids(lookup_id):
            self.client.cancel(i)

    def poll(self) -> None:
        poll = getattr(self.client, "poll", None)
        if callable(poll):
            poll()

    @property
    def reachable(self) -> bool:
        return getattr(self.client, "reachable", True)

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if callable(close):
            close()
