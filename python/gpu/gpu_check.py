"""GPU check: real CUDA KV tensors handed to a kvtier sidecar through CUDA IPC, saved and loaded
byte-exact, with the copy bandwidth compared against a contiguous copy of the same bytes.

Needs a machine with CUDA, torch, and the sidecar's native addon built with CUDA
(``npm run build:native`` with the CUDA toolkit present). Run from the repository root::

    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False \
      /usr/bin/python3 python/gpu/gpu_check.py [--endpoint tcp://127.0.0.1:5555] [--layout flash_attn]

Without ``--endpoint`` it starts a sidecar itself (``node bin/kvtier.js serve``) with a CPU tier
big enough for the test and stops it at the end. Prints a JSON report; exits 1 on any mismatch.

What it does, per layout (FlashAttention ``[2, nb, bs, h, d]``, FlashInfer ``[nb, 2, bs, h, d]``,
MLA ``[nb, bs, latent]``): allocates the per-layer tensors (random bf16 bytes), registers them
(``device: cuda``, IPC handles parsed from ``_share_cuda_``, the GPU's UUID), SAVEs the blocks of
one long prompt, LOOKUPs it, LOADs it into other blocks (the destination first zeroed) and
compares every loaded block with its source on the GPU (``torch.equal``). Timing: SAVE and LOAD
wall time over the bytes moved (device to host and host to device) against
``torch.Tensor.copy_`` of one contiguous tensor of the same size to and from pinned host memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

from kvtier_vllm.client import KvtierClient  # noqa: E402
from kvtier_vllm.hashing import hash_chunks  # noqa: E402
from kvtier_vllm.kv_caches import build_registration  # noqa: E402


def start_sidecar(cpu_bytes: int) -> tuple[subprocess.Popen, str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    d = tempfile.mkdtemp(prefix="kvtier-gpu-")
    cfg = {"listen": endpoint, "metrics": None, "logLevel": "warn", "tiers": [{"name": "cpu", "type": "local-cpu", "capacityBytes": cpu_bytes}]}
    path = os.path.join(d, "kvtier.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    proc = subprocess.Popen(["node", str(REPO / "bin" / "kvtier.js"), "serve", "--config", path], cwd=str(REPO))
    c = KvtierClient(endpoint, request_timeout_ms=500)
    deadline = time.monotonic() + 60
    while True:
        try:
            info = c.ping()
            break
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the sidecar did not start")
    c.close()
    if not (info.get("dataPlane") or {}):
        print("warning: PONG reports no data plane", file=sys.stderr)
    return proc, endpoint, d


def make_layers(torch, layout: str, layers: int, nb: int, bs: int, h: int, d: int):
    shape = {"flash_attn": (2, nb, bs, h, d), "flashinfer": (nb, 2, bs, h, d), "mla": (nb, bs, d)}[layout]
    out = {}
    for i in range(layers):
        t = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        t.view(torch.int16).random_(-(2**15), 2**15 - 1)
        out[f"model.layers.{i}.self_attn.attn"] = t
    return out


def block_view(t, layout: str, kv: int, b: int):
    if layout == "flash_attn":
        return t[kv, b]
    if layout == "flashinfer":
        return t[b, kv]
    return t[b]


def contiguous_gbps(torch, nbytes: int, reps: int = 5) -> tuple[float, float]:
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    torch.cuda.synchronize()
    best_d2h = best_h2d = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        host.copy_(dev)
        torch.cuda.synchronize()
        best_d2h = min(best_d2h, time.perf_counter() - t0)
        t0 = time.perf_counter()
        dev.copy_(host)
        torch.cuda.synchronize()
        best_h2d = min(best_h2d, time.perf_counter() - t0)
    return nbytes / best_d2h / 1e9, nbytes / best_h2d / 1e9


def run_layout(torch, client: KvtierClient, layout: str, args) -> dict:
    mla = layout == "mla"
    bs, h, d = args.block_size, (1 if mla else args.heads), (576 if mla else args.head_dim)
    nb, chunk = args.num_blocks, args.chunk_size
    bpc = chunk // bs
    kv = make_layers(torch, layout, args.layers, nb, bs, h, d)
    engine = f"gpu-check-{layout}-{uuid.uuid4().hex[:8]}"
    reg = build_registration(
        kv, engine_id=engine, model_id=f"gpu-check/{engine}", dtype="bfloat16",
        num_kv_heads=1 if mla else h, head_dim=d, block_size=bs, mla=mla, chunk_size=chunk, layout=layout,
    )
    result = client.register(reg)
    chunks = args.chunks
    prompt = [(i * 7919 + 13) % 32000 for i in range(chunks * chunk + 1)]
    hashes = b"".join(c.hash for c in hash_chunks(prompt, chunk_size=chunk)[:chunks])
    src = list(range(chunks * bpc))
    dst = list(range(nb - 1, nb - 1 - chunks * bpc, -1))
    assert not set(src) & set(dst), "num_blocks too small for disjoint source and destination blocks"
    regions = 1 if mla else 2
    moved = chunks * bpc * args.layers * regions * bs * h * d * 2
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    saved = client.save(engine, "writer", 0, src, hashes)
    save_s = time.perf_counter() - t0
    for t in kv.values():  # zero the destination blocks so a skipped copy shows
        for b in dst:
            for r in range(regions):
                block_view(t, layout, r, b).zero_()
    torch.cuda.synchronize()
    hit = None
    deadline = time.monotonic() + 30
    while hit is None:
        hit = client.lookup("reader#1", hashes, [chunk] * chunks, [bytes(result.namespace)])
        if hit is None:
            client.poll(timeout_ms=5)
        if time.monotonic() > deadline:
            raise SystemExit("lookup not answered")
    t0 = time.perf_counter()
    loaded = client.load(engine, "reader", "reader#1", dst, hashes)
    load_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    bad = 0
    for t in kv.values():
        for i in range(len(src)):
            for r in range(regions):
                if not torch.equal(block_view(t, layout, r, src[i]), block_view(t, layout, r, dst[i])):
                    bad += 1
    client.request_finished(engine, "reader", "finished")
    client.unregister(engine)
    d2h, h2d = contiguous_gbps(torch, moved)
    return {
        "layout": layout,
        "deviceUuid": reg.get("deviceUuid"),
        "bytes": moved,
        "saved_chunks": saved.saved,
        "hit_tokens": hit,
        "loaded_tokens": loaded.loaded_tokens,
        "invalid_blocks": len(loaded.invalid_block_ids),
        "mismatched_blocks": bad,
        "save_d2h_GBps": round(moved / save_s / 1e9, 2),
        "load_h2d_GBps": round(moved / load_s / 1e9, 2),
        "contiguous_d2h_GBps": round(d2h, 2),
        "contiguous_h2d_GBps": round(h2d, 2),
        "save_vs_contiguous": round((moved / save_s / 1e9) / d2h, 3),
        "load_vs_contiguous": round((moved / load_s / 1e9) / h2d, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint")
    ap.add_argument("--layout", action="append", choices=["flash_attn", "flashinfer", "mla"])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--num-blocks", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--chunk-size", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=16)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print(json.dumps({"skipped": "torch is not installed"}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return 0
    if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        print("expandable segments cannot be shared; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False", file=sys.stderr)
        return 1
    proc = tmp = None
    endpoint = args.endpoint
    if endpoint is None:
        per_chunk = args.layers * 2 * args.chunk_size * args.heads * args.head_dim * 2
        proc, endpoint, tmp = start_sidecar(max(1 << 30, 4 * args.chunks * per_chunk))
    client = KvtierClient(endpoint, request_timeout_ms=120_000)
    reports = []
    try:
        for layout in args.layout or ["flash_attn", "flashinfer", "mla"]:
            reports.append(run_layout(torch, client, layout, args))
    finally:
        client.close()
        if proc is not None:
            proc.terminate()
            proc.wait(30)
            shutil.rmtree(tmp, ignore_errors=True)
    ok = all(r["mismatched_blocks"] == 0 and r["invalid_blocks"] == 0 for r in reports)
    print(json.dumps({"device": torch.cuda.get_device_name(0), "ok": ok, "layouts": reports}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
