"""The worker processes of an engine: a pair of spawned processes (tensor parallelism 2) that
form one torch.distributed group (gloo) with vLLM's ``init_distributed_environment`` and
``ensure_model_parallel_initialized``, as vLLM's multiprocess executor does, and serve one engine
at a time (vLLM's connector agent is one per process). A pair is made once per test session and
reused by engine after engine; a step is sent to both ranks, and the engine collects their
outputs in order, so it can schedule the next step while the workers run this one (vLLM's batch
queue under asynchronous scheduling)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

PYTHON_DIR = str(Path(__file__).resolve().parents[3])


class WorkerError(RuntimeError):
    """A worker process raised; the message carries its traceback."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_main(conn: Any, rank: int, world: int, port: int) -> None:
    if PYTHON_DIR not in sys.path:
        sys.path.insert(0, PYTHON_DIR)
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING, format=f"[worker {rank}] %(name)s %(levelname)s %(message)s")
    logging.getLogger("kvtier_vllm.worker").setLevel(os.environ.get("KVTIER_DEBUG_WORKER", "WARNING"))
    from vllm.config import DeviceConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment

    from .model_runner import StandInModelRunner, install_layer_hooks

    with set_current_vllm_config(VllmConfig(parallel_config=ParallelConfig(tensor_parallel_size=world), device_config=DeviceConfig("cpu"))):
        init_distributed_environment(
            world_size=world, rank=rank, distributed_init_method=f"tcp://127.0.0.1:{port}", local_rank=rank, backend="gloo"
        )
        ensure_model_parallel_initialized(world, 1)
    install_layer_hooks()
    runner: StandInModelRunner | None = None
    conn.send(("ok", None))
    while True:
        try:
            cmd, arg = conn.recv()
        except EOFError:
            break
        try:
            if cmd == "init":
                runner = StandInModelRunner({**arg, "rank": rank, "unopenable": rank in arg.get("unopenable_ranks", ())})
                conn.send(("ok", {"in_block": runner.in_block, "path": runner.kv.path}))
            elif cmd == "step":
                conn.send(("ok", runner.execute_model(arg)))
            elif cmd == "provide":
                runner.provide(*arg)
                conn.send(("ok", None))
            elif cmd == "stats":
                conn.send(("ok", runner.connector_stats()))
            elif cmd == "gather":
                conn.send(("ok", runner.gather(*arg)))
            elif cmd == "close":
                info = runner.close() if runner is not None else {}
                runner = None
                conn.send(("ok", info))
            elif cmd == "exit":
                if runner is not None:
                    runner.close()
                conn.send(("ok", None))
                conn.close()
                os._exit(0)  # nothing left to flush: skip torch's slow teardown
            else:
                conn.send(("error", f"unknown command {cmd!r}"))
        except BaseException:  # reported to the engine, which fails the test
            conn.send(("error", traceback.format_exc()))


class WorkerPair:
    """``world`` long-lived worker processes forming one tensor-parallel group."""

    def __init__(self, world: int = 2, env: dict[str, str] | None = None) -> None:
        ctx = mp.get_context("spawn")
        port = _free_port()
        self.world = world
        self.conns = []
        self.procs = []
        for rank in range(world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(child, rank, world, port), daemon=True, name=f"vllm-worker-{rank}")
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        for conn in self.conns:
            self._reply(conn, 300.0)
        self.busy = False

    def send_all(self, cmd: str, arg: Any) -> None:
        for conn in self.conns:
            conn.send((cmd, arg))

    def ready(self) -> bool:
        """True when every rank has answered the oldest command sent."""
        return all(conn.poll(0) for conn in self.conns)

    def collect(self, timeout_s: float = 120.0) -> list[Any]:
        """Every rank's answer to the oldest command sent (raises a rank's error)."""
        replies = [self._raw(conn, timeout_s) for conn in self.conns]
        for status, value in replies:
            if status != "ok":
                raise WorkerError(value)
        return [value for _, value in replies]

    def collect_raw(self, timeout_s: float = 120.0) -> list[tuple[str, Any]]:
        """Every rank's answer to the oldest command sent, errors included (not raised)."""
        return [self._raw(conn, timeout_s) for conn in self.conns]

    def call_all(self, cmd: str, arg: Any, timeout_s: float = 120.0) -> list[Any]:
        self.send_all(cmd, arg)
        return self.collect(timeout_s)

    def call(self, rank: int, cmd: str, arg: Any, timeout_s: float = 120.0) -> Any:
        self.conns[rank].send((cmd, arg))
        return self._reply(self.conns[rank], timeout_s)

    def _raw(self, conn: Any, timeout_s: float) -> tuple[str, Any]:
        if not conn.poll(timeout_s):
            raise WorkerError(f"a worker did not answer within {timeout_s} s")
        return conn.recv()

    def _reply(self, conn: Any, timeout_s: float) -> Any:
        status, value = self._raw(conn, timeout_s)
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
