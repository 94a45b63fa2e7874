"""One engine process of the two-process test: ``save`` (worker A) or ``load`` (worker B).

Each process has its own shared-memory KV cache, its own scheduler and worker connectors and its
own clients. A computes and saves the prompts; B (other block ids: it allocates from the end of
its pool) looks them up, loads them and compares every byte with the KV A computed. Prints one
JSON line with what it did; exits non-zero on any mismatch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kvtier_vllm.connector_types import ConnectorRequest  # noqa: E402
from tests.support.rig import Rig, tokens  # noqa: E402


def main() -> int:
    role, endpoint, tag, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    rig = Rig(endpoint, block=16, chunk=64, num_blocks=512, layers=3, heads=4, head_dim=32, tag=tag)
    prompts = [tokens(1000 + i, 300 + 37 * i) for i in range(n)]
    try:
        if role == "save":
            for i, p in enumerate(prompts):
                rig.save_prompt(f"A{i}", p)
            print(json.dumps({"saved": n}))
            return 0
        report = {"loaded_tokens": 0, "blocks_checked": 0, "mismatched": 0}
        for i, p in enumerate(prompts):
            req = ConnectorRequest(f"B{i}", p)
            got, _ = rig.ask(req)
            expected = ((len(p) - 1) // 64) * 64
            if got != expected:
                print(json.dumps({"error": f"B{i} claimed {got}, expected {expected}"}))
                return 1
            table = rig.alloc(-(-len(p) // 16), reverse=True)
            rig.scribble(table)
            rig.scheduler.update_state_after_alloc(req, table, got)
            rig.step()
            out = rig.until_recving(req.request_id)
            if out.invalid_block_ids:
                print(json.dumps({"error": f"B{i}: invalid blocks {sorted(out.invalid_block_ids)}"}))
                return 1
            bad = rig.mismatched(p, table, 0, got // 16)
            report["loaded_tokens"] += got
            report["blocks_checked"] += got // 16
            report["mismatched"] += len(bad)
            rig.scheduler.request_finished(req, table)
            rig.free(table)
        print(json.dumps(report))
        return 0 if report["mismatched"] == 0 else 1
    finally:
        rig.close()


if __name__ == "__main__":
    sys.exit(main())
