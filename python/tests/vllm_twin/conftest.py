"""Fixtures of the vLLM twin: the stand-in ``vllm`` package on ``sys.path``, two long-lived
worker processes (tensor parallelism 2), a shared sidecar, and a helper that runs an engine and
checks the end-of-run invariants (``twin``).

The twin needs PyTorch; without it nothing here is collected (test/python/twin.test.ts runs the
twin in a virtual environment that has it, or reports why it could not make one).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    if str(HERE / "stub") not in sys.path:
        sys.path.insert(0, str(HERE / "stub"))

from tests.conftest import Sidecar  # noqa: E402


@pytest.fixture(scope="session")
def pool():
    from tests.vllm_twin.twin.executor import WorkerPool

    p = WorkerPool(2)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="session")
def twin_sidecar():
    """One sidecar for the scenarios that neither stop nor freeze it (each uses its own model id,
    so namespaces never meet)."""
    s = Sidecar(cpu_bytes=64 * 1024 * 1024)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def twin(pool, twin_sidecar, request):
    """``twin(**spec)`` makes an engine on the shared sidecar (or ``sidecar=`` another); every
    engine made is closed after the test and the end-of-run invariants checked: nothing held by
    the scheduler or the workers, and the sidecar holding no pins."""
    from tests.engine_kit.engines import engine_maker
    from tests.vllm_twin.twin.engine import EngineSpec, TwinEngine

    def build(sc, n, kw):
        kw.setdefault("model", f"twin-{request.node.name}-{n}")
        return TwinEngine(EngineSpec(endpoint=sc.endpoint, **kw), pool)

    yield from engine_maker(build, twin_sidecar)
