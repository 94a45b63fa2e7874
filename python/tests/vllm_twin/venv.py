"""Makes (once) and finds the virtual environment the twin runs in: PyTorch (CPU), pyzmq, numpy,
pytest and transformers, for the interpreter that runs this script.

``python3 python/tests/vllm_twin/venv.py`` prints the environment's python on stdout and exits 0;
or prints why it could not make one on stdout and exits 3 (no package index reachable, no venv
module). The environment is cached outside the repository, under ``$KVTIER_TWIN_CACHE`` or
``${TMPDIR:-/tmp}``, keyed by the interpreter's version and the requirements; a lock keeps two
runs from building it at once. Standard library only.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: Tried in order until one installs: the CPU build pinned (found offline where the wheel is
#: cached), then the CPU index of PyTorch.
TORCH_CHOICES = (
    ["torch==2.13.0+cpu"],
    ["--extra-index-url", "https://download.pytorch.org/whl/cpu", "torch"],
)
OTHERS = ["pyzmq", "numpy", "pytest", "transformers"]
CHECK = "import torch, transformers, zmq, numpy, pytest"
UNAVAILABLE = 3


def _cache_root() -> Path:
    return Path(os.environ.get("KVTIER_TWIN_CACHE") or tempfile.gettempdir())


def venv_dir() -> Path:
    key = hashlib.sha256(repr((sys.version_info[:2], TORCH_CHOICES, OTHERS)).encode()).hexdigest()[:12]
    return _cache_root() / f"kvtier-twin-venv-py{sys.version_info[0]}{sys.version_info[1]}-{key}"


def _python(d: Path) -> Path:
    return d / "bin" / "python"


def _ready(d: Path) -> bool:
    if not (d / ".ready").exists():
        return False
    return subprocess.run([str(_python(d)), "-c", CHECK], capture_output=True).returncode == 0


def _pip(d: Path, args: list[str]) -> subprocess.CompletedProcess:
    cmd = [str(_python(d)), "-m", "pip", "install", "--retries", "0", "--timeout", "20", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def ensure() -> Path:
    """The environment's python, made first when needed.

    :raises RuntimeError: with the reason when it cannot be made here.
    """
    d = venv_dir()
    if _ready(d):
        return _python(d)
    d.parent.mkdir(parents=True, exist_ok=True)
    with open(d.parent / f"{d.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _ready(d):
            return _python(d)
        made = subprocess.run([sys.executable, "-m", "venv", "--clear", str(d)], capture_output=True, text=True)
        if made.returncode != 0:
            raise RuntimeError(f"{sys.executable} cannot make a virtual environment: {_last_line(made.stderr)}")
        failures = []
        for torch in TORCH_CHOICES:
            res = _pip(d, [*torch, *OTHERS])
            if res.returncode == 0:
                break
            failures.append(_last_line(res.stderr or res.stdout))
        else:
            raise RuntimeError(
                "PyTorch, pyzmq, numpy, pytest and transformers could not be installed (no package index "
                f"reachable?): {' | '.join(failures)}"
            )
        check = subprocess.run([str(_python(d)), "-c", CHECK], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"the environment does not import what the twin needs: {_last_line(check.stderr)}")
        (d / ".ready").write_text("\n".join(OTHERS) + "\n")
    return _python(d)


def main() -> int:
    try:
        print(ensure())
        return 0
    except RuntimeError as err:
        print(err)
        return UNAVAILABLE


if __name__ == "__main__":
    sys.exit(main())
