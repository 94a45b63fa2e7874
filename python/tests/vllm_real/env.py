"""Makes (once) and finds the environment in which vLLM's own code drives kvtier's connector.

vLLM's Python source comes from a ``git archive`` tarball (``vllm-<commit>-src.tar.xz``, found
through ``$KVTIER_VLLM_SRC``, ``<repo>/../shared/vendor/`` or ``/work/shared/vendor/``); it is
unpacked into a cache directory and installed editable, without kernels, into a virtual
environment of the interpreter that runs this script:

- PyTorch ``2.13.0+cpu`` and vLLM's ``requirements/common.txt`` from the machine's pip
  configuration (offline package indexes), minus the packages those indexes lack
  (:data:`UNAVAILABLE`; they get import-time stand-ins, ``standins/``), with the pins the
  indexes cannot meet relaxed (:data:`RELAXED`);
- vLLM with ``VLLM_TARGET_DEVICE=empty`` and a version ending in ``cpu``, so vLLM picks its CPU
  platform;
- a Hugging Face cache holding ``facebook/opt-125m``'s ``config.json`` (vLLM's test utilities
  read it), used with ``HF_HUB_OFFLINE=1``.

``python3 python/tests/vllm_real/env.py`` prints one JSON line (``python``, ``src``, ``hf_home``,
``commit``, ``cached``) and exits 0, or prints why it could not make the environment and exits 3
(no tarball, no package index, no venv module). The environment lives under
``$KVTIER_VLLM_CACHE`` (default ``$XDG_CACHE_HOME/kvtier`` or ``~/.cache/kvtier``), keyed by the
tarball's digest, the interpreter's version and everything below that decides what is
installed; a lock keeps two runs from building it at once. Standard library only.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
UNAVAILABLE_EXIT = 3

TORCH = "torch==2.13.0+cpu"
#: What vLLM's tests, kvtier's harness and kvtier's connector (msgpack: its event follower) need
#: besides vLLM's own requirements.
EXTRA = ["pytest", "tblib", "uvloop", "setuptools_scm", "wheel", "transformers", "msgpack"]
#: In vLLM's requirements/common.txt but not in this machine's package indexes: stand-ins.
UNAVAILABLE = frozenset(
    {
        "blake3", "compressed-tensors", "depyf", "ijson", "llguidance", "lm-format-enforcer",
        "mistral_common", "model-hosting-container-standards", "openai-harmony",
        "opentelemetry-api", "opentelemetry-exporter-otlp", "opentelemetry-sdk",
        "opentelemetry-semantic-conventions-ai", "outlines_core", "partial-json-parser",
        "prometheus-fastapi-instrumentator", "pybase64", "setproctitle", "xgrammar",
    }
)
#: Exact pins the indexes cannot meet, relaxed to the name alone; extras dropped.
RELAXED = frozenset({"lark"})
DROP_EXTRAS = frozenset({"fastapi"})
VERSION = "0.0.0.dev0+g{short}.cpu"
STANDINS = HERE / "standins" / "kvtier_import_standins.py"
OPT_CONFIG = HERE / "hf" / "opt-125m-config.json"
CHECK = (
    "import vllm\n"
    "from vllm.v1.core.sched.scheduler import Scheduler\n"
    "from vllm.v1.core.sched.async_scheduler import AsyncScheduler\n"
    "from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory\n"
    "from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_initialized\n"
    "from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin\n"
    "import torch, transformers, zmq, msgpack, numpy, pytest\n"
)


class Unavailable(RuntimeError):
    """The environment cannot be made on this machine; the message says why, in one line."""


def find_tarball() -> Path:
    env = os.environ.get("KVTIER_VLLM_SRC")
    if env:
        p = Path(env)
        if not p.is_file():
            raise Unavailable(f"KVTIER_VLLM_SRC={env} is not a file")
        return p
    for d in (REPO.parent / "shared" / "vendor", Path("/work/shared/vendor")):
        found = sorted(d.glob("vllm-*-src.tar.xz")) if d.is_dir() else []
        if found:
            return found[-1]
    raise Unavailable("no vLLM source tarball (set KVTIER_VLLM_SRC, or put vllm-<commit>-src.tar.xz in ../shared/vendor)")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tarball_commit(path: Path) -> str:
    """The commit ``git archive`` wrote into the tarball's pax header."""
    with tarfile.open(path) as t:
        commit = t.pax_headers.get("comment", "")
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise Unavailable(f"{path.name} carries no git commit in its pax header")
    return commit


