"""Fixtures of the runs under vLLM's own code: worker pairs (tensor parallelism 2, made once per
session and reused), a shared sidecar, and ``engine(**spec)``, which makes engines and, after the
test, closes them and checks the end of run: vLLM's scheduler empty (its own
``assert_scheduler_empty``), no transfer left in the workers, no pin left on the sidecar.

Collected only where the real ``vllm`` imports (the environment of ``env.py``).
"""

from __future__ import annotations

import importlib.util

import pytest

_vllm = importlib.util.find_spec("vllm")
if _vllm is None or _vllm.origin is None or "vllm_twin" in str(_vllm.origin):
    collect_ignore_glob = ["test_*.py"]

from tests.conftest import Sidecar  # noqa: E402


class PairPool:
    """Worker pairs, made on first use; each serves one engine at a time."""

    def __init__(self) -> None:
        self.pairs: list = []

    def free(self, world: int = 2):
        """A free group of ``world`` workers (tensor-parallel size), made when there is none."""
        from tests.vllm_real.harness.workers import WorkerPair

        for p in self.pairs:
            if not p.busy and p.world == world:
                return p
        p = WorkerPair(world)
        self.pairs.append(p)
        return p

    def close(self) -> None:
        for p in self.pairs:
            p.close()


@pytest.fixture(scope="session")
def pairs():
    pool = PairPool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def real_sidecar():
    """One sidecar for scenarios that neither stop nor freeze it (each uses its own model id,
    so namespaces never meet)."""
    s = Sidecar(cpu_bytes=64 * 1024 * 1024)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def engine(pairs, real_sidecar, request):
    """``engine(**spec)`` makes an engine on the shared sidecar (or ``sidecar=`` another)."""
    from tests.engine_kit.engines import engine_maker
    from tests.vllm_real.harness.engine import RealEngine
    from tests.vllm_real.harness.model import EngineSpec

    def build(sc, n, kw):
        kw.setdefault("model_id", f"vllm-{request.node.name}-{n}")
        return RealEngine(EngineSpec(endpoint=sc.endpoint, **kw), pairs.free(kw.get("tp", 2)))

    yield from engine_maker(build, real_sidecar)
