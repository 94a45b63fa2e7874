"""Two ranks with their own namespaces (the scheduler claims the minimum) and a sidecar killed
and restarted mid-run (requests recompute, nothing hangs, the worker registers again)."""

from __future__ import annotations

import time

from kvtier_vllm.connector_types import ConnectorRequest, ScheduledRequest
from tests.support.rig import Rig, tokens


def test_two_ranks_the_scheduler_claims_the_minimum(sidecar):
    rig = Rig(sidecar.endpoint, block=4, chunk=16, ranks=2)
    try:
        assert rig.rank_list[0].namespace != rig.rank_list[1].namespace
        w = tokens(81, 100)
        rig.save_prompt("W", w)
        # Rank 1 loses chunks 3.. (evicted on its sidecar namespace only).
        x = ConnectorRequest("X", w)
        n, _ = rig.ask(x)
        assert n == 96
        rig.scheduler.request_finished(x, [])
        rig.step()
        c = rig.admin
        c.clear([rig.rank_list[1].namespace])
        # Save only the first 3 chunks again for rank 1: recompute a 48-token prefix on both ranks.
        part = w[:49]
        rig.save_prompt("W2", part)
        y = ConnectorRequest("Y", w)
        n, _ = rig.ask(y)
        assert n == 48, "rank 0 holds 6 chunks, rank 1 only 3: the minimum"
        table = rig.alloc(25, reverse=True)
        rig.scribble(table)
        rig.scheduler.update_state_after_alloc(y, table, n)
        meta = rig.step()
        assert [l.lookup_id for l in meta.loads] == ["Y#1"]
        rig.until_recving("Y")
        assert rig.mismatched(w, table, 0, 12) == [], "both ranks loaded their own bytes"
    finally:
        rig.close()


def test_sidecar_killed_and_restarted_requests_recompute_nothing_hangs(sidecar):
    rig = Rig(
        sidecar.endpoint,
        block=4,
        chunk=16,
        lookup_timeout_ms=3000,
        request_timeout_ms=1000,
        load_timeout_ms=500,
        heartbeat_interval_s=0.2,
    )
    try:
        w = tokens(91, 100)
        rig.save_prompt("W", w)
        x = ConnectorRequest("X", w)
        n, _ = rig.ask(x)
        assert n == 96
        table = rig.alloc(25, reverse=True)
        rig.scribble(table)
        rig.scheduler.update_state_after_alloc(x, table, n)
        sidecar.kill()
        t0 = time.monotonic()
        rig.step()  # the LOAD goes nowhere
        out = rig.until_recving("X", timeout_s=20)
        assert set(out.invalid_block_ids) == set(table[:24]), "the lost load's blocks are recomputed"
        # A lookup while the sidecar is down answers 0 (at its deadline, or at once once the
        # client's liveness PING went unanswered): the request recomputes.
        y = ConnectorRequest("Y", w)
        assert rig.ask(y) == (0, False)
        # A save while it is down is dropped without holding the engine.
        t2 = rig.alloc(25)
        rig.step([ScheduledRequest(y, t2, 0, 100)], [(w, t2, 0, 100)])
        rig.idle(timeout_s=20)
        assert rig.rank_list[0].worker.stats().saves_failed >= 1
        assert time.monotonic() - t0 < 20
        for r in (x, y):
            rig.scheduler.request_finished(r, [])
        rig.step()
        rig.idle(timeout_s=20)
        rig.finished()
        # Back up: the heartbeat thread finds another sidecar process, the worker registers
        # again at its next call from the engine (on its own socket), and kvtier works again.
        sidecar.start()
        deadline = time.monotonic() + 20
        while rig.rank_list[0].worker.stats().registrations < 2:
            assert time.monotonic() < deadline, "the worker did not register again"
            rig.rank_list[0].worker.get_finished()
            time.sleep(0.05)
        # The scheduler's client counted the sidecar down; stepping probes it and finds it back.
        deadline = time.monotonic() + 20
        while not rig.scheduler.sidecar_reachable:
            assert time.monotonic() < deadline, "the scheduler never found the sidecar back"
            rig.step()
            time.sleep(0.05)
        # A save the worker's client sends while it still counts the sidecar down fails (it is
        # dropped, never waited for): save until one is stored.
        worker = rig.rank_list[0].worker
        deadline = time.monotonic() + 20
        for attempt in range(1000):
            failed = worker.stats().saves_failed
            rig.save_prompt(f"W3-{attempt}", w)
            if worker.stats().saves_failed == failed:
                break
            assert time.monotonic() < deadline, f"saves kept failing after the restart: {worker.stats()}"
        # A lookup the fresh sidecar answers after the client's deadline on a busy machine is a
        # miss (recompute); the next one hits.
        deadline = time.monotonic() + 20
        for attempt in range(1000):
            z = ConnectorRequest(f"Z{attempt}", w)
            n, _ = rig.ask(z)
            if n != 0 or time.monotonic() > deadline:
                break
        sc = rig.scheduler
        assert n == 96, (
            f"after the restart: offers paused {sc.offers_paused}, sidecar reachable {sc.sidecar_reachable}, "
            f"worker {worker.stats()}"
        )
        t3 = rig.alloc(25, reverse=True)
        rig.scheduler.update_state_after_alloc(z, t3, n)
        rig.step()
        rig.until_recving(z.request_id)
        assert rig.mismatched(w, t3, 0, 24) == []
    finally:
        rig.close()
