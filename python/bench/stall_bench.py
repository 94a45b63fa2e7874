"""What a misbehaving sidecar costs vLLM's engine step (``npm run bench:stall``).

Runs the workload of python/tests/vllm_real/harness/stall.py (vLLM's own scheduler and
model-runner connector code, tensor parallelism 2, a load, saves, vLLM's preemption of a request
whose saves are in flight, delayed frees, shutdown) once with a healthy sidecar and once per
fault and call site: the sidecar frozen (SIGSTOP), killed (SIGKILL, restarted on the same
endpoint), overloaded (frozen with 5 ms of run time every 50 ms) from each connector call site
on, and its lower tier stalled from the first lookup on; each fault held ``HOLD_S`` seconds.
Prints, per connector call, the worst wait seen under each fault beside the healthy run, against
the 50 ms goal, and writes bench/results/stall.json. Needs the environment with vLLM's own code
(python/tests/vllm_real/env.py); ``KVTIER_BENCH_QUICK=1`` runs one site per fault.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "python"))

from tests.conftest import Sidecar  # noqa: E402
from tests.vllm_real.harness.engine import RealEngine  # noqa: E402
from tests.vllm_real.harness.model import EngineSpec  # noqa: E402
from tests.vllm_real.harness.stall import SITES, stall_run  # noqa: E402
from tests.vllm_real.harness.workers import WorkerPair  # noqa: E402

GOAL_MS = 50.0
HOLD_S = 3.0
QUICK = os.environ.get("KVTIER_BENCH_QUICK") == "1"
FAULTS = ("frozen", "killed", "overloaded")


def _engines(pair: WorkerPair):
    made: list[RealEngine] = []

    def make(sidecar, **kw):
        kw.setdefault("model_id", f"stall-bench-{len(made)}-{time.monotonic_ns()}")
        e = RealEngine(EngineSpec(endpoint=sidecar.endpoint, **kw), pair)
        made.append(e)
        return e

    return make, made


def _run(pair: WorkerPair, site, kind, stall: bool = False) -> dict:
    make, made = _engines(pair)
    tmp = Path(tempfile.mkdtemp(prefix="kvtier-stall-bench-"))
    config = None
    stall_file = None
    if stall:
        stall_file = str(tmp / "stall")
        plugin = ROOT / "python" / "tests" / "vllm_real" / "plugins" / "stalling-store.mjs"
        config = {
            "tiers": [
                {"name": "cpu", "type": "local-cpu", "capacityBytes": 64 * 1024 * 1024},
                {"name": "disk", "type": "module", "module": str(plugin),
                 "options": {"path": str(tmp / "chunks"), "stallFile": stall_file}},
            ]
        }
    sidecar = Sidecar(config=config) if config else Sidecar()
    try:
        return stall_run(make, sidecar, site, kind, HOLD_S, stall_file)
    finally:
        for e in made:
            try:
                e.close(check_leaks=False)
            except Exception:
                pass
        sidecar.close()


def main() -> int:
    t0 = time.monotonic()
    pair = WorkerPair(2)
    runs: list[dict] = []
    try:
        healthy = _run(pair, None, None)
        runs.append({"fault": "healthy", "site": None, **healthy})
        sites = SITES[4:6] if QUICK else SITES
        for kind in FAULTS:
            for site in sites[:1] if QUICK and kind != "frozen" else sites:
                out = _run(pair, site, kind)
                runs.append({"fault": kind, "site": f"{site[0]} {site[1]}", **out})
                print(f"  {kind:<11} at {site[1]:<28} fired {out['fired']}, worst "
                      f"{max(out['calls'].values()) * 1000:7.1f} ms", file=sys.stderr)
        out = _run(pair, ("scheduler", "get_num_new_matched_tokens"), "disk-stalled", stall=True)
        runs.append({"fault": "disk-stalled", "site": "scheduler get_num_new_matched_tokens", **out})
    finally:
        pair.close()
    columns = ["healthy", *FAULTS, "disk-stalled"]
    calls = sorted({c for r in runs for c in r["calls"]})
    worst = {col: {} for col in columns}
    for r in runs:
        for c, s in r["calls"].items():
            worst[r["fault"]][c] = max(worst[r["fault"]].get(c, 0.0), s * 1000)
    width = max(len(c) for c in calls) + 2
    print(f"\nworst wait per connector call, ms (goal <= {GOAL_MS:.0f} ms under every fault; each fault held {HOLD_S:.0f} s)")
    print(f"{'call':<{width}}" + "".join(f"{c:>14}" for c in columns) + "   goal")
    for c in calls:
        cells = [worst[col].get(c) for col in columns]
        faulty = [v for v in cells[1:] if v is not None]
        met = "met" if all(v <= GOAL_MS for v in faulty) else "MISSED"
        print(f"{c:<{width}}" + "".join(f"{'-' if v is None else f'{v:.1f}':>14}" for v in cells) + f"   {met}")
    not_fired = [f"{r['fault']} at {r['site']}" for r in runs if r["fault"] != "healthy" and not r["fired"]]
    if not_fired:
        print(f"faults that never started (their site had no work for the sidecar): {', '.join(not_fired)}")
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "goalMs": GOAL_MS,
        "holdS": HOLD_S,
        "quick": QUICK,
        "worstMs": worst,
        "runs": [{k: v for k, v in r.items() if k != "calls"} | {"callsMs": {c: s * 1000 for c, s in r["calls"].items()}} for r in runs],
        "seconds": round(time.monotonic() - t0, 1),
    }
    out_path = ROOT / "bench" / "results" / "stall.json"
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out_path.relative_to(ROOT)} ({result['seconds']} s)")
    missed = [c for c in calls if any(worst[col].get(c, 0.0) > GOAL_MS for col in columns[1:])]
    if missed:
        print(f"missed the goal: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
