"""The workers of one engine: ``tp`` processes (spawned once per test session and reused), each
running a :class:`~.worker.TwinWorker`; a step goes to every worker and their outputs are merged
by vLLM's ``KVOutputAggregator``."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STUB = str(HERE.parent / "stub")
PYTHON_DIR = str(HERE.parents[2])


class WorkerError(RuntimeError):
    """A worker process raised; the message carries its traceback."""


def _worker_main(conn, rank: int) -> None:
    sys.path[:0] = [STUB, PYTHON_DIR]
    import logging

    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING, format=f"[worker {rank}] %(name)s %(levelname)s %(message)s")
    from tests.vllm_twin.twin.worker import TwinWorker

    # One worker per engine: a test may run several engines at once.
    workers: dict[str, TwinWorker] = {}
    while True:
        try:
            cmd, key, arg = conn.recv()
        except EOFError:
            break
        try:
            if cmd == "init":
                w = workers[key] = TwinWorker(rank, arg)
                conn.send(("ok", {"in_block": w.in_block, "path": w.kv.path}))
            elif cmd == "step":
                conn.send(("ok", workers[key].execute(arg)))
            elif cmd == "provide":
                workers[key].provide(*arg)
                conn.send(("ok", None))
            elif cmd == "stats":
                conn.send(("ok", workers[key].connector_stats()))
            elif cmd == "gather":
                conn.send(("ok", workers[key].gather(*arg)))
            elif cmd == "close":
                w = workers.pop(key, None)
                conn.send(("ok", w.close() if w is not None else {}))
            elif cmd == "exit":
                for w in workers.values():
                    w.close()
                conn.send(("ok", None))
                conn.close()
                # Nothing is left to flush: skip the interpreter's (torch's) slow teardown.
                os._exit(0)
            else:
                conn.send(("error", f"unknown command {cmd!r}"))
        except BaseException:  # reported to the engine, which fails the test
            conn.send(("error", traceback.format_exc()))


class WorkerPool:
    """``size`` long-lived worker processes (spawned: each imports torch once)."""

    def __init__(self, size: int = 2) -> None:
        ctx = mp.get_context("spawn")
        self.conns = []
        self.procs = []
        for rank in range(size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(child, rank), daemon=True, name=f"twin-worker-{rank}")
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)

    def call_all(self, cmd: str, key: str, args: list[Any], timeout_s: float = 120.0) -> list[Any]:
        """Sends ``cmd`` for engine ``key`` to the first ``len(args)`` workers; their answers."""
        for conn, arg in zip(self.conns, args):
            conn.send((cmd, key, arg))
        replies = [self._raw_reply(conn, timeout_s) for conn in self.conns[: len(args)]]
        for status, value in replies:
            if status != "ok":
                raise WorkerError(value)
        return [value for _, value in replies]

    def call(self, rank: int, cmd: str, key: str, arg: Any, timeout_s: float = 120.0) -> Any:
        self.conns[rank].send((cmd, key, arg))
        return self._reply(self.conns[rank], timeout_s)

    def _raw_reply(self, conn, timeout_s: float) -> tuple[str, Any]:
        if not conn.poll(timeout_s):
            raise WorkerError(f"a worker did not answer within {timeout_s} s")
        return conn.recv()

    def _reply(self, conn, timeout_s: float) -> Any:
        status, value = self._raw_reply(conn, timeout_s)
        if status != "ok":
            raise WorkerError(value)
        return value

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("exit", "", None))
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
