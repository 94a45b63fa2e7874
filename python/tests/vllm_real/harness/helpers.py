"""Small helpers the scenarios share."""

from __future__ import annotations

import random
import time

from .engine import EngineAssertionError


def prompt(seed: int, n: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(3, 32000) for _ in range(n)]


def step_until(engine, cond, max_steps: int = 500, idle_s: float = 120.0) -> None:
    """Steps until ``cond()`` holds; raises past ``max_steps`` steps that computed tokens or
    ``idle_s`` seconds in a row of steps that computed none (see ``RealEngine.run``)."""
    steps, idle_since = 0, None
    while not cond():
        engine.step()
        if engine.last_scheduled_tokens:
            steps, idle_since = steps + 1, None
        else:
            idle_since = idle_since or time.monotonic()
        if steps > max_steps or (idle_since is not None and time.monotonic() - idle_since > idle_s):
            raise EngineAssertionError(f"condition not reached within {max_steps} steps")


def status(engine, request_id: str):
    req = engine.scheduler.requests.get(request_id)
    return None if req is None else req.status


def loading(engine, request_id: str) -> bool:
    from vllm.v1.request import RequestStatus

    return status(engine, request_id) == RequestStatus.WAITING_FOR_REMOTE_KVS


def offered(engine, request_id: str) -> list[int]:
    """The tokens vLLM allocated for kvtier to load, at each admission of the request (0: none)."""
    return [n for rid, n in engine.admissions if rid == request_id]


def serve(engine, request_id: str, tokens: list[int], max_tokens: int = 2, max_steps: int = 500) -> None:
    """Runs one request to its end (and every other one the engine has)."""
    engine.add_request(request_id, tokens, max_tokens)
    engine.run(max_steps)


def run_clearing_before_the_load(engine, endpoint: str, max_steps: int = 300) -> None:
    """Runs the engine's requests, sending the sidecar at ``endpoint`` a CLEAR before every step
    whose metadata carries a LOAD: the chunks a lookup answered are gone when the load runs."""
    from kvtier_vllm.client import KvtierClient

    admin = KvtierClient(endpoint)

    def clear_before_the_load(so):
        if so.kv_connector_metadata.meta.loads:
            admin.clear()

    try:
        for _ in range(max_steps):
            if not engine.busy():
                break
            engine.step(before_execute=clear_before_the_load)
    finally:
        admin.close()
