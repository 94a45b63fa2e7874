"""The GPU check: vLLM-shaped KV caches on a GPU saved through a kvtier sidecar and loaded back
into other blocks byte-exact, with the copies timed against torch's contiguous copy of the same
bytes. Run by ``scripts/gpu-check.sh`` (which unpacks the bundle of ``scripts/gpu-bundle.sh``);
docs/gpu-check.md says how to read the report.

    python3 python/gpu/gpu_check.py --node NODE --kvtier DIR --out DIR [--cpu]

Everything the engine side does goes through kvtier_vllm's own code (hashing, the registration
of ``kvtier_vllm.kv_caches``); every request to the sidecar goes through the TypeScript clients
in a Node process (the driver), so the machine needs no pyzmq. ``--cpu`` runs the same steps on
the host device (numpy arrays in a shared-memory file), skipping only the CUDA-only checks.

Checks: the sidecar's PONG reports CUDA; FlashAttention (NHD and HND), FlashInfer and MLA
caches saved, looked up and loaded byte-exact into other blocks; save (device to host) and load
(host to device) against ``torch`` copies of the same bytes between one contiguous GPU tensor
and pinned host memory (target 0.9); lookup p99 while a 4 GiB load runs (target < 5 ms); the
GPU named by UUID under a reordered ``CUDA_VISIBLE_DEVICES``; expandable segments refused with
their message; a device-to-host copy ordered after an interprocess CUDA event. Writes
``gpu-report.json`` to ``--out``; exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(HERE))

from check_support import (  # noqa: E402
    CheckError,
    Driver,
    DriverError,
    Geometry,
    KvCache,
    Sidecar,
    StateFile,
    mismatched_blocks,
    numpy_kv_cache,
    poison_blocks,
    torch_kv_cache,
    wait_ready,
)
from kvtier_vllm.hashing import hash_chunks  # noqa: E402
from kvtier_vllm.kv_caches import build_registration  # noqa: E402

CHUNK = 256
RATIO_TARGET = 0.9
P99_TARGET_MS = 5.0


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cuda = not args.cpu
        self.out = Path(args.out)
        self.kvtier = Path(args.kvtier)
        self.rng = random.Random(args.seed)
        self.failures: list[str] = []
        self.report: dict = {"mode": "cuda" if self.cuda else "cpu", "targets": {"ratio": RATIO_TARGET, "lookupP99Ms": P99_TARGET_MS}}
        if self.cuda:
            import torch

            self.lib = torch
        else:
            import numpy

            self.lib = numpy
        self._seq = 0

    # ------------------------------------------------------------------ helpers

    def expect(self, ok: bool, what: str) -> bool:
        if not ok:
            self.failures.append(what)
        return ok

    def fresh(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}-{self._seq}"

    def prompt_hashes(self, chunks: int) -> str:
        tokens = [self.rng.randrange(0, 128_000) for _ in range(chunks * CHUNK)]
        return b"".join(c.hash for c in hash_chunks(tokens, chunk_size=CHUNK)).hex()

    def new_cache(self, geo: Geometry) -> KvCache:
        if self.cuda:
            return torch_kv_cache(self.lib, geo)
        return numpy_kv_cache(self.lib, geo, self.rng.randrange(1 << 30))

    def register(self, drv: Driver, cache: KvCache, engine: str, mutate=None) -> dict:
        geo = cache.geo
        reg = build_registration(
            cache.tensors,
            engine_id=engine,
            model_id=f"kvtier-gpu-check/{geo.layout}",
            dtype="bfloat16" if self.cuda else "float16",
            num_kv_heads=1 if geo.mla else geo.heads,
            head_dim=geo.head_dim,
            block_size=geo.block_size,
            mla=geo.mla,
            chunk_size=CHUNK,
        )
        if mutate is not None:
            mutate(reg)
        return drv.call("register", registration=reg)

    def disjoint_blocks(self, geo: Geometry, blocks: int) -> tuple[list, list]:
        ids = self.rng.sample(range(geo.num_blocks), 2 * blocks)
        return ids[:blocks], ids[blocks:]

    def sync(self) -> None:
        if self.cuda:
            self.lib.cuda.synchronize()

    def round_trip(self, drv: Driver, cache: KvCache, engine: str, ns: str, chunks: int, probe: bool = False) -> dict:
        """SAVE blocks of one prompt, poison other blocks, LOOKUP, LOAD into them, compare."""
        geo = cache.geo
        bpc = CHUNK // geo.block_size
        src, dst = self.disjoint_blocks(geo, chunks * bpc)
        hashes = self.prompt_hashes(chunks)
        self.sync()
        saved = drv.call("save", engineId=engine, requestId=self.fresh("w"), blockIds=src, hashes=hashes)
        dst_ids = self.lib.tensor(dst, device="cuda") if self.cuda else dst
        for t in cache.tensors.values():
            poison_blocks(self.lib, t, geo.layout, dst_ids)
        self.sync()
        lookup_id = self.fresh("r")
        hit = drv.call("lookup", lookupId=lookup_id, hashes=hashes, tokens=[CHUNK] * chunks, namespace=ns)
        kw = {"probe": {"hashes": hashes[: 64 * 4], "namespace": ns}} if probe else {}
        loaded = drv.call("load", engineId=engine, requestId=lookup_id, lookupId=lookup_id, blockIds=dst, hashes=hashes, **kw)
        self.sync()
        bad = mismatched_blocks(self.lib, cache, src, dst)
        drv.call("finish", engineId=engine, requestId=lookup_id)
        return {
            "chunks": chunks,
            "bytes": geo.bytes_for(chunks * bpc),
            "savedChunks": saved["saved"],
            "droppedChunks": saved["dropped"],
            "hitTokens": hit["hitTokens"],
            "loadedTokens": loaded["loadedTokens"],
            "invalidBlocks": len(loaded["invalidBlockIds"]),
            "blocksCompared": len(dst) * geo.layers,
            "mismatchedBlocks": bad,
            "saveMs": saved["ms"],
            "loadMs": loaded["ms"],
            **({"probe": loaded["probe"]} if probe else {}),
        }

    def exact(self, r: dict, what: str) -> bool:
        chunks = r["chunks"]
        return self.expect(
            r["savedChunks"] == chunks
            and r["hitTokens"] == chunks * CHUNK
            and r["loadedTokens"] == chunks * CHUNK
            and r["invalidBlocks"] == 0
            and r["mismatchedBlocks"] == 0,
            f"{what}: saved {r['savedChunks']}/{chunks}, hit {r['hitTokens']}, loaded {r['loadedTokens']}, "
            f"{r['invalidBlocks']} invalid, {r['mismatchedBlocks']} mismatched blocks",
        )

    # ------------------------------------------------------------------ checks

    def torch_contiguous(self, nbytes: int, reps: int = 5) -> tuple[float, float]:
        """Median GB/s of one contiguous copy GPU -> pinned host and back (the raw limit)."""
        torch = self.lib
        dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        d2h, h2d = [], []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            host.copy_(dev, non_blocking=True)
            torch.cuda.synchronize()
            d2h.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            h2d.append(time.perf_counter() - t0)
        del dev, host
        return nbytes / statistics.median(d2h) / 1e9, nbytes / statistics.median(h2d) / 1e9

    def layouts(self, drv: Driver) -> None:
        a = self.args
        rows = []
        for layout in ("flash_attn", "flash_attn_hnd", "flashinfer", "mla"):
            mla = layout == "mla"
            geo = Geometry(layout, a.layers, a.layout_blocks, a.block_size, 1 if mla else a.heads, 576 if mla and self.cuda else (64 if mla else a.head_dim))
            cache = self.new_cache(geo)
            engine = f"check-{layout}"
            try:
                reg = self.register(drv, cache, engine)
                r = self.round_trip(drv, cache, engine, reg["namespace"], a.layout_chunks)
                r["layout"] = layout
                self.exact(r, f"layout {layout}")
                rows.append(r)
                drv.call("unregister", engineId=engine)
            finally:
                cache.close()
            drv.call("clear")
        self.report["layouts"] = rows

    def bandwidth(self, drv: Driver, key: str = "bandwidth") -> None:
        """The big FlashAttention cache: timed SAVE/LOAD of `big_chunks`, then one more load with
        lookups running beside it."""
        a = self.args
        bpc = CHUNK // a.block_size
        geo = Geometry("flash_attn", a.layers, 2 * a.big_chunks * bpc + 64, a.block_size, a.heads, a.head_dim)
        cache = self.new_cache(geo)
        engine = "check-bandwidth"
        try:
            ns = self.register(drv, cache, engine)["namespace"]
            runs = []
            for i in range(a.reps + 1):  # the first run warms up and is not timed
                r = self.round_trip(drv, cache, engine, ns, a.big_chunks)
                self.exact(r, f"bandwidth run {i}")
                if i > 0:
                    runs.append(r)
                drv.call("clear")
            probed = self.round_trip(drv, cache, engine, ns, a.big_chunks, probe=True)
            self.exact(probed, "load with lookups beside it")
            drv.call("clear")
            drv.call("unregister", engineId=engine)
        finally:
            cache.close()
        nbytes = runs[0]["bytes"]
        save_ms = statistics.median(r["saveMs"] for r in runs)
        load_ms = statistics.median(r["loadMs"] for r in runs)
        out = {
            "bytes": nbytes,
            "runs": len(runs),
            "saveMs": [round(r["saveMs"], 2) for r in runs],
            "loadMs": [round(r["loadMs"], 2) for r in runs],
            "saveGBps": nbytes / save_ms / 1e6,
            "loadGBps": nbytes / load_ms / 1e6,
            "lookupDuringLoad": probed["probe"],
        }
        out["lookupDuringLoad"]["bytes"] = probed["bytes"]
        if self.cuda:
            d2h, h2d = self.torch_contiguous(nbytes)
            out.update(torchD2hGBps=d2h, torchH2dGBps=h2d, saveRatio=out["saveGBps"] / d2h, loadRatio=out["loadGBps"] / h2d)
            self.expect(out["saveRatio"] >= RATIO_TARGET, f"save {out['saveGBps']:.1f} GB/s is {out['saveRatio']:.2f}x torch D2H ({d2h:.1f} GB/s), target {RATIO_TARGET}")
            self.expect(out["loadRatio"] >= RATIO_TARGET, f"load {out['loadGBps']:.1f} GB/s is {out['loadRatio']:.2f}x torch H2D ({h2d:.1f} GB/s), target {RATIO_TARGET}")
            self.expect(probed["probe"]["p99Ms"] < P99_TARGET_MS, f"lookup p99 {probed['probe']['p99Ms']:.2f} ms during the load, target < {P99_TARGET_MS} ms")
        self.report[key] = out

    def layer_compute(self, geo: Geometry) -> tuple:
        """A stand-in for one layer's forward: a square matmul repeated, sized so that the
        model's layers take about as long as loading their KV at the link's rate (the case
        where overlap matters most). Returns (run(layer), ms for all layers alone)."""
        lib = self.lib
        blocks = self.args.big_chunks * CHUNK // geo.block_size
        per_layer_s = geo.bytes_for(blocks) / geo.layers / 50e9 if self.cuda else 0.002
        if self.cuda:
            n = 4096
            a = lib.randn(n, n, device="cuda", dtype=lib.bfloat16)
            b = lib.randn(n, n, device="cuda", dtype=lib.bfloat16)
            out = lib.empty(n, n, device="cuda", dtype=lib.bfloat16)
            lib.matmul(a, b, out=out)
            lib.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                lib.matmul(a, b, out=out)
            lib.cuda.synchronize()
            one = (time.perf_counter() - t0) / 20
        else:
            n = 128
            a = lib.ones((n, n), dtype=lib.float32)
            b, out = a.copy(), a.copy()
            t0 = time.perf_counter()
            for _ in range(20):
                lib.matmul(a, b, out=out)
            one = (time.perf_counter() - t0) / 20
        reps = max(1, round(per_layer_s / max(one, 1e-9)))

        def run(_layer: int) -> None:
            for _ in range(reps):
                lib.matmul(a, b, out=out)

        t0 = time.perf_counter()
        for layer in range(geo.layers):
            run(layer)
        self.sync()
        return run, (time.perf_counter() - t0) * 1000, reps

    def layerwise(self, drv: Driver, key: str = "layerwise") -> None:
        """A layer-wise LOAD (progressSlot) of the big cache while a stand-in forward computes
        each layer as soon as the state file says it is in: time to the first and the last
        layer, byte-exactness, and the time saved against loading everything first."""
        a = self.args
        bpc = CHUNK // a.block_size
        geo = Geometry("flash_attn", a.layers, 2 * a.big_chunks * bpc + 64, a.block_size, a.heads, a.head_dim)
        cache = self.new_cache(geo)
        state = StateFile(16)
        engine = "check-layerwise"
        try:
            ns = self.register(drv, cache, engine, mutate=lambda reg: reg.update(stateFile={"path": state.path, "slots": state.slots}))["namespace"]
            compute, compute_ms, reps = self.layer_compute(geo)
            runs = []
            for i in range(a.reps + 1):
                row: dict = {}
                for mode in ("serial", "layerwise"):
                    src, dst = self.disjoint_blocks(geo, a.big_chunks * bpc)
                    hashes = self.prompt_hashes(a.big_chunks)
                    self.sync()
                    drv.call("save", engineId=engine, requestId=self.fresh("w"), blockIds=src, hashes=hashes)
                    dst_ids = self.lib.tensor(dst, device="cuda") if self.cuda else dst
                    for t in cache.tensors.values():
                        poison_blocks(self.lib, t, geo.layout, dst_ids)
                    self.sync()
                    rid = self.fresh("r")
                    drv.call("lookup", lookupId=rid, hashes=hashes, tokens=[CHUNK] * a.big_chunks, namespace=ns)
                    state.zero(0, 1)
                    kw = {"stateSlot": 0, **({"progressSlot": 1} if mode == "layerwise" else {})}
                    t0 = time.perf_counter()
                    drv.send("load", engineId=engine, requestId=rid, lookupId=rid, blockIds=dst, hashes=hashes, **kw)
                    layer_at = []
                    if mode == "layerwise":
                        for layer in range(geo.layers):
                            while state.word(1) <= layer and state.word(0) == 0:
                                pass
                            if state.word(1) <= layer:
                                break  # the load failed: the completion word says so
                            layer_at.append((time.perf_counter() - t0) * 1000)
                            compute(layer)
                    else:
                        while state.word(0) == 0:
                            pass
                        layer_at.append((time.perf_counter() - t0) * 1000)
                        for layer in range(geo.layers):
                            compute(layer)
                    self.sync()
                    total = (time.perf_counter() - t0) * 1000
                    loaded = drv.receive("load")
                    bad = mismatched_blocks(self.lib, cache, src, dst)
                    drv.call("finish", engineId=engine, requestId=rid)
                    drv.call("clear")
                    self.expect(
                        loaded["loadedTokens"] == a.big_chunks * CHUNK and bad == 0 and state.word(0) == 1,
                        f"{mode} load: {loaded['loadedTokens']} tokens, {bad} mismatched blocks, state {state.word(0)}",
                    )
                    row[mode] = {
                        "firstLayerMs": layer_at[0] if layer_at else None,
                        "lastLayerMs": layer_at[-1] if layer_at else None,
                        "loadMs": loaded["ms"],
                        "totalMs": total,
                        "mismatchedBlocks": bad,
                        "layersSeen": len(layer_at) if mode == "layerwise" else geo.layers,
                    }
                if i > 0:
                    runs.append(row)
            drv.call("unregister", engineId=engine)
        finally:
            state.close()
            cache.close()
        med = lambda mode, k: statistics.median(r[mode][k] for r in runs)  # noqa: E731
        out = {
            "bytes": geo.bytes_for(a.big_chunks * bpc),
            "layers": geo.layers,
            "computeMsAlone": round(compute_ms, 2),
            "matmulsPerLayer": reps,
            "serial": {k: round(med("serial", k), 2) for k in ("lastLayerMs", "totalMs")},
            "layerwise": {k: round(med("layerwise", k), 2) for k in ("firstLayerMs", "lastLayerMs", "totalMs")},
            "runs": runs,
        }
        serial, lw = out["serial"]["totalMs"], out["layerwise"]["totalMs"]
        load_ms = out["serial"]["lastLayerMs"]
        out["savedMs"] = round(serial - lw, 2)
        # The share of the shorter of load and compute hidden behind the other (1 = perfect overlap).
        out["overlap"] = round((serial - lw) / max(1e-9, min(load_ms, compute_ms)), 3)
        out["layerwiseLoadGBps"] = round(out["bytes"] / out["layerwise"]["lastLayerMs"] / 1e6, 2)
        self.report[key] = out

    def other_methods(self, node: str) -> None:
        """The bandwidth step again on a fresh sidecar per copy method (KVTIER_CUDA_COPY)."""
        for method in [m for m in self.args.methods.split(",") if m and m != "auto"]:
            side = Sidecar(node, self.kvtier, self.cpu_bytes, self.out / "sidecar.log", prefault=True, env={"KVTIER_CUDA_COPY": method})
            drv = Driver(node, self.kvtier, side, self.out / "driver.log")
            try:
                wait_ready(drv)
                self.bandwidth(drv, key=f"bandwidth-{method}")
                self.layerwise(drv, key=f"layerwise-{method}")
                copies = ((drv.call("ping")["info"].get("copyEngine") or {}).get("cuda") or {}).get("copies")
                self.report[f"bandwidth-{method}"]["copyCounts"] = copies
            finally:
                drv.close()
                side.stop()

    def groupings(self, node: str) -> None:
        """The bandwidth step again on a fresh sidecar per copy grouping ``MiBxInFlight``
        (``KVTIER_COPY_GROUP_BYTES``, ``KVTIER_COPY_GROUPS_IN_FLIGHT``), optionally ``tThreads``
        (``UV_THREADPOOL_SIZE``: each batch in flight holds a libuv pool thread while it waits)."""
        for g in [g for g in self.args.groupings.split(",") if g]:
            spec, _, threads = g.partition("t")
            mib, _, inflight = spec.partition("x")
            env = {"KVTIER_COPY_GROUP_BYTES": str(int(mib) << 20), "KVTIER_COPY_GROUPS_IN_FLIGHT": inflight or "1"}
            if threads:
                env["UV_THREADPOOL_SIZE"] = threads
            side = Sidecar(node, self.kvtier, self.cpu_bytes, self.out / "sidecar.log", prefault=True, env=env, log_level=self.args.sidecar_log_level)
            drv = Driver(node, self.kvtier, side, self.out / "driver.log")
            try:
                wait_ready(drv)
                self.bandwidth(drv, key=f"bandwidth-group-{g}")
                self.layerwise(drv, key=f"layerwise-group-{g}")
            finally:
                drv.close()
                side.stop()

    def device_uuid(self, node: str) -> None:
        """A second sidecar that sees the GPUs in another order (or by UUID alone) still finds the
        registration's GPU; a UUID it does not see is refused with a message naming it."""
        torch = self.lib
        n = torch.cuda.device_count()
        uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(n)]
        uuids = [u if u.upper().startswith("GPU-") else f"GPU-{u}" for u in uuids]
        visible = ",".join(str(i) for i in reversed(range(n))) if n > 1 else uuids[0]
        side = Sidecar(node, self.kvtier, 256 << 20, self.out / "sidecar-uuid.log", prefault=False, env={"CUDA_VISIBLE_DEVICES": visible})
        drv = Driver(node, self.kvtier, side, self.out / "driver.log")
        out: dict = {"torchUuids": uuids, "sidecarCudaVisibleDevices": visible}
        try:
            pong = wait_ready(drv)
            out["sidecarUuids"] = ((pong.get("copyEngine") or {}).get("cuda") or {}).get("deviceUuids")
            geo = Geometry("flash_attn", 2, 64, self.args.block_size, self.args.heads, self.args.head_dim)
            cache = self.new_cache(geo)
            try:
                ns = self.register(drv, cache, "check-uuid")["namespace"]
                r = self.round_trip(drv, cache, "check-uuid", ns, 2)
                out["roundTrip"] = {k: r[k] for k in ("hitTokens", "loadedTokens", "mismatchedBlocks", "invalidBlocks")}
                self.exact(r, "registration by device UUID")
                bogus = "GPU-00000000-0000-0000-0000-000000000000"
                try:
                    self.register(drv, cache, "check-uuid-bogus", mutate=lambda reg: reg.update(deviceUuid=bogus))
                    out["unknownUuid"] = "accepted"
                    self.expect(False, "a registration naming an unknown GPU UUID was accepted")
                except DriverError as err:
                    out["unknownUuid"] = f"{err.code}: {err.message}"
                    self.expect(bogus.lower() in err.message.lower(), f"unknown UUID refused without naming it: {err.message}")
            finally:
                cache.close()
        finally:
            drv.close()
            side.stop()
        self.report["deviceUuid"] = out

    def expandable_segments(self) -> None:
        code = (
            "import json, sys, torch\n"
            f"sys.path.insert(0, {str(REPO / 'python')!r})\n"
            "from kvtier_vllm.kv_caches import ExpandableSegmentsError, build_registration\n"
            "t = torch.zeros((2, 16, 16, 8, 128), dtype=torch.bfloat16, device='cuda')\n"
            "try:\n"
            "    build_registration({'model.layers.0.attn': t}, engine_id='e', model_id='m', dtype='bfloat16',"
            " num_kv_heads=8, head_dim=128, block_size=16)\n"
            "    print(json.dumps({'refused': False}))\n"
            "except ExpandableSegmentsError as err:\n"
            "    print(json.dumps({'refused': True, 'message': str(err)}))\n"
        )
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        try:
            out = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            out = {"refused": False, "stdout": p.stdout[-2000:], "stderr": p.stderr[-2000:]}
        self.expect(out.get("refused") is True and "expandable_segments:False" in out.get("message", ""), f"expandable segments not refused with the hint: {out}")
        self.report["expandableSegments"] = out

    def event_ordering(self, drv: Driver) -> None:
        """A device-to-host copy through the addon that waits for an interprocess event recorded
        after a slow kernel and a fill sees the filled bytes; without the wait (the control) it
        may see the old ones."""
        torch = self.lib
        from kvtier_vllm.kv_caches import describe_cuda_tensor

        nbytes = 64 << 20
        t = torch.full((nbytes,), 1, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        src = describe_cuda_tensor(t)
        out: dict = {"bytes": nbytes}
        stream = torch.cuda.Stream()
        for waited, value in ((True, 2), (False, 3)):
            ev = torch.cuda.Event(interprocess=True)
            with torch.cuda.stream(stream):
                torch.cuda._sleep(1_000_000_000)  # about half a second of GPU time
                t.fill_(value)
                ev.record(stream)
            handle = bytes(ev.ipc_handle())
            r = drv.call(
                "eventCopy",
                ipcHandle=src.ipc_handle,
                allocationBytes=src.allocation_bytes,
                offsetBytes=src.offset_bytes,
                bytes=nbytes,
                deviceUuid=src.device_uuid,
                waitEvent=handle.hex() if waited else None,
            )
            stream.synchronize()
            new = hashlib.sha256(bytes([value]) * nbytes).hexdigest()
            key = "withEvent" if waited else "withoutEventControl"
            out[key] = {"sawNewBytes": r["sha256"] == new, "ms": r["ms"]}
        self.expect(out["withEvent"]["sawNewBytes"], "a copy waiting on the interprocess event did not see the bytes written before it")
        self.report["eventOrdering"] = out

    def save_event(self, drv: Driver) -> None:
        """A SAVE that carries the interprocess event the engine recorded after writing the blocks
        (a half-second kernel, then the writes, on a side stream) stores the written bytes: the
        sidecar's copies wait on the GPU. The control SAVE without the event may store the old
        ones. Each is loaded back into poisoned blocks and compared."""
        torch = self.lib
        a = self.args
        geo = Geometry("flash_attn", 4, 128, a.block_size, a.heads, a.head_dim)
        cache = self.new_cache(geo)
        out: dict = {}
        try:
            ns = self.register(drv, cache, "check-save-event")["namespace"]
            bpc = CHUNK // geo.block_size
            stream = torch.cuda.Stream()
            for waited in (True, False):
                src, dst = self.disjoint_blocks(geo, 2 * bpc)
                value = self.rng.randrange(1, 30000)
                ev = torch.cuda.Event(interprocess=True)
                with torch.cuda.stream(stream):
                    # Everything that moves host bytes (the index, pageable: it would wait for the
                    # stream) before the slow kernel; after it only device work, so the writes
                    # really land half a second after the SAVE is sent.
                    si = torch.tensor(src, device="cuda")
                    shape = (2, len(src), geo.block_size, geo.heads, geo.head_dim)
                    fill = torch.full(shape, value, dtype=torch.int16, device="cuda")
                    torch.cuda._sleep(1_000_000_000)  # about half a second of GPU time
                    for t in cache.tensors.values():
                        t.view(torch.int16).index_copy_(1, si, fill)
                    ev.record(stream)
                hashes = self.prompt_hashes(2)
                kw = {"cudaEvent": bytes(ev.ipc_handle()).hex()} if waited else {}
                saved = drv.call("save", engineId="check-save-event", requestId=self.fresh("w"), blockIds=src, hashes=hashes, **kw)
                stream.synchronize()
                di = torch.tensor(dst, device="cuda")
                for t in cache.tensors.values():
                    t.view(torch.int16)[:, di] = 0x5A5A
                torch.cuda.synchronize()
                lookup_id = self.fresh("r")
                hit = drv.call("lookup", lookupId=lookup_id, hashes=hashes, tokens=[CHUNK] * 2, namespace=ns)
                loaded = drv.call("load", engineId="check-save-event", requestId=lookup_id, lookupId=lookup_id, blockIds=dst, hashes=hashes)
                torch.cuda.synchronize()
                new = all(bool((t.view(torch.int16)[:, di] == value).all()) for t in cache.tensors.values())
                drv.call("finish", engineId="check-save-event", requestId=lookup_id)
                out["withEvent" if waited else "withoutEventControl"] = {
                    "saveMs": saved["ms"],
                    "savedChunks": saved["saved"],
                    "hitTokens": hit["hitTokens"],
                    "loadedTokens": loaded["loadedTokens"],
                    "loadedTheNewBytes": new,
                }
            drv.call("unregister", engineId="check-save-event")
            drv.call("clear")
        finally:
            cache.close()
        w = out["withEvent"]
        self.expect(
            w["savedChunks"] == 2 and w["loadedTokens"] == 2 * CHUNK and w["loadedTheNewBytes"],
            f"a SAVE with the engine's CUDA event did not store the bytes written before the event: {w}",
        )
        self.report["saveEvent"] = out

    # ------------------------------------------------------------------ main

    def run(self, node: str) -> int:
        a = self.args
        self.out.mkdir(parents=True, exist_ok=True)
        self.report.update(python=platform.python_version(), machine=platform.node())
        if a.manifest:
            with open(a.manifest) as f:
                self.report["bundle"] = json.load(f)
        if self.cuda:
            torch = self.lib
            if not torch.cuda.is_available():
                self.report["skipped"] = "torch sees no CUDA device"
                return self.finish(2)
            self.report.update(torch=torch.__version__, device=torch.cuda.get_device_name(0), cudaVisibleDevices=os.environ.get("CUDA_VISIBLE_DEVICES"))
        else:
            self.report.update(numpy=self.lib.__version__)
        big = Geometry("flash_attn", a.layers, 1, a.block_size, a.heads, a.head_dim).bytes_for(a.big_chunks * CHUNK // a.block_size)
        self.cpu_bytes = cpu_bytes = max((1 << 30) if self.cuda else (256 << 20), int(2.5 * big))
        side = Sidecar(node, self.kvtier, cpu_bytes, self.out / "sidecar.log", prefault=True, log_level=a.sidecar_log_level)
        drv = Driver(node, self.kvtier, side, self.out / "driver.log")
        try:
            t0 = time.monotonic()
            pong = wait_ready(drv)
            self.report["sidecarReadyS"] = round(time.monotonic() - t0, 2)
            self.report["copyEngine"] = pong.get("copyEngine")
            cuda = (pong.get("copyEngine") or {}).get("cuda") or {}
            if self.cuda:
                self.expect(cuda.get("available") is True, f"PONG does not report CUDA: {cuda}")
            steps = [
                ("layouts", lambda: self.layouts(drv)),
                ("bandwidth", lambda: self.bandwidth(drv)),
                ("layerwise", lambda: self.layerwise(drv)),
            ]
            if self.cuda:
                steps += [
                    ("eventOrdering", lambda: self.event_ordering(drv)),
                    ("saveEvent", lambda: self.save_event(drv)),
                    ("deviceUuid", lambda: self.device_uuid(node)),
                    ("expandableSegments", self.expandable_segments),
                ]
            for name, step in steps:
                print(f"gpu-check: {name} ...", flush=True)
                t1 = time.monotonic()
                try:
                    step()
                except (CheckError, Exception) as err:  # one failed step still lets the others run
                    self.failures.append(f"{name}: {err}")
                    self.report.setdefault("errors", {})[name] = traceback.format_exc()[-3000:]
                self.report.setdefault("stepSeconds", {})[name] = round(time.monotonic() - t1, 2)
            final = drv.call("ping")["info"]
            self.report["copyCounts"] = ((final.get("copyEngine") or {}).get("cuda") or {}).get("copies")
            stats = drv.call("stats")["stats"]
            self.report["pinnedAtEnd"] = (stats.get("tiers") or [{}])[0].get("pinnedChunks")
            self.expect(self.report["pinnedAtEnd"] == 0, f"{self.report['pinnedAtEnd']} chunks still pinned at the end")
        finally:
            drv.close()
            self.report["sidecarExit"] = side.stop()
        self.expect(self.report["sidecarExit"] == 0, f"the sidecar exited with {self.report['sidecarExit']}")
        extra = [("methods", self.args.methods != "auto", self.other_methods), ("groupings", bool(self.args.groupings), self.groupings)]
        for name, wanted, step in extra:
            if not (self.cuda and wanted):
                continue
            t1 = time.monotonic()
            try:
                step(node)
            except Exception as err:
                self.failures.append(f"{name}: {err}")
                self.report.setdefault("errors", {})[name] = traceback.format_exc()[-3000:]
            self.report.setdefault("stepSeconds", {})[name] = round(time.monotonic() - t1, 2)
        return self.finish(0)

    def finish(self, rc: int) -> int:
        self.report["failures"] = self.failures
        self.report["ok"] = rc == 0 and not self.failures
        with open(self.out / "gpu-report.json", "w") as f:
            json.dump(self.report, f, indent=2)
        summarize(self.report)
        return rc if rc else (0 if self.report["ok"] else 1)


def summarize(r: dict) -> None:
    print(f"gpu-check ({r['mode']}) on {r.get('device', r.get('machine'))}")
    for row in r.get("layouts", []):
        print(f"  {row['layout']:<15} {row['chunks']} chunks, {row['blocksCompared']} blocks compared, {row['mismatchedBlocks']} mismatched, {row['invalidBlocks']} invalid")
    b = r.get("bandwidth")
    if b:
        line = f"  save {b['saveGBps']:.2f} GB/s, load {b['loadGBps']:.2f} GB/s over {b['bytes'] / 2**30:.2f} GiB"
        if "torchD2hGBps" in b:
            line += f" | torch D2H {b['torchD2hGBps']:.2f}, H2D {b['torchH2dGBps']:.2f} GB/s | ratios {b['saveRatio']:.2f} / {b['loadRatio']:.2f}"
        print(line)
        p = b["lookupDuringLoad"]
        print(f"  lookups during the load: {p['samples']} samples, p50 {p['p50Ms']:.3f} ms, p99 {p['p99Ms']:.3f} ms")
    for key, b in sorted(r.items()):
        if key.startswith("bandwidth-") and isinstance(b, dict) and "saveGBps" in b:
            line = f"  {key}: save {b['saveGBps']:.2f} GB/s, load {b['loadGBps']:.2f} GB/s"
            if "saveRatio" in b:
                line += f", ratios {b['saveRatio']:.2f} / {b['loadRatio']:.2f}"
            print(line)
    for key, lw in sorted(r.items()):
        if not key.startswith("layerwise") or not isinstance(lw, dict) or "serial" not in lw:
            continue
        print(
            f"  {key}: {lw['layers']} layers: first layer in {lw['layerwise']['firstLayerMs']:.2f} ms, "
            f"last in {lw['layerwise']['lastLayerMs']:.2f} ms ({lw['layerwiseLoadGBps']:.2f} GB/s; whole load first: "
            f"{lw['serial']['lastLayerMs']:.2f} ms) | with {lw['computeMsAlone']:.1f} ms of compute: "
            f"{lw['layerwise']['totalMs']:.2f} ms against {lw['serial']['totalMs']:.2f} ms, overlap {lw['overlap']:.2f}"
        )
    for key in ("eventOrdering", "saveEvent", "deviceUuid", "expandableSegments", "copyCounts"):
        if key in r:
            print(f"  {key}: {json.dumps(r[key])[:400]}")
    for f in r.get("failures", []):
        print(f"  FAILED: {f}")
    print(f"gpu-check: {'ok' if r.get('ok') else 'FAILED'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--node", required=True, help="the Node.js binary")
    ap.add_argument("--kvtier", required=True, help="the unpacked bundle's kvtier folder")
    ap.add_argument("--out", required=True, help="where gpu-report.json and the logs go")
    ap.add_argument("--cpu", action="store_true", help="the host device instead of CUDA (dry run)")
    ap.add_argument("--manifest", help="the bundle's manifest.json, copied into the report")
    ap.add_argument("--sidecar-log-level", default="warn", help="the main sidecar's logLevel (debug: per SAVE and LOAD timings)")
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--big-chunks", type=int, help="chunks of the timed load (default: 4 GiB on CUDA)")
    ap.add_argument("--layout-chunks", type=int)
    ap.add_argument("--layout-blocks", type=int)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", default="auto", help="copy methods to time, comma-separated (auto,memcpy,batch,kernel,staged): each but auto on a fresh sidecar")
    ap.add_argument("--groupings", default="", help="copy groupings to time, comma-separated MiBxInFlight[tThreads] (e.g. 128x1,512x1,128x4t16: UV_THREADPOOL_SIZE 16): each on a fresh sidecar")
    a = ap.parse_args()
    # CUDA: Llama-3-8B's KV (32 layers, 8 KV heads of 128: 32 MiB a chunk), 128 chunks = 4 GiB.
    # Host dry run: a small model, 64 MiB.
    defaults = dict(layers=32, heads=8, head_dim=128, big_chunks=128, layout_chunks=16, layout_blocks=1024) if not a.cpu else dict(
        layers=4, heads=2, head_dim=64, big_chunks=128, layout_chunks=8, layout_blocks=512
    )
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return Check(a).run(a.node)


if __name__ == "__main__":
    sys.exit(main())