def cache_root() -> Path:
    env = os.environ.get("KVTIER_VLLM_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvtier"


def env_dir(tarball: Path) -> Path:
    inputs = repr((
        _digest(tarball), sys.version_info[:2], TORCH, EXTRA, sorted(UNAVAILABLE), sorted(RELAXED),
        sorted(DROP_EXTRAS), STANDINS.read_bytes(), OPT_CONFIG.read_bytes(), CHECK,
    ))
    return cache_root() / f"vllm-env-py{sys.version_info[0]}{sys.version_info[1]}-{hashlib.sha256(inputs.encode()).hexdigest()[:12]}"


def requirements(common_txt: str) -> list[str]:
    """vLLM's common requirements as this machine's indexes can meet them."""
    out = []
    for raw in common_txt.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?(.*)", line)
        if m is None:
            continue
        name, extras, rest = m.group(1), m.group(2) or "", m.group(3)
        if name in UNAVAILABLE:
            continue
        if name in RELAXED:
            out.append(name)
            continue
        if name in DROP_EXTRAS:
            extras = ""
        out.append(f"{name}{extras}{rest}")
    return out


def _run(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
    return lines[-1] if lines else "no output"


def _pip(python: Path, args: list[str], env: dict | None = None) -> None:
    res = _run([str(python), "-m", "pip", "install", "-q", "--retries", "0", "--timeout", "20",
                "--disable-pip-version-check", *args], env=env)
    if res.returncode != 0:
        raise Unavailable(f"pip could not install vLLM's dependencies (no package index here?): {_last_line(res.stderr or res.stdout)}")


def _site_packages(python: Path) -> Path:
    res = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    return Path(res.stdout.strip())


def _hf_cache(root: Path) -> Path:
    rev = "0" * 40
    repo = root / "hub" / "models--facebook--opt-125m"
    (repo / "snapshots" / rev).mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    shutil.copyfile(OPT_CONFIG, repo / "snapshots" / rev / "config.json")
    return root


def _build(d: Path, tarball: Path, commit: str) -> None:
    src = d / "src"
    with tarfile.open(tarball) as t:
        try:
            t.extractall(src, filter="data")
        except TypeError:  # Python before 3.11.4: the archive is git's own, paths are plain
            t.extractall(src)
    made = _run([sys.executable, "-m", "venv", "--clear", str(d / "venv")])
    if made.returncode != 0:
        raise Unavailable(f"{sys.executable} cannot make a virtual environment: {_last_line(made.stderr)}")
    python = d / "venv" / "bin" / "python"
    reqs = requirements((src / "requirements" / "common.txt").read_text())
    _pip(python, [TORCH, *reqs, *EXTRA])
    site = _site_packages(python)
    shutil.copyfile(STANDINS, site / STANDINS.name)
    (site / "zz_kvtier_import_standins.pth").write_text(f"import {STANDINS.stem}\n")
    env = {**os.environ, "VLLM_TARGET_DEVICE": "empty", "VLLM_VERSION_OVERRIDE": VERSION.format(short=commit[:8])}
    _pip(python, ["--no-build-isolation", "--no-deps", "-e", str(src)], env=env)
    _hf_cache(d / "hf")
    # vLLM imports hundreds of modules: compiled once here, not on every run.
    _run([str(python), "-m", "compileall", "-q", "-j", "0", str(src / "vllm"), str(src / "tests" / "v1" / "kv_connector")])
    check = _run([str(python), "-c", CHECK], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if check.returncode != 0:
        raise Unavailable(f"the environment does not import vLLM's scheduler and connector code: {_last_line(check.stderr)}")


def ensure() -> dict:
    """The environment (made first when needed): ``python``, ``src``, ``hf_home``, ``commit``,
    ``cached`` (False when this call built it).

    :raises Unavailable: with the reason when it cannot be made here.
    """
    tarball = find_tarball()
    commit = tarball_commit(tarball)
    d = env_dir(tarball)
    info = {"python": str(d / "venv" / "bin" / "python"), "src": str(d / "src"), "hf_home": str(d / "hf"),
            "commit": commit, "cached": True, "dir": str(d)}
    if (d / ".ready").exists():
        return info
    d.parent.mkdir(parents=True, exist_ok=True)
    with open(d.parent / f"{d.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (d / ".ready").exists():
            return info
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        t0 = time.monotonic()
        try:
            _build(d, tarball, commit)
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)
            raise
        (d / ".ready").write_text(json.dumps({"commit": commit, "build_s": round(time.monotonic() - t0, 1)}) + "\n")
    return {**info, "cached": False}


def main() -> int:
    try:
        print(json.dumps(ensure()))
        return 0
    except Unavailable as err:
        print(err)
        return UNAVAILABLE_EXIT


if __name__ == "__main__":
    sys.exit(main())
