"""Layer-wise loads in the worker connector (``layerwise_loads``): a LOAD names a progress word in
the worker's state file, the sidecar raises it as each layer of every chunk lands, and
``wait_for_layer_load(layer)`` returns once the word passes that layer; the load ends with its
step (never in ``finished_recving``); a failed or late one reports its blocks invalid. The
sidecar here is a stand-in that writes the real state file the way the data plane does
(docs/protocol.md 4.9, ``progressSlot``); test/unit/data-plane-layerwise.test.ts checks the
sidecar's side."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from kvtier_vllm.connector_types import ConnectorMeta, LoadIntent
from kvtier_vllm.save_fence import SaveFences
from kvtier_vllm.connector_types import ConnectorOutput
from kvtier_vllm.errors import InvalidArgumentError
from kvtier_vllm.scheduler import SchedulerConnector
from kvtier_vllm.worker import WorkerConnector

from tests.test_scheduler import BLOCK, CHUNK, FakeLookup, prompt, table
from tests.test_worker import FakeClient

LAYERS = 4


class LayerwiseClient(FakeClient):
    """A sidecar that lists ``layerwiseLoad`` (or not) and records each LOAD's progress slot."""

    def __init__(self, layerwise=True):
        super().__init__()
        self.features = ["saveFence", "layerwiseLoad"] if layerwise else ["saveFence"]
        self.progress_slots: list = []

    def send_ping(self, timeout_ms=None):
        return self._add("ping", value={"features": self.features, "instanceId": "s1"})

    def send_load(self, engine, rid, lookup_id, block_ids, hashes, deadline_ms=0, state_slot=-1, skip_blocks=0, not_after_ns=None, progress_slot=None):
        self.progress_slots.append(progress_slot)
        self.load_deadlines.append(deadline_ms)
        return self._add("load", rid, lookup_id, tuple(block_ids), skip_blocks)


@pytest.fixture
def fences(tmp_path):
    f = SaveFences(str(tmp_path), slots=8)
    yield f
    f.close()


def worker(client, fences):
    w = WorkerConnector(client, save_fences=fences)
    w.register_kv_caches({"engineId": "e", "layers": [{}] * LAYERS})
    return w


def layerwise(rid, blocks=(1, 2, 3, 4), deadline_ms=0):
    return LoadIntent(rid, f"{rid}#1", 0, len(blocks) * 4, tuple(blocks), b"\0" * 32, deadline_ms=deadline_ms, layerwise=True)


def meta(*loads):
    return ConnectorMeta(tuple(loads), (), ())


def later(seconds, fn):
    t = threading.Timer(seconds, fn)
    t.start()
    return t


def test_each_layer_is_waited_for_until_the_progress_word_passes_it(fences):
    c = LayerwiseClient()
    w = worker(c, fences)
    free = fences.free_slots
    w.start_load_kv(meta(layerwise("r")))
    (slot,) = c.progress_slots
    assert slot is not None and fences.word(slot) == 0
    assert fences.free_slots == free - 1
    seen = []
    # The stand-in sidecar lands one layer every 40 ms, then answers.
    timers = [later(0.04 * (n + 1), lambda n=n: fences._words.__setitem__(slot, n + 1)) for n in range(LAYERS)]
    try:
        for layer in range(LAYERS):
            w.wait_for_layer_load(layer)
            seen.append(fences.word(slot))
    finally:
        for t in timers:
            t.join()
    # Every layer was in when its wait returned, and not every layer at the first one.
    assert all(word > layer for layer, word in enumerate(seen)), seen
    assert seen[0] < LAYERS, seen
    [(_, p)] = c.of("load")
    p.settle(SimpleNamespace(loaded_tokens=16, invalid_block_ids=[]))
    sending, recving = w.get_finished()
    assert recving == set(), "a synchronous load is never reported in finished_recving"
    assert w.get_block_ids_with_load_errors() == set()
    assert fences.free_slots == free, "the progress slot is free again once the LOAD settled"


