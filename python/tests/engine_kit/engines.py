"""The ``engine``/``twin`` fixtures' bookkeeping: every engine a test made is closed after it,
and every sidecar it used that still runs must hold no pins."""

from __future__ import annotations

from typing import Any, Callable, Iterator

from .sidecar_pins import assert_no_pins


def engine_maker(build: Callable[[Any, int, dict], Any], default_sidecar: Any) -> Iterator[Callable[..., Any]]:
    """For a fixture to ``yield from``: yields ``make(sidecar=None, **spec)``, which calls
    ``build(sidecar, engines_made_so_far, spec)``; afterwards closes every engine (all of them,
    raising the first problem) and checks the sidecars' pins."""
    made: list = []
    sidecars: set = set()

    def make(sidecar: Any = None, **kw: Any) -> Any:
        sc = sidecar or default_sidecar
        eng = build(sc, len(made), kw)
        made.append(eng)
        sidecars.add(sc)
        return eng

    yield make
    errors = []
    for eng in made:
        try:
            eng.close()
        except Exception as err:  # every engine is closed; the first problem is raised
            errors.append(err)
    for sc in sidecars:
        if sc.proc is not None and sc.proc.poll() is None:
            assert_no_pins(sc)
    if errors:
        raise errors[0]
