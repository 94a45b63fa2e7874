"""What overlaps compute on one GPU without MPS: a torch-only probe, run on a GPU machine as
`python3 scripts/gpu/overlap-probe.py` (`PHASES=priority` for the stream-priority phases only;
results in $OUT/overlap*.json when OUT is set; bench/results/gpu-h200-overlap-probe.json holds
the H200's). Each load moves 2 GiB from pinned host memory and is timed alone and beside bf16
matmuls sized to take as long:
- `dma`: contiguous copies of 64 MiB (copy engines only);
- `scatter`: the same DMA into a staging buffer, then one kernel scattering 32 KiB blocks;
- `grouped`: the sidecar's shape, 128 groups each of a DMA, a scatter kernel and a wait;
beside compute in another process (both started on one barrier) or on another stream of the
same process (the engine's own context)."""
import json, multiprocessing as mp, os, sys, time
import torch

GIB = 1 << 30
BYTES = 2 * GIB
PIECE = 64 << 20
BLOCK = 32 << 10


def mm_setup():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return a, b


def run_compute(a, b, n, stream=None):
    with torch.cuda.stream(stream) if stream is not None else torch.cuda.stream(torch.cuda.current_stream()):
        for _ in range(n):
            torch.mm(a, b)


def copy_setup():
    host = torch.empty(BYTES, dtype=torch.uint8, pin_memory=True)
    host.random_(0, 255)
    dev = torch.empty(BYTES, dtype=torch.uint8, device="cuda")
    return host, dev


def run_dma(host, dev, stream=None):
    s = stream or torch.cuda.current_stream()
    with torch.cuda.stream(s):
        for o in range(0, BYTES, PIECE):
            dev[o:o + PIECE].copy_(host[o:o + PIECE], non_blocking=True)


def scatter_setup(dev):
    n = BYTES // BLOCK
    perm = torch.randperm(n, device="cuda")
    stage = torch.empty(BYTES, dtype=torch.uint8, device="cuda")
    return perm, stage


def run_scatter(host, dev, perm, stage):
    n = BYTES // BLOCK
    for o in range(0, BYTES, PIECE):
        stage[o:o + PIECE].copy_(host[o:o + PIECE], non_blocking=True)
    dev.view(n, BLOCK).index_copy_(0, perm, stage.view(n, BLOCK))


GROUPS = 128


def run_grouped(host, dev, perm, stage, stream=None):
    """The sidecar's shape: the load in GROUPS groups, each a DMA into the staging buffer and a
    scatter kernel, waited for before the next (one group in flight)."""
    n = BYTES // BLOCK
    per = n // GROUPS
    s = stream or torch.cuda.current_stream()
    with torch.cuda.stream(s):
        for g in range(GROUPS):
            lo, hi = g * per * BLOCK, (g + 1) * per * BLOCK
            stage[lo:hi].copy_(host[lo:hi], non_blocking=True)
            dev.view(n, BLOCK).index_copy_(0, perm[g * per:(g + 1) * per], stage[lo:hi].view(per, BLOCK))
            s.synchronize()


def worker(kind, n_mm, barrier, q):
    torch.cuda.init()
    if kind == "compute":
        a, b = mm_setup()
        run_compute(a, b, 3); torch.cuda.synchronize()
        barrier.wait()
        t0 = time.perf_counter(); run_compute(a, b, n_mm); torch.cuda.synchronize()
    else:
        host, dev = copy_setup()
        if kind == "dma":
            run_dma(host, dev); torch.cuda.synchronize()
            barrier.wait()
            t0 = time.perf_counter(); run_dma(host, dev); torch.cuda.synchronize()
        elif kind == "grouped":
            perm, stage = scatter_setup(dev)
            run_grouped(host, dev, perm, stage); torch.cuda.synchronize()
            barrier.wait()
            t0 = time.perf_counter(); run_grouped(host, dev, perm, stage); torch.cuda.synchronize()
        else:
            perm, stage = scatter_setup(dev)
            run_scatter(host, dev, perm, stage); torch.cuda.synchronize()
            barrier.wait()
            t0 = time.perf_counter(); run_scatter(host, dev, perm, stage); torch.cuda.synchronize()
    q.put((kind, (time.perf_counter() - t0) * 1e3))