def test_a_load_that_lands_only_some_layers_reports_its_blocks_invalid(fences):
    c = LayerwiseClient()
    w = worker(c, fences)
    w.start_load_kv(meta(layerwise("r", blocks=(5, 6, 7, 8))))
    (slot,) = c.progress_slots
    [(_, p)] = c.of("load")
    # Layers 0 and 1 land; a chunk is missing, so the sidecar stops short and answers.
    fences._words[slot] = 2
    w.wait_for_layer_load(0)
    w.wait_for_layer_load(1)
    later(0.05, lambda: p.settle(SimpleNamespace(loaded_tokens=0, invalid_block_ids=[7, 8]))).join()
    w.wait_for_layer_load(2)  # returns on the answer
    w.wait_for_layer_load(3)
    assert w.get_finished() == (set(), set())
    assert w.get_block_ids_with_load_errors() == {7, 8}


def test_a_load_past_its_deadline_is_given_up_at_the_layer_and_held_to_the_end_of_the_step(fences):
    c = LayerwiseClient()
    w = worker(c, fences)
    free = fences.free_slots
    w.start_load_kv(meta(layerwise("r", deadline_ms=100)))
    t0 = time.monotonic()
    w.wait_for_layer_load(0)  # nothing lands and no answer comes
    assert time.monotonic() - t0 >= 0.09, "waited until the deadline"
    assert w.get_block_ids_with_load_errors() == {1, 2, 3, 4}
    # The step's end waits until the sidecar can no longer write the blocks (the reply, here).
    [(_, p)] = c.of("load")
    later(0.1, lambda: p.settle(SimpleNamespace(loaded_tokens=16, invalid_block_ids=[]))).join()
    assert w.get_finished() == (set(), set())
    assert w.get_block_ids_with_load_errors() == set(), "reported once"
    assert fences.free_slots == free


def test_without_a_sidecar_that_writes_progress_the_first_layer_waits_for_the_whole_load(fences):
    c = LayerwiseClient(layerwise=False)
    w = worker(c, fences)
    w.start_load_kv(meta(layerwise("r")))
    assert c.progress_slots == [None]
    [(_, p)] = c.of("load")
    t0 = time.monotonic()
    later(0.08, lambda: p.settle(SimpleNamespace(loaded_tokens=16, invalid_block_ids=[])))
    w.wait_for_layer_load(0)
    assert time.monotonic() - t0 >= 0.07 and p.settled
    w.wait_for_layer_load(LAYERS - 1)
    assert w.get_finished() == (set(), set())


def test_asynchronous_loads_are_not_waited_for_in_the_forward_pass(fences):
    c = LayerwiseClient()
    w = worker(c, fences)
    intent = layerwise("r")
    w.start_load_kv(meta(LoadIntent(**{**intent.__dict__, "layerwise": False})))
    assert c.progress_slots == [None]
    w.wait_for_layer_load(0)  # returns at once: the request is not scheduled until it settles
    [(_, p)] = c.of("load")
    p.settle(SimpleNamespace(loaded_tokens=16, invalid_block_ids=[]))
    assert w.get_finished() == (set(), {"r"})


def test_the_scheduler_offers_hits_as_synchronous_layerwise_loads_that_settle_with_their_step():
    lk = FakeLookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK, layerwise_loads=True)
    req = prompt("a", 100)
    assert sc.get_num_new_matched_tokens(req, 0) == (None, False)
    lk.answers[lk.calls[-1][0]] = 64
    # Scheduled in this step: vLLM computes the rest of the prompt while the layers land.
    assert sc.get_num_new_matched_tokens(req, 0) == (64, False)
    sc.update_state_after_alloc(req, table(25), 64)
    m = sc.build_connector_meta()
    (load,) = m.loads
    assert load.layerwise and load.block_ids == tuple(table(25)[:16])
    # The step's output settles it: no finished_recving ever names a synchronous load.
    sc.update_connector_output(ConnectorOutput(invalid_block_ids={table(25)[9]}))
    # Asked again (vLLM rewound the request to its last valid block): a new lookup, and never
    # the failed chunk (2: blocks 8..11) again.
    assert sc.get_num_new_matched_tokens(req, 0) == (None, False)
    lk.answers[lk.calls[-1][0]] = 64
    assert sc.get_num_new_matched_tokens(req, 0) == (32, False)
    with pytest.raises(InvalidArgumentError, match="layerwise_loads must be true or false"):
        SchedulerConnector(lk, BLOCK, CHUNK, layerwise_loads="yes")
