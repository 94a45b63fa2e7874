"""Faults of the sidecar that start at a connector call site.

A trigger is armed in the process that makes the call (the scheduler's, or a worker's): right
before the first call of the named method that has something to do with the sidecar (see
:func:`interesting`), it freezes the sidecar (SIGSTOP), kills it (SIGKILL), or stalls its lower
tier (creates the file the stalling store waits on). :class:`SidecarFault`, in the test process,
sees that it fired, keeps the fault up for ``hold_s`` seconds (an overloaded sidecar: frozen, with
a few milliseconds of run time every 50 ms) and then ends it (SIGCONT, a restart on the same
endpoint, the file removed).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable, Iterable

#: The fault kinds.
KINDS = ("frozen", "killed", "overloaded", "disk-stalled")

#: The connector call sites a fault starts at: (role, method). ``get_finished`` is
#: ``get_transfer_results`` in vLLM revisions that have it.
CALL_SITES = (
    ("scheduler", "get_num_new_matched_tokens"),
    ("scheduler", "update_state_after_alloc"),
    ("scheduler", "build_connector_meta"),
    ("scheduler", "request_finished"),
    ("worker", "start_load_kv"),
    # Frozen from a SAVE on, the preemption that follows finds that request's saves in flight:
    # a run measures handle_preemptions then.
    ("worker", "wait_for_save"),
    ("worker", "get_finished"),
    ("worker", "shutdown"),
)


def interesting(method: str, connector: Any, args: tuple) -> bool:
    """Whether this call of ``method`` is one a fault should start at: the call has work for
    the sidecar (a load to start, saves to send or to wait for, transfers in flight)."""
    w = getattr(connector, "_worker", None)
    if method == "shutdown":
        return True
    if w is None:  # scheduler side: the first call
        if method == "update_state_after_alloc":
            return len(args) > 2 and int(args[2]) > 0
        return True
    if method == "start_load_kv":
        meta = connector._get_connector_metadata()
        return bool(getattr(getattr(meta, "meta", None), "loads", ()))
    if method == "wait_for_save":
        return bool(getattr(w, "_pending_saves", ()))
    if method == "handle_preemptions":
        meta = args[0] if args else None
        return bool(getattr(getattr(meta, "meta", None), "preempted", lambda: [])()) and w.in_flight() > 0
    return w.in_flight() > 0


def arm(connector: Any, method: str, action: dict) -> None:
    """Wraps ``connector.method`` so that ``action`` runs once, before its first interesting call.
    ``action``: ``{"pid": p, "signal": "STOP" | "KILL"}`` or ``{"touch": path}``."""
    fn = getattr(connector, method)
    state = {"fired": False}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not state["fired"] and interesting(method, connector, args):
            state["fired"] = True
            if "touch" in action:
                with open(action["touch"], "w"):
                    pass
            else:
                os.kill(int(action["pid"]), getattr(signal, f"SIG{action['signal']}"))
        return fn(*args, **kwargs)

    setattr(connector, method, wrapper)


def time_calls(obj: Any, names: Iterable[str], sink: dict[str, float]) -> None:
    """Wraps each method ``names`` of ``obj`` so that ``sink[name]`` keeps its longest call, in
    seconds."""
    for name in names:
        fn = getattr(obj, name)

        def wrapper(*args: Any, __fn=fn, __name=name, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return __fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                if dt > sink.get(__name, 0.0):
                    sink[__name] = dt

        setattr(obj, name, wrapper)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


class SidecarFault:
    """One fault of ``sidecar`` (python/tests/conftest.py's ``Sidecar``) of kind ``kind`` held
    for ``hold_s`` seconds once a trigger fired. ``stall_file``: the file a stalling lower tier
    waits on (``disk-stalled``)."""

    def __init__(self, sidecar: Any, kind: str, hold_s: float, stall_file: str | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown fault {kind!r}; one of {KINDS}")
        self.sidecar, self.kind, self.hold_s, self.stall_file = sidecar, kind, hold_s, stall_file
        self.fired_at: float | None = None
        self.ended = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def action(self) -> dict:
        """What a trigger does (see :func:`arm`)."""
        if self.kind == "disk-stalled":
            assert self.stall_file is not None, "a disk stall needs the stalling tier's file"
            return {"touch": self.stall_file}
        return {"pid": self.sidecar.pid, "signal": "KILL" if self.kind == "killed" else "STOP"}

    def _fired(self) -> bool:
        if self.kind == "disk-stalled":
            return os.path.exists(self.stall_file)
        if self.kind == "killed":
            return self.sidecar.proc.poll() is not None
        return _state(self.sidecar.pid) == "T"

    def poll(self) -> None:
        """Called between engine steps: notes when the trigger fired, ends the fault after
        ``hold_s``."""
        if self.ended:
            return
        now = time.monotonic()
        if self.fired_at is None:
            if self._fired():
                self.fired_at = now
                if self.kind == "overloaded":
                    self._thread = threading.Thread(target=self._duty_cycle, daemon=True)
                    self._thread.start()
            return
        if now - self.fired_at >= self.hold_s:
            self.end()

    def _duty_cycle(self) -> None:
        pid = self.sidecar.pid
        while not self._stop.wait(0.045):
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.005)
            os.kill(pid, signal.SIGSTOP)

    def end(self) -> None:
        """Ends the fault (idempotent): thawed, restarted, or the stall file removed."""
        if self.ended:
            return
        self.ended = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.kind == "disk-stalled":
            try:
                os.unlink(self.stall_file)
            except FileNotFoundError:
                pass
        elif self.kind == "killed":
            self.sidecar.kill()
            self.sidecar.start()
        else:
            self.sidecar.resume()

    def wait_fired(self, step: Callable[[], Any], max_steps: int = 2000) -> None:
        """Steps (``step()``) until the trigger fired; raises if it never does."""
        for _ in range(max_steps):
            self.poll()
            if self.fired_at is not None:
                return
            step()
        raise AssertionError(f"the {self.kind} fault never fired")
