"""Byte-exact across processes: worker A (one process) registers a shared-memory KV cache and
saves requests; worker B (another process, other block ids, its own KV file) looks them up and
loads them; every byte of every loaded block is compared with the KV A computed."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "support" / "two_process_worker.py"


def run(role: str, endpoint: str, tag: str, n: int) -> dict:
    p = subprocess.run(
        [sys.executable, str(SCRIPT), role, endpoint, tag, str(n)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, f"worker {role} failed:\n{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_two_processes_save_and_load_byte_exact(sidecar):
    tag = uuid.uuid4().hex[:10]  # same model id in both processes: same namespace
    assert run("save", sidecar.endpoint, tag, 6) == {"saved": 6}
    report = run("load", sidecar.endpoint, tag, 6)
    assert report["mismatched"] == 0
    assert report["loaded_tokens"] == sum(((300 + 37 * i - 1) // 64) * 64 for i in range(6))
    assert report["blocks_checked"] == report["loaded_tokens"] // 16
