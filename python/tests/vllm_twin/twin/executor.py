"""The workers of one engine: ``tp`` processes (spawned once per test session and reused), each
running a :class:`~.worker.TwinWorker`; a step goes to every worker and their outputs are merged
by vLLM's ``KVOutputAggregator``."""

from __future__ import annotations

import multiprocessing as mp
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

    worker = None
    while True:
        try:
            cmd, arg = conn.recv()
        except EOFError:
            break
        try:
            if cmd == "init":
                worker = TwinWorker(rank, arg)
                conn.send(("ok", {"in_block": worker.in_block, "path": worker.kv.path}))
            elif cmd == "step":
                conn.send(("ok", worker.execute(arg)))
            elif cmd == "provide":
                worker.provide(*arg)
                conn.send(("ok", None))
            elif cmd == "gather":
                conn.send(("ok", worker.gather(*arg)))
            elif cmd == "call":
                conn.send(("ok", getattr(worker.connector, arg[0])(*arg[1])))
            elif cmd == "close":
                info = worker.close() if worker is not None else {}
                worker = None
                conn.send(("ok", info))
            elif cmd == "exit":
                conn.send(("ok", None))
                break
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

    def call_all(self, cmd: str, args: list[Any], timeout_s: float = 120.0) -> list[Any]:
        for conn, arg in zip(self.conns, args):
            conn.send((cmd, arg))
        replies = [self._raw_reply(conn, timeout_s) for conn in self.conns[: len(args)]]
        for status, value in replies:
            if status != "ok":
                raise WorkerError(value)
        return [value for _, value in replies]

    def call(self, rank: int, cmd: str, arg: Any, timeout_s: float = 120.0) -> Any:
        self.conns[rank].send((cmd, arg))
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
                conn.send(("exit", None))
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
