"""The same lookup on several sidecars (one per rank or node), answered with the minimum."""

from __future__ import annotations

from typing import Any, Sequence

from .errors import InvalidArgumentError
from .lookup_rule import MAX_KEPT_DETAILS, LookupDetails

__all__ = ["MultiLookupClient"]


class MultiLookupClient:
    """The same lookup on several sidecars (one per rank or node); the answer is the minimum,
    so ranks never disagree. Non-blocking like :meth:`~.client.KvtierClient.lookup`: None while any
    server is pending; a 0 from any server answers 0 at once (the others are canceled).

    :param clients: one :class:`~.client.KvtierClient` per server (owned by the caller).
    :param namespaces_per_client: the namespaces each server is asked about, in the same order.
    """

    def __init__(self, clients: Sequence[Any], namespaces_per_client: Sequence[Sequence[Any]]) -> None:
        if len(clients) == 0:
            raise InvalidArgumentError("MultiLookupClient needs at least one client")
        if len(namespaces_per_client) != len(clients):
            raise InvalidArgumentError(
                f"{len(clients)} clients but {len(namespaces_per_client)} namespace lists"
            )
        self.clients = list(clients)
        self.namespaces = [list(ns) for ns in namespaces_per_client]
        self._partial: dict[str, list] = {}
        self._details: dict[str, LookupDetails] = {}

    def lookup(
        self,
        lookup_id: str,
        hashes: Any,
        token_counts: Any,
        pin: bool = True,
        prefetch: bool = True,
        compute_tokens_per_s: float | None = None,
        timeout_ms: float | None = None,
    ) -> int | None:
        """As :meth:`~.client.KvtierClient.lookup`, over every server: ``compute_tokens_per_s`` and
        ``timeout_ms`` go to each, and :meth:`lookup_details` gives the answer of the server that
        limited the minimum."""
        answers = self._partial.get(lookup_id)
        if answers is None:
            answers = [None] * len(self.clients)
            self._partial[lookup_id] = answers
            self._details.pop(lookup_id, None)
        pending = False
        for i, client in enumerate(self.clients):
            if answers[i] is not None:
                continue
            a = client.lookup(
                lookup_id, hashes, token_counts, self.namespaces[i], pin, prefetch,
                compute_tokens_per_s=compute_tokens_per_s, timeout_ms=timeout_ms,
            )
            if a is None:
                pending = True
            elif a == 0:
                # the minimum is 0 whatever the others say: stop them and release their pins
                del self._partial[lookup_id]
                self._keep(lookup_id, client.lookup_details(lookup_id))
                for j, other in enumerate(self.clients):
                    if j != i:
                        other.cancel(lookup_id)
                return 0
            else:
                answers[i] = a
        if pending:
            return None
        del self._partial[lookup_id]
        low = min(range(len(answers)), key=lambda i: answers[i])
        details = [c.lookup_details(lookup_id) for c in self.clients]
        self._keep(lookup_id, details[low])
        return answers[low]

    def lookup_details(self, lookup_id: str) -> LookupDetails | None:
        """As :meth:`~.client.KvtierClient.lookup_details`: the answer of the server whose hit tokens were
        the minimum (the first of them), once."""
        return self._details.pop(lookup_id, None)

    def _keep(self, lookup_id: str, details: LookupDetails | None) -> None:
        if details is None:
            return
        self._details[lookup_id] = details
        while len(self._details) > MAX_KEPT_DETAILS:
            del self._details[next(iter(self._details))]

    def poll(self) -> None:
        """Takes in replies and expires deadlines on every client (once per step)."""
        for c in self.clients:
            c.poll()

    @property
    def reachable(self) -> bool:
        """False while any server counts as down."""
        return all(c.reachable for c in self.clients)

    def forget(self, lookup_id: str) -> None:
        """Forgets the lookup everywhere and cancels it on every server that has (or had) it."""
        self._details.pop(lookup_id, None)
        answers = self._partial.pop(lookup_id, None)
        for i, c in enumerate(self.clients):
            if answers is not None and answers[i] is not None:
                c.cancel(lookup_id)  # answered already: release its pins
            else:
                c.forget(lookup_id)

    def cancel(self, lookup_id: str) -> None:
        """Fire-and-forget CANCEL on every server (cleanup)."""
        self._partial.pop(lookup_id, None)
        self._details.pop(lookup_id, None)
        for c in self.clients:
            c.cancel(lookup_id)
