"""Processes and tensors of the GPU check (gpu_check.py): the sidecar and the Node driver from the
carried bundle, and vLLM-shaped KV caches as torch CUDA tensors or, for the ``--cpu`` dry run,
numpy arrays in a shared-memory file. Needs no pyzmq: every request goes through the driver."""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class CheckError(Exception):
    """A step of the check failed; the message says which and why."""


class DriverError(CheckError):
    def __init__(self, op: str, code: str, message: str) -> None:
        super().__init__(f"{op}: {code}: {message}")
        self.code = code
        self.message = message


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sidecar:
    """``kvtier serve`` from the bundle, with one CPU tier, its stderr in ``log_path``."""

    def __init__(
        self, node: str, kvtier: Path, cpu_bytes: int, log_path: Path, *, prefault: bool, env: dict | None = None, log_level: str = "warn"
    ) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.dir = tempfile.mkdtemp(prefix="kvtier-gpu-check-")
        cfg = {
            "listen": self.endpoint,
            "metrics": None,
            "logLevel": log_level,
            "tiers": [{"name": "cpu", "type": "local-cpu", "capacityBytes": cpu_bytes, "prefault": prefault}],
        }
        path = os.path.join(self.dir, "kvtier.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        self.cpu_bytes = cpu_bytes
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [node, str(kvtier / "dist" / "kvtier.mjs"), "serve", "--config", path],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=self.dir,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


class StateFile:
    """A state file of 4-byte words in shared memory, as a worker registers it (``stateFile``)."""

    def __init__(self, slots: int = 16) -> None:
        import mmap

        fd, self.path = tempfile.mkstemp(prefix="kvtier-gpu-check-state-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.ftruncate(fd, 4 * slots)
        self.slots = slots
        self.mm = mmap.mmap(fd, 4 * slots)
        os.close(fd)

    def word(self, slot: int) -> int:
        return struct.unpack_from("<i", self.mm, 4 * slot)[0]

    def zero(self, *slots: int) -> None:
        for s in slots:
            struct.pack_into("<i", self.mm, 4 * s, 0)

    def close(self) -> None:
        self.mm.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Driver:
    """The Node driver (scripts/gpu/driver.ts): one JSON request a line, one answer a line."""

    def __init__(self, node: str, kvtier: Path, sidecar: Sidecar, log_path: Path, env: dict | None = None) -> None:
        self.sidecar = sidecar
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [node, str(kvtier / "dist" / "gpu-driver.mjs"), "--endpoint", sidecar.endpoint],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, **(env or {})},
        )
        self._next = 0
        self._buf = b""

    def call(self, op: str, timeout_s: float = 90.0, **kw: Any) -> dict:
        self.send(op, **kw)
        return self.receive(op, timeout_s)

    def send(self, op: str, **kw: Any) -> None:
        """Sends a request without waiting (then :meth:`receive` its answer)."""
        self._next += 1
        msg = {"id": self._next, "op": op, **kw}
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def receive(self, op: str, timeout_s: float = 90.0) -> dict:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckError(f"{op}: no answer from the driver within {timeout_s:.0f} s")
            if not self.sidecar.alive():
                raise CheckError(f"{op}: the sidecar exited with {self.sidecar.proc.returncode}")
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise CheckError(f"{op}: the driver exited with {self.proc.wait()}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        rep = json.loads(line)
        if rep.get("id") != self._next:
            raise CheckError(f"{op}: answer {rep.get('id')} to request {self._next}")
        if not rep.get("ok"):
            raise DriverError(op, str(rep.get("code")), str(rep.get("error")))
        return rep

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def wait_ready(drv: Driver, timeout_s: float = 120.0) -> dict:
    """PING until the sidecar answers; then, with prefault on, until its CPU tier is committed."""
    pong = drv.call("ping", timeout_s=timeout_s)["info"]
    deadline = time.monotonic() + timeout_s
    while True:
        stats = drv.call("stats")["stats"]
        tiers = stats.get("tiers") or []
        cpu = tiers[0] if tiers else {}
        done = cpu.get("prefaultedBytes")
        if done is None or done >= drv.sidecar.cpu_bytes or time.monotonic() > deadline:
            return pong
        time.sleep(0.2)


# --------------------------------------------------------------------------- KV caches


@dataclass
class Geometry:
    """One KV cache: ``layers`` tensors of one layout (``flash_attn``, ``flash_attn_hnd``,
    ``flashinfer``, ``mla``), ``num_blocks`` blocks of ``block_size`` tokens."""

    layout: str
    layers: int
    num_blocks: int
    block_size: int
    heads: int
    head_dim: int

    @property
    def mla(self) -> bool:
        return self.layout == "mla"

    @property
    def regions(self) -> int:
        return 1 if self.mla else 2

    @property
    def block_bytes(self) -> int:  # one region of one block, 2-byte elements
        return self.block_size * (1 if self.mla else self.heads) * self.head_dim * 2

    def bytes_for(self, blocks: int) -> int:
        return blocks * self.layers * self.regions * self.block_bytes


@dataclass
class KvCache:
    geo: Geometry
    tensors: dict  # layer name -> tensor / array (logical layout shape)
    raw: list = field(default_factory=list)  # what must stay alive (mmap, physical tensors)
    path: str | None = None

    def close(self) -> None:
        self.tensors.clear()
        self.raw.clear()
        if self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def _shape(geo: Geometry) -> tuple:
    nb, bs, h, d = geo.num_blocks, geo.block_size, geo.heads, geo.head_dim
    return {
        "flash_attn": (2, nb, bs, h, d),
        "flash_attn_hnd": (2, nb, bs, h, d),
        "flashinfer": (nb, 2, bs, h, d),
        "mla": (nb, bs, d),
    }[geo.layout]


def torch_kv_cache(torch: Any, geo: Geometry, device: str = "cuda") -> KvCache:
    """Per-layer CUDA tensors filled with random bf16 bit patterns (NaNs included: blocks are
    compared as int16). HND is vLLM's permuted view of head-major blocks."""
    out: dict = {}
    raw: list = []
    for i in range(geo.layers):
        if geo.layout == "flash_attn_hnd":
            phys = torch.empty((2, geo.num_blocks, geo.heads, geo.block_size, geo.head_dim), dtype=torch.bfloat16, device=device)
            t = phys.permute(0, 1, 3, 2, 4)
        else:
            phys = torch.empty(_shape(geo), dtype=torch.bfloat16, device=device)
            t = phys
        phys.view(torch.int16).random_(-(2**15), 2**15 - 1)
        raw.append(phys)
        out[f"model.layers.{i}.self_attn.attn"] = t
    if device == "cuda":
        torch.cuda.synchronize()
    return KvCache(geo, out, raw)


def numpy_kv_cache(np: Any, geo: Geometry, seed: int) -> KvCache:
    """The same caches for the host device: views of one shared-memory file (kvtier_vllm's own
    allocator), filled with random bytes."""
    from kvtier_vllm.kv_caches import allocate_host_kv_cache

    shm = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    path = os.path.join(shm, f"kvtier-gpu-check-{os.getpid()}-{geo.layout}-{seed}")
    layout = "flash_attn" if geo.layout == "flash_attn_hnd" else geo.layout
    cache = allocate_host_kv_cache(
        path,
        num_layers=geo.layers,
        num_blocks=geo.num_blocks,
        block_size=geo.block_size,
        num_heads=geo.heads,
        head_dim=geo.head_dim,
        dtype="float16",
        layout=layout,
        in_block="HND" if geo.layout == "flash_attn_hnd" else "NHD",
    )
    flat = np.frombuffer(cache._mmap, dtype=np.uint8)
    flat[:] = np.random.default_rng(seed).integers(0, 256, size=flat.size, dtype=np.uint8)
    tensors = {f"model.layers.{i}.self_attn.attn": t for i, t in enumerate(cache.layers)}
    return KvCache(geo, tensors, [cache], path)


def blocks_of(t: Any, layout: str, ids: Any) -> Any:
    """The blocks ``ids`` of one layer (a copy), K and V together."""
    return t[ids] if layout in ("flashinfer", "mla") else t[:, ids]


def poison_blocks(lib: Any, t: Any, layout: str, ids: Any) -> None:
    """Overwrites blocks ``ids`` with a pattern, so a block the load skips shows."""
    if lib.__name__ == "torch":
        v = t.view(lib.int16)
    else:
        v = t.view(lib.uint16)
    if layout in ("flashinfer", "mla"):
        v[ids] = 0x5A5A
    else:
        v[:, ids] = 0x5A5A


def mismatched_blocks(lib: Any, cache: KvCache, src: list, dst: list) -> int:
    """Blocks of ``dst`` whose bytes differ from the matching ``src`` block, over every layer."""
    layout = cache.geo.layout
    torch_side = lib.__name__ == "torch"
    if torch_side:
        device = next(iter(cache.tensors.values())).device
        si = lib.tensor(src, device=device)
        di = lib.tensor(dst, device=device)
    else:
        si, di = lib.asarray(src), lib.asarray(dst)
    bad = set()
    for t in cache.tensors.values():
        a = blocks_of(t, layout, si)
        b = blocks_of(t, layout, di)
        if torch_side:
            a, b = a.contiguous().view(lib.int16), b.contiguous().view(lib.int16)
            if lib.equal(a, b):
                continue
            diff = (a != b)
        else:
            a, b = lib.ascontiguousarray(a).view(lib.uint16), lib.ascontiguousarray(b).view(lib.uint16)
            if lib.array_equal(a, b):
                continue
            diff = a != b
        # Block axis: 0 for flashinfer / MLA, 1 for FlashAttention's [2, n, ...].
        axis = 0 if layout in ("flashinfer", "mla") else 1
        other = tuple(x for x in range(diff.ndim) if x != axis)
        per_block = diff.any(dim=other) if torch_side else diff.any(axis=other)
        for j, flag in enumerate(per_block.tolist()):
            if flag:
                bad.add(j)
    return len(bad)