def procs(kinds, n_mm):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(kinds)); q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(k, n_mm, barrier, q)) for k in kinds]
    for p in ps: p.start()
    out = dict(q.get(timeout=120) for _ in kinds)
    for p in ps: p.join(30)
    return out


def same_process(n_mm):
    a, b = mm_setup(); host, dev = copy_setup()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    run_compute(a, b, 3, s1); run_dma(host, dev, s2); torch.cuda.synchronize()
    t0 = time.perf_counter(); run_compute(a, b, n_mm, s1); run_dma(host, dev, s2); torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def same_process_grouped(n_mm, priority=0):
    """Compute on one stream while a thread runs the grouped load on another, in one process."""
    import threading
    a, b = mm_setup(); host, dev = copy_setup(); perm, stage = scatter_setup(dev)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream(priority=priority)
    run_compute(a, b, 3, s1); run_grouped(host, dev, perm, stage, s2); torch.cuda.synchronize()
    t0 = time.perf_counter()
    th = threading.Thread(target=run_grouped, args=(host, dev, perm, stage, s2)); th.start()
    run_compute(a, b, n_mm, s1); s1.synchronize(); t_c = time.perf_counter()
    th.join(); torch.cuda.synchronize(); t_l = time.perf_counter()
    return {"compute": (t_c - t0) * 1e3, "grouped": (t_l - t0) * 1e3}


if __name__ == "__main__":
    res = {"device": torch.cuda.get_device_name(0)}
    if os.environ.get("PHASES") == "priority":
        t = procs(["dma"], 1); res["dma_alone_ms"] = t["dma"]
        probe = procs(["compute"], 20); per = probe["compute"] / 20
        n_mm = max(1, round(t["dma"] / per)); res["matmuls"] = n_mm
        res["compute_alone_ms"] = procs(["compute"], n_mm)["compute"]
        res["grouped_alone_ms"] = procs(["grouped"], n_mm)["grouped"]
        res["same_process_compute_with_grouped_ms"] = same_process_grouped(n_mm)
        res["same_process_compute_with_grouped_high_priority_ms"] = same_process_grouped(n_mm, -1)
        print(json.dumps(res, indent=1))
        out = os.environ.get("OUT")
        if out:
            open(os.path.join(out, "overlap-priority.json"), "w").write(json.dumps(res, indent=1))
        sys.exit(0)
    # Size compute to about the DMA's time.
    t = procs(["dma"], 1); res["dma_alone_ms"] = t["dma"]
    probe = procs(["compute"], 20); per = probe["compute"] / 20
    n_mm = max(1, round(t["dma"] / per)); res["matmuls"] = n_mm
    res["compute_alone_ms"] = procs(["compute"], n_mm)["compute"]
    res["scatter_alone_ms"] = procs(["scatter"], n_mm)["scatter"]
    res["compute_with_dma_ms"] = procs(["compute", "dma"], n_mm)
    res["compute_with_scatter_ms"] = procs(["compute", "scatter"], n_mm)
    res["same_process_compute_and_dma_total_ms"] = same_process(n_mm)
    res["grouped_alone_ms"] = procs(["grouped"], n_mm)["grouped"]
    res["compute_with_grouped_ms"] = procs(["compute", "grouped"], n_mm)
    res["same_process_compute_with_grouped_ms"] = same_process_grouped(n_mm)
    print(json.dumps(res, indent=1))
    out = os.environ.get("OUT")
    if out:
        open(os.path.join(out, "overlap.json"), "w").write(json.dumps(res, indent=1))
