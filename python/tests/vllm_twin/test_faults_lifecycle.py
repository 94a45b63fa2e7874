"""Scenarios of the request lifecycle as vLLM drives it: abort while loading, a preempted request
asking again, what ``request_finished`` hands vLLM, load failures under both policies."""

from __future__ import annotations

import pytest
from vllm import _twin

from tests.vllm_twin.twin.helpers import loading, offered, prompt, serve, step_until

VERSIONS = pytest.mark.parametrize("version", _twin.VERSIONS, ids=["fixture", "current"])


@VERSIONS
def test_abort_while_a_load_is_in_flight(twin, version):
    """vLLM keeps the blocks of a request aborted while loading until the load is reported,
    then frees it; a delayed free from the connector as well would name it in finished_sending
    after it is gone (``assert req_id in self.requests``)."""
    a = twin(version=version)
    p = prompt(1, 64)
    serve(a, "w", p + [7])
    b = twin(version=version, model=a.spec.model, reverse_blocks=True)
    b.add_request("x", p + [9, 9, 9], max_tokens=3)
    step_until(b, lambda: loading(b, "x"))
    b.abort(["x"])
    b.run(200)
    assert b.finished["x"].finish_reason == "abort"


@VERSIONS
def test_preempted_request_looks_up_again(twin, version):
    """A request preempted after its chunks were saved finds them when it asks again, as any
    other request with that prompt does (vLLM's own prefix cache is off: the freed blocks are
    gone, as under the memory pressure that preempts)."""
    e = twin(version=version, enable_prefix_caching=False)
    p = prompt(2, 60)
    e.add_request("r", p, max_tokens=200)  # still running however many steps its saves take
    step_until(e, lambda: e.scheduler.requests["r"].num_output_tokens >= 4)
    # The scenario is about the lookups after the preemption: r's three chunks must be stored
    # first. (Preempted with a save still in flight, the save is cancelled, and both lookups
    # rightly miss what it would have stored: on a busy machine the saves are slower than the
    # four decode steps.)
    step_until(e, lambda: sum(s["chunks_saved"] for s in e.worker_stats()) >= 2 * 3, max_steps=2000)
    assert e.scheduler.preempt("r")
    e.add_request("s", p + [5], max_tokens=2)
    e.run(300)
    assert offered(e, "s") == [48], "a new request loads the 3 stored chunks"
    assert offered(e, "r") == [0, 48], "the preempted request looks up again and loads them too"


@VERSIONS
def test_request_finished_hands_vllm_no_params(twin, version):
    """kvtier needs nothing from vLLM's request outputs: no ``kv_transfer_params`` in them."""
    a = twin(version=version)
    p = prompt(3, 40)
    serve(a, "a", p)
    e = twin(version=version, model=a.spec.model)
    serve(e, "b", p + [1])
    e.add_request("c", p + [2], max_tokens=5)
    step_until(e, lambda: "c" in e.scheduler.requests and e.scheduler.requests["c"].num_output_tokens >= 1)
    e.abort(["c"])
    e.run(200)
    assert offered(e, "b") == [32]
    params = {o.request_id: o.kv_transfer_params for o in e.outputs if o.finish_reason}
    params.update({o.request_id: o.kv_transfer_params for o in a.outputs if o.finish_reason})
    assert params == {"a": None, "b": None, "c": None}
