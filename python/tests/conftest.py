"""Shared pytest fixtures: a real kvtier sidecar process.

``sidecar`` starts ``node bin/kvtier.js serve`` with a temporary JSON config (a small local-cpu
tier, optionally a local-disk tier in a temp dir; the data plane is always on and serves the
host device), on a free loopback port, and waits until it answers PING. The object it yields has
``.endpoint``, ``.pid``, ``.stop()`` (SIGTERM, graceful), ``.kill()`` (SIGKILL), ``.pause()`` /
``.resume()`` (SIGSTOP / SIGCONT) and ``.restart()`` (same endpoint, fresh process).

It runs the compiled build (dist/) when that is present and newer than every TypeScript source,
else the sources (``KVTIER_FROM_SOURCE=1``); set KVTIER_FROM_SOURCE yourself to force either.
Tests marked ``@pytest.mark.sidecar_options(disk=True, cpu_bytes=..., config={...})`` get a
sidecar built with those options.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = PYTHON_DIR.parent
if str(PYTHON_DIR) not in sys.path:
    sys.path.insert(0, str(PYTHON_DIR))

from kvtier_vllm.client import KvtierClient  # noqa: E402
from kvtier_vllm.errors import KvtierError  # noqa: E402

BIN = REPO_ROOT / "bin" / "kvtier.js"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sidecar_options(**kw): options of the `sidecar` fixture (disk, cpu_bytes, config)"
    )
    # SIGTERM (a test runner's timeout) tears down like Ctrl-C, so fixtures stop their sidecars.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt(f"signal {signum}")


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when pytest dies, so no sidecar outlives a
    killed test run (Linux; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def free_port() -> int:
    """A TCP port free a moment ago, below the kernel's ephemeral range: a sidecar restarted on
    its endpoint must not lose the port to an outgoing connection or a ``bind(0)`` of another
    suite on the machine (they take ephemeral ports only). Random, checked by binding it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            start = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        start = 32768
    lo = max(1024, start - 12_000)
    for _ in range(50 if start >= 2048 else 0):
        port = random.randrange(lo, start)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _newest_mtime(root: Path) -> float:
    newest = 0.0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".ts"):
                newest = max(newest, os.stat(os.path.join(dirpath, name)).st_mtime)
    return newest


def _from_source() -> bool:
    forced = os.environ.get("KVTIER_FROM_SOURCE")
    if forced is not None and forced != "":
        return forced == "1"
    main_js = REPO_ROOT / "dist" / "src" / "cli" / "main.js"
    if not main_js.exists():
        return True
    return _newest_mtime(REPO_ROOT / "src") > main_js.stat().st_mtime


FROM_SOURCE = _from_source()


class Sidecar:
    """A kvtier sidecar process on a fixed endpoint (see the module docstring)."""

    def __init__(
        self,
        *,
        disk: bool = False,
        cpu_bytes: int = 64 * 1024 * 1024,
        config: dict | None = None,
        curve=None,
        dir: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        # curve: the keys the readiness PING uses when the config turns CurveZMQ on.
        self.curve = curve
        # env: extra environment of the sidecar process (e.g. a KVTIER_TEST_* fault).
        self.extra_env = dict(env or {})
        self.dir = dir if dir is not None else Path(tempfile.mkdtemp(prefix="kvtier-pytest-"))
        self.port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        tiers: list[dict] = [{"name": "cpu", "type": "local-cpu", "capacityBytes": cpu_bytes}]
        if disk:
            tiers.append(
                {
                    "name": "disk",
                    "type": "local-disk",
                    "path": str(self.dir / "disk"),
                    "capacityBytes": 256 * 1024 * 1024,
                }
            )
        cfg: dict = {"listen": self.endpoint, "metrics": None, "tiers": tiers, "logLevel": "warn"}
        cfg.update(config or {})
        self.config = cfg
        self.config_path = self.dir / "kvtier.json"
        self.config_path.write_text(json.dumps(cfg))
        self.log_path = self.dir / "sidecar.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None, "sidecar is not running"
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("sidecar is already running")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVTIER_")}
        env["XDG_CACHE_HOME"] = str(self.dir / "cache")
        if FROM_SOURCE:
            env["KVTIER_FROM_SOURCE"] = "1"
        env.update(self.extra_env)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                ["node", str(BIN), "serve", "--config", str(self.config_path)],
                cwd=str(REPO_ROOT),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        finally:
            log.close()
        self.starts += 1
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        client = KvtierClient(self.endpoint, request_timeout_ms=500, curve=self.curve)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"kvtier serve exited with {self.proc.returncode} before answering PING:\n{self.log()[-4000:]}"
                    )
                # Only this process's sidecar counts: another run's sidecar may have taken the
                # port between free_port() and the bind (ours then exits, seen above).
                if self.log().count(f"serving on {self.endpoint}") < self.starts:
                    if time.monotonic() > deadline:
                        self.kill()
                        raise RuntimeError(
                            f"kvtier serve did not report serving on {self.endpoint} within {START_TIMEOUT_S} s:\n{self.log()[-4000:]}"
                        )
                    time.sleep(0.02)
                    continue
                try:
                    client.ping()
                    return
                except KvtierError:
                    if time.monotonic() > deadline:
                        self.kill()
                        raise RuntimeError(
                            f"kvtier serve did not answer PING within {START_TIMEOUT_S} s:\n{self.log()[-4000:]}"
                        ) from None
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM (graceful close), SIGKILL if it takes longer than 15 s. Idempotent."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        self.resume()
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def kill(self) -> None:
        """SIGKILL: no goodbye; in-flight requests are lost. Idempotent."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.kill()
        p.wait()

    def pause(self) -> None:
        """SIGSTOP: the connection stays open but nothing is answered."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT (undoes pause)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self, kill: bool = True) -> None:
        """Kills (or with ``kill=False`` stops) the process and starts a new one on the same
        endpoint. Host-memory chunks are gone; the disk tier's survive."""
        if kill:
            self.kill()
        else:
            self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def sidecar(request: pytest.FixtureRequest):
    """A fresh sidecar per test (options from the ``sidecar_options`` marker)."""
    marker = request.node.get_closest_marker("sidecar_options")
    s = Sidecar(**(marker.kwargs if marker else {}))
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="session")
def shared_sidecar():
    """One sidecar for the whole session, for tests that neither stop it nor depend on its
    state being fresh (use distinct lookup ids, namespaces and engine ids)."""
    s = Sidecar(disk=True)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def client_factory():
    """Makes clients that are closed after the test: ``client_factory(endpoint, **options)``."""
    made: list[KvtierClient] = []

    def make(endpoint: str, **kw) -> KvtierClient:
        c = KvtierClient(endpoint, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
