"""A seeded random run: three engines on one sidecar serve requests with shared prefixes (cut at
any length, so chunks are partial and local prefix hits end inside chunks), abort some at random
(loading ones included), preempt some, lose the sidecar to SIGKILL and a restart midway; one
engine has a rank whose REGISTER fails. Every step checks the twin's invariants (vLLM's
assertions, every computed token's KV bit for bit); at the end every request has finished
within the step bound, nothing is held and the sidecar holds no pins."""

from __future__ import annotations

import random
import sys

import pytest
from vllm import _twin

from tests.vllm_twin.twin.checks import check
from vllm.v1.request import RequestStatus

SEEDS = [(1, _twin.FIXTURE), (2, _twin.CURRENT), (3, _twin.CURRENT)]
FAST = {"request_timeout_ms": 1500, "load_timeout_ms": 1000, "lookup_timeout_ms": 1500}


@pytest.mark.parametrize("seed,version", SEEDS, ids=[f"seed{s}" for s, _ in SEEDS])
def test_random_run(twin, sidecar, capsys, seed, version):
    rnd = random.Random(seed)
    common = dict(sidecar=sidecar, version=version, extra=dict(FAST), max_num_batched_tokens=64, max_num_seqs=6)
    e1 = twin(num_blocks=48, **common)
    e2 = twin(model=e1.spec.model, reverse_blocks=True, num_blocks=64, **common)
    e3 = twin(model=e1.spec.model, unopenable_ranks=(1,), num_blocks=96, **common)
    engines = [e1, e2, e3]
    prefixes = [[rnd.randrange(32000) for _ in range(rnd.randrange(40, 110))] for _ in range(3)]
    total, steps, restarts = 30, 0, 0
    added = 0
    restart_after = rnd.randrange(8, 20)  # requests added before the sidecar is killed
    step_bound = 1500
    while added < total or any(e.busy() for e in engines):
        steps += 1
        check(steps <= step_bound, f"seed {seed}: requests not finished within {step_bound} steps")
        if added < total and rnd.random() < 0.35:
            e = rnd.choices(engines, weights=(5, 3, 2))[0]
            base = rnd.choice(prefixes)
            cut = rnd.randrange(1, len(base) + 1)
            if rnd.random() < 0.3:
                cut -= cut % 4  # a block boundary inside a chunk: vLLM's own prefix cache ends there
            tokens = base[: max(cut, 1)] + [rnd.randrange(32000) for _ in range(rnd.randrange(1, 20))]
            e.add_request(f"s{seed}-{added}", tokens, max_tokens=rnd.randrange(1, 8))
            added += 1
        for e in engines:
            reqs = list(e.scheduler.requests.values())
            live = [r for r in reqs if not r.is_finished()]
            if live and rnd.random() < 0.04:
                e.abort([rnd.choice(live).request_id])
            running = [r for r in live if r.status == RequestStatus.RUNNING]
            if running and rnd.random() < 0.04:
                e.scheduler.preempt(rnd.choice(running).request_id)
            e.step()
        if added >= restart_after and restarts == 0:
            sidecar.restart()  # SIGKILL, then a fresh process on the same endpoint
            restarts += 1
    # The random part may load little on a busy machine (lookups past their deadline count as
    # misses): a last, known prefix is saved by one engine and loaded by another.
    final = [rnd.randrange(32000) for _ in range(3 * 16 + 5)]
    e2.add_request(f"s{seed}-save", final, max_tokens=1)
    e2.run(step_bound)
    e1.add_request(f"s{seed}-load", final + [1], max_tokens=1)
    e1.run(step_bound)
    check(any(rid == f"s{seed}-load" and n == 48 for rid, n, _ in e1.scheduler.admissions), "the known prefix was loaded")
    counts = {
        "requests": added,
        "loads": sum(1 for e in engines for _, n, a in e.scheduler.admissions if a and n > 0),
        "blocks compared": sum(e.stats.loaded_blocks_compared for e in engines),
        "aborts": sum(e.stats.aborts for e in engines),
        "preemptions": sum(e.scheduler.num_preemptions for e in engines),
        "restarts": restarts,
        "steps": steps,
    }
    with capsys.disabled():
        line = ", ".join(f"{k} {v}" for k, v in counts.items())
        print(f"\ntwin random run seed {seed} ({version[:8]}): {line}", file=sys.stderr)
    check(counts["loads"] > 0 and counts["blocks compared"] > 0, f"the run loaded nothing: {counts}")
    check(restarts == 1, "the sidecar was killed and restarted once")
