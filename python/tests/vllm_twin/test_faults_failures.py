"""Scenarios of loads that fail: a worker whose registration failed, chunks evicted between the
lookup and the load (both ``kv_load_failure_policy`` values)."""

from __future__ import annotations

import pytest
from vllm import _twin

from kvtier_vllm.client import KvtierClient
from tests.vllm_twin.twin.helpers import offered, prompt, serve

VERSIONS = pytest.mark.parametrize("version", _twin.VERSIONS, ids=["fixture", "current"])


@VERSIONS
def test_worker_whose_register_failed_does_not_livelock(twin, version):
    """Rank 1 cannot register (the sidecar cannot open its KV cache): every load it is given
    fails. The scheduler stops offering what failed, and vLLM serves on."""
    a = twin(version=version)
    p = prompt(21, 60)
    serve(a, "w", p)
    b = twin(version=version, model=a.spec.model, unopenable_ranks=(1,))
    serve(b, "x", p + [1], max_steps=300)
    assert offered(b, "x") == [48, 0], "offered once; after the failed load it computes"
    for rid in ("y", "z"):
        serve(b, rid, p + [2, len(rid)], max_steps=300)
        assert offered(b, rid) in ([0], [48, 0]), "never offered the failed chunks twice"


@VERSIONS
@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_chunks_evicted_between_lookup_and_load(twin, twin_sidecar, version, policy):
    """The chunks go between the answer and the LOAD: the load reports invalid blocks, never
    wrong bytes; vLLM then recomputes the request or finishes it with an error."""
    a = twin(version=version)
    p = prompt(22, 60)
    serve(a, "w", p)
    b = twin(version=version, model=a.spec.model, kv_load_failure_policy=policy, reverse_blocks=True)
    b.add_request("x", p + [1], max_tokens=2)
    admin = KvtierClient(twin_sidecar.endpoint)

    def evict(so):
        if so.kv_connector_metadata.meta.loads:
            admin.clear()

    try:
        for _ in range(300):
            if not b.busy():
                break
            b.step(before_execute=evict)
    finally:
        admin.close()
    assert not b.busy()
    assert offered(b, "x")[0] == 48
    reason = b.finished["x"].finish_reason
    assert reason == ("error" if policy == "fail" else "length")
