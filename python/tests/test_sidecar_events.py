"""The Python follower of the sidecar's event stream against a real sidecar process: stores,
evictions, CLEAR and a restart turned into reachability transitions for one namespace, with
every transition checked against what the sidecar can give back (GET)."""

from __future__ import annotations

import os
import time

import pytest

from kvtier_vllm.client import KvtierClient
from kvtier_vllm.kv_events import open_worker_events
from kvtier_vllm.sidecar_events import SidecarEventFollower

from conftest import Sidecar, free_port

CHUNK = 64 * 1024


def _events_sidecar(disk: bool, cpu_bytes: int) -> Sidecar:
    pub, rep = free_port(), free_port()
    return Sidecar(
        disk=disk,
        cpu_bytes=cpu_bytes,
        config={
            "events": {
                "endpoint": f"tcp://127.0.0.1:{pub}",
                "replayEndpoint": f"tcp://127.0.0.1:{rep}",
                "heartbeatMs": 50,
            }
        },
    )


def _poll_until(follower: SidecarEventFollower, done, what: str, timeout_s: float = 20.0) -> list:
    """Polls (as a worker does once per step) until ``done(transitions so far)``."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while True:
        if follower is not None:
            got += follower.poll()
        if done(got):
            return got
        assert time.monotonic() < deadline, f"{what}: got {got[:6]}... ({len(got)})"
        time.sleep(0.01)


def _reachable_on(client: KvtierClient, ns: bytes, hashes) -> set:
    return {h for h in hashes if client.get(ns, h).found}


@pytest.fixture
def events_sidecar():
    s = _events_sidecar(disk=False, cpu_bytes=16 * CHUNK)
    try:
        yield s
    finally:
        s.close()


def test_follower_reports_what_the_sidecar_holds(events_sidecar, client_factory):
    client = client_factory(events_sidecar.endpoint)
    ns = os.urandom(16)
    ev = open_worker_events(client, ns, rank=3)  # endpoints from the sidecar's PING
    try:
        hashes = [os.urandom(32) for _ in range(40)]
        for h in hashes:
            assert client.put(ns, h, 16, os.urandom(CHUNK)).outcome == "stored"
        client.put(os.urandom(16), os.urandom(32), 16, b"x" * 100)  # another namespace: not ours
        state: set = set()

        def settled(_):
            c = ev.take()
            for rank, kind, h, medium in c.get_all_events() if c else ():
                assert rank == 3
                if kind == "stored":
                    assert medium == "CPU" and h not in state
                    state.add(h)
                elif kind == "removed":
                    state.discard(h)
            return state == _reachable_on(client, ns, hashes)

        _poll_until(None, settled, "after 40 puts into a 16-chunk tier")
        assert 0 < len(state) <= 16, "evictions were reported as removals"
        assert ev._follower.reachable() == state

        client.clear([ns])
        got = _poll_until(ev._follower, lambda g: ("cleared",) in g, "CLEAR")
        assert ev._follower.reachable() == set()
        assert all(t[0] == "cleared" for t in got)
    finally:
        ev.close()


def test_a_restart_is_followed_from_a_snapshot_with_only_the_transitions_it_caused(client_factory):
    s = _events_sidecar(disk=True, cpu_bytes=64 * CHUNK)
    try:
        info = client_factory(s.endpoint).ping()["events"]
        ns = os.urandom(16)
        f = SidecarEventFollower(info["endpoint"], info["replayEndpoint"], ns, request_timeout_s=2.0)
        client = client_factory(s.endpoint)
        on_disk = [os.urandom(32) for _ in range(6)]
        for h in on_disk:
            client.put(ns, h, 16, os.urandom(4096))
        # Written through to the disk tier before the kill.
        _poll_until(None, lambda _: client.stats()["writeThrough"]["depth"] == 0, "write-through")
        got = _poll_until(f, lambda g: f.reachable() == set(on_disk), "before the restart")
        assert {t[1] for t in got if t[0] == "stored"} == set(on_disk)
        first = f.instance

        # Killed: host memory is gone, the disk tier's chunks survive and stay reachable.
        s.restart(kill=True)
        client = client_factory(s.endpoint)
        got = _poll_until(f, lambda g: f.instance not in (None, first), "after the restart")
        assert f.reachable() == set(on_disk), "the snapshot lists the disk tier's chunks"
        assert got == [], f"no transition: every chunk is still reachable ({got[:4]})"
        assert f.stats["snapshots"] >= 2

        # The restarted sidecar's events are followed: a new chunk, then its removal from every tier.
        h = os.urandom(32)
        client.put(ns, h, 16, os.urandom(4096))
        _poll_until(f, lambda g: ("stored", h, "CPU") in g or ("stored", h, "DISK") in g, "a new chunk")
        client.clear([ns])
        _poll_until(f, lambda g: ("cleared",) in g, "CLEAR after the restart")
        assert f.reachable() == set()
        f.close()
    finally:
        s.close()
