"""CoverLookupClient's choice between a rank's own namespace and the covers of its heads, and
what it sends and releases, against a scripted client."""

from __future__ import annotations

from kvtier_vllm.cover_lookup import CoverLookupClient

OWN = b"o" * 16
C0 = [b"a" * 16, b"b" * 16]
C1 = [b"c" * 16]


class Scripted:
    """Answers each lookup id with a scripted number on the second call; records everything."""

    def __init__(self, answers: dict) -> None:
        self.answers = answers
        self.sent: list[tuple[str, list]] = []
        self.cancelled: list[str] = []
        self.forgotten: list[str] = []
        self._asked: set = set()

    def lookup(self, lookup_id, hashes, counts, namespaces, **extra):
        key = (lookup_id, tuple(namespaces))
        if key not in self._asked:
            self._asked.add(key)
            self.sent.append((lookup_id, list(namespaces)))
            return None
        self._asked.discard(key)
        return self.answers[key]

    def lookup_details(self, lookup_id):
        return None

    def cancel(self, lookup_id):
        self.cancelled.append(lookup_id)

    def forget(self, lookup_id):
        self.forgotten.append(lookup_id)


def _run(c: CoverLookupClient, lookup_id: str = "L") -> int:
    for _ in range(10):
        got = c.lookup(lookup_id, b"h", [16], [OWN])
        if got is not None:
            return got
    raise AssertionError("never answered")


def test_own_namespace_wins_ties_and_the_covers_are_released():
    s = Scripted({("L", (OWN,)): 32, ("L~c0", tuple(C0)): 32, ("L~c1", tuple(C1)): 16})
    assert _run(CoverLookupClient(s, [C0, C1])) == 32
    assert s.sent == [("L", [OWN]), ("L~c0", C0), ("L~c1", C1)]
    assert sorted(s.cancelled) == ["L~c0", "L~c1"]


def test_a_cover_that_holds_more_is_asked_again_under_the_lookup_id():
    s = Scripted({
        ("L", (OWN,)): 0, ("L~c0", tuple(C0)): 16, ("L~c1", tuple(C1)): 48, ("L", tuple(C1)): 48,
    })
    assert _run(CoverLookupClient(s, [C0, C1])) == 48
    assert s.sent[-1] == ("L", C1), "the id the worker loads with names the winning cover"
    # the loser at once, the winner's first lookup once the second one holds the pins
    assert s.cancelled == ["L~c0", "L~c1"]


def test_no_covers_is_a_plain_lookup_and_cancel_reaches_every_id():
    s = Scripted({("L", (OWN,)): 16})
    assert _run(CoverLookupClient(s, [])) == 16
    assert s.sent == [("L", [OWN])]
    c = CoverLookupClient(s, [C0, C1])
    c.lookup("M", b"h", [16], [OWN])
    c.cancel("M")
    assert s.cancelled == ["M", "M~c0", "M~c1"]
    c.forget("N")
    assert s.forgotten == ["N", "N~c0", "N~c1"]


def test_a_lookup_that_waits_for_a_producer_asks_only_its_own_namespace():
    s = Scripted({("L", (OWN,)): 32})
    c = CoverLookupClient(s, [C0, C1])
    got = None
    while got is None:
        got = c.lookup("L", b"h", [16], [OWN], await_chunks=2, await_ms=500)
    assert got == 32
    assert s.sent == [("L", [OWN])]
