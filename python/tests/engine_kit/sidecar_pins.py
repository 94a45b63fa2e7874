"""End-of-run checks against the sidecar: no chunk pinned, no lookup running."""

from __future__ import annotations

import time

from kvtier_vllm.client import KvtierClient



def sidecar_pins(sidecar) -> tuple[int, int]:
    """(chunks pinned in any tier, lookups still running). An answered lookup that pinned
    nothing may stay registered until its TTL; it holds no pins."""
    c = KvtierClient(sidecar.endpoint, request_timeout_ms=5000)
    try:
        stats = c.stats()
    finally:
        c.close()
    pinned = sum(int(t.get("pinnedChunks", 0)) for t in stats["tiers"])
    return pinned, int(stats["lookups"].get("ongoing", 0))


def assert_no_pins(sidecar, settle_s: float = 5.0) -> None:
    """The sidecar ends with no pins: releases sent at the end may still be in flight, so it is
    asked until they are in (bounded)."""
    deadline = time.monotonic() + settle_s
    while True:
        pins = sidecar_pins(sidecar)
        if pins == (0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert pins == (0, 0), f"the sidecar still holds pins at the end: {pins[0]} chunks pinned, {pins[1]} lookups running"
