"""The worker connector's bookkeeping over a client whose replies the test settles by hand,
mirroring test/unit/connector.test.ts, plus heartbeats and UNREGISTER."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from kvtier_vllm.connector_types import ConnectorMeta, LoadIntent, RequestEnd, SaveIntent
from kvtier_vllm.errors import ClosedError, ConfigError, InvalidArgumentError, RequestTimeoutError
from kvtier_vllm.worker import WorkerConnector


class FakePending:
    def __init__(self, value=None):
        self.value, self.error, self.settled = value, None, value is not None

    @property
    def done(self):
        return self.settled

    def settle(self, value=None, error=None):
        self.value, self.error, self.settled = value, error, True

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value

    def exception(self):
        return self.error if self.settled else None

    def wait(self, timeout_ms=None):
        return self.result()


class FakeClient:
    def __init__(self, known=True):
        self.sent, self.known, self.closed = [], known, False
        self.lock = threading.Lock()
        self.not_after: list = []
        self.cuda_events: list = []
        self.canceled: list = []
        self.load_deadlines: list = []

    def _add(self, kind, *args, value=None):
        p = FakePending(value)
        with self.lock:
            self.sent.append((kind, args, p))
        return p

    #: What the sidecar answers as ``blockLayout``: None as a sidecar older than the field.
    block_layout = "NHD"

    def send_register(self, reg):
        answer = SimpleNamespace(engine_id=reg["engineId"], namespace=b"\0" * 16, chunk_size=16, block_size=4)
        if self.block_layout is not None:
            answer.block_layout = reg.get("blockLayout", "NHD")
        return self._add("register", reg["engineId"], value=answer)

    def send_load(self, engine, rid, lookup_id, block_ids, hashes, deadline_ms=0, state_slot=-1, skip_blocks=0, not_after_ns=None):
        self.not_after.append(not_after_ns)
        self.load_deadlines.append(deadline_ms)
        return self._add("load", rid, lookup_id, tuple(block_ids), skip_blocks)

    def send_save(self, engine, rid, skip, block_ids, hashes, not_after_ns=None, cuda_event=None):
        self.not_after.append(not_after_ns)
        self.cuda_events.append(cuda_event)
        return self._add("save", rid, tuple(block_ids))

    def cancel(self, lookup_id):
        self.canceled.append(lookup_id)

    def send_request_finished(self, engine, rid, kind):
        return self._add("finished", rid, kind, value=SimpleNamespace(released=True))

    def send_heartbeat(self, engine):
        return self._add("heartbeat", engine, value=SimpleNamespace(known=self.known))

    def send_unregister(self, engine):
        return self._add("unregister", engine, value=SimpleNamespace(released=True))

    def poll(self, timeout_ms=0):
        if timeout_ms:
            time.sleep(timeout_ms / 1000)
        return 0

    def close(self):
        self.closed = True

    def of(self, kind):
        return [(a, p) for k, a, p in self.sent if k == kind]


def load(rid, blocks, skip=0):
    return LoadIntent(rid, f"{rid}#1", 0, len(blocks) * 4, tuple(blocks), b"\0" * 32, skip)


def save(rid):
    return SaveIntent(rid, 0, (1, 2, 3, 4), b"\0" * 32)


@pytest.fixture
def w():
    c = FakeClient()
    wc = WorkerConnector(c, lookup_suffix="@r1")
    wc.register_kv_caches({"engineId": "e"})
    yield c, wc


def test_loads_return_at_once_outcomes_and_errors_drained_once(w):
    c, wc = w
    wc.start_load_kv(ConnectorMeta(loads=(load("a", [1, 2, 3, 4]), load("b", [5, 6, 7, 8], skip=1))))
    (a_args, a), (b_args, b) = c.of("load")
    assert a_args[1] == "a#1@r1" and b_args[3] == 1, "this rank's lookup id; skip_blocks passed on"
    assert wc.get_finished() == (set(), set())
    a.settle(SimpleNamespace(loaded_tokens=8, invalid_block_ids=[3, 4]))
    b.settle(error=InvalidArgumentError("refused by the sidecar"))
    assert wc.get_finished()[1] == {"a", "b"}
    assert wc.get_block_ids_with_load_errors() == {3, 4, 5, 6, 7, 8}
    assert wc.get_finished() == (set(), set())
    assert wc.get_block_ids_with_load_errors() == set()


def test_saves_at_wait_for_save_after_synchronize_and_delayed_free(w):
    c, wc = w
    wc.start_load_kv(ConnectorMeta(saves=(save("a"),)))
    assert c.of("save") == []
    order = []
    wc.wait_for_save(lambda: order.append(len(c.of("save"))))
    assert order == [0], "the stream is synchronized before the SAVE is sent"
    wc.start_load_kv(ConnectorMeta(finished=(RequestEnd("a", "finished", True),)))
    assert [a for a, _ in c.of("finished")] == [("a", "finished")]
    assert wc.get_finished()[0] == set()
    c.of("save")[0][1].settle(SimpleNamespace(saved=1, skipped=0, dropped=0))
    assert wc.get_finished()[0] == {"a"}
    assert wc.get_finished()[0] == set()


def test_saves_carry_the_recorded_cuda_event_instead_of_a_synchronize(w):
    c, wc = w
    handle = bytes(range(64))
    recorded = []
    wc.start_load_kv(ConnectorMeta(saves=(save("a"), save("b"))))
    wc.wait_for_save(
        synchronize=lambda: pytest.fail("no synchronize when saves carry an event"),
        cuda_event=lambda: recorded.append(len(c.of("save"))) or handle,
    )
    assert recorded == [0], "the event is recorded once, before the SAVEs are sent"
    assert [a[0] for a, _ in c.of("save")] == ["a", "b"]
    assert c.cuda_events == [handle, handle]
    wc.start_load_kv(ConnectorMeta(saves=(save("c"),)))
    wc.wait_for_save(lambda: None)
    assert c.cuda_events[-1] is None, "without an event recorder the SAVE carries none"


def test_preemption_sends_nothing_and_waits_for_saves(w):
    c, wc = w
    wc.start_load_kv(ConnectorMeta(saves=(save("p"),)))
    wc.wait_for_save()
    wc.start_load_kv(ConnectorMeta(finished=(RequestEnd("p", "preempted", False),)))
    assert c.of("finished") == []
    assert wc.handle_preemptions(["p"], timeout_s=0.05) is False, "still reading the blocks"
    threading.Timer(0.05, lambda: c.of("save")[0][1].settle(error=RequestTimeoutError("dropped"))).start()
    assert wc.handle_preemptions(["p"], timeout_s=5) is True
    assert wc.stats().saves_failed == 1
    assert wc.get_finished()[0] == set()


def test_hnd_blocks_need_a_sidecar_that_confirms_it_reorders_them():
    # A sidecar that answers blockLayout registers HND blocks; NHD ones need no answer.
    c = FakeClient()
    WorkerConnector(c).register_kv_caches({"engineId": "e", "blockLayout": "HND"})
    assert not c.of("unregister")
    old = FakeClient()
    old.block_layout = None
    WorkerConnector(old).register_kv_caches({"engineId": "n"})
    assert not old.of("unregister")
    # One older than the field would store HND blocks unreordered, where NHD engines read them:
    # refused, and the registration taken back, so no SAVE or LOAD of this engine is served.
    wc = WorkerConnector(old)
    with pytest.raises(ConfigError, match="did not confirm blockLayout HND.*upgrade the sidecar"):
        wc.register_kv_caches({"engineId": "h", "blockLayout": "HND"})
    assert [a for a, _ in old.of("unregister")] == [("h",)]
    assert wc.registration_result is None


def test_refuses_before_registration_and_after_close_unregisters():
    c = FakeClient()
    wc = WorkerConnector(c)
    with pytest.raises(InvalidArgumentError):
        wc.start_load_kv(ConnectorMeta())
    wc.register_kv_caches({"engineId": "e"})
    wc.close()
    wc.close()
    assert [a for a, _ in c.of("unregister")] == [("e",)] and c.closed
    with pytest.raises(ClosedError):
        wc.start_load_kv(ConnectorMeta())


def test_heartbeats_when_idle_and_registers_again_when_forgotten():
    main, hb = FakeClient(), FakeClient(known=False)
    wc = WorkerConnector(main, heartbeat_client_factory=lambda: hb, heartbeat_interval_s=0.05)
    wc.register_kv_caches({"engineId": "e"})
    deadline = time.monotonic() + 5
    while not hb.of("register"):
        assert time.monotonic() < deadline, "no re-registration"
        time.sleep(0.01)
    assert hb.of("heartbeat"), "heartbeats go through the thread's own client"
    assert wc.stats().registrations >= 2
    wc.close()
    assert hb.closed


def test_without_a_registration_loads_fail_and_frees_are_reported():
    c = FakeClient()
    wc = WorkerConnector(c)
    wc.drop_meta(ConnectorMeta(loads=(load("a", [1, 2]),), saves=(save("b"),), finished=(RequestEnd("c", "aborted", True),)))
    wc.wait_for_save() if wc.engine_id else None
    assert wc.get_finished() == ({"c"}, {"a"})
    assert wc.get_block_ids_with_load_errors() == {1, 2}
    assert c.sent == []


def test_a_failed_first_registration_is_retried_by_the_heartbeat_thread():
    class Down(FakeClient):
        def send_register(self, reg):
            p = FakePending()
            p.settle(error=RequestTimeoutError("sidecar down"))
            return p

    main, hb = Down(), FakeClient(known=False)
    wc = WorkerConnector(main, heartbeat_client_factory=lambda: hb, heartbeat_interval_s=0.05)
    with pytest.raises(RequestTimeoutError):
        wc.register_kv_caches({"engineId": "e"})
    deadline = time.monotonic() + 5
    while wc.registration_result is None:
        assert time.monotonic() < deadline, "never registered"
        time.sleep(0.01)
    assert wc.engine_id == "e"
    wc.close()


def test_transfers_without_a_reply_keep_their_blocks_until_the_not_after_time():
    """A SAVE or LOAD that got no reply (frozen or lost sidecar) may still be read by the sidecar
    until its not-after time: the request is not reported before then. One the sidecar answered,
    even with an error, is settled at once."""
    c = FakeClient()
    c.request_timeout_s = 0.3
    w = WorkerConnector(c, load_timeout_ms=300)
    w.register_kv_caches({"engineId": "e0"})
    sent_at = time.monotonic()
    w.start_load_kv(ConnectorMeta(loads=(load("a", [1, 2, 3, 4]),), saves=(SaveIntent("s", 0, (5, 6, 7, 8), b"\0" * 32),)))
    w.wait_for_save()
    w.start_load_kv(ConnectorMeta(finished=(RequestEnd("s", "finished", True),)))
    (_, lp), = c.of("load")
    (_, sp), = c.of("save")
    assert all(n is not None and abs(n / 1e9 - sent_at - 0.3) < 0.25 for n in c.not_after), "the deadlines, on the monotonic clock"
    lp.settle(error=RequestTimeoutError("sidecar down"))
    sp.settle(error=RequestTimeoutError("sidecar down"))
    assert w.get_finished(set()) == (set(), set()), "kept: the sidecar may still copy"
    assert w.get_block_ids_with_load_errors() == set()
    deadline = time.monotonic() + 10
    sending, recving, errors = set(), set(), set()
    while not (sending and recving):
        s, r = w.get_finished(set())
        sending |= s
        recving |= r
        errors |= w.get_block_ids_with_load_errors()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert time.monotonic() - sent_at >= 0.3, "not before the not-after time"
    assert (sending, recving, errors) == ({"s"}, {"a"}, {1, 2, 3, 4})
    # answered with an error: settled at once
    w.start_load_kv(ConnectorMeta(loads=(load("b", [9, 10, 11, 12]),)))
    c.of("load")[-1][1].settle(error=InvalidArgumentError("refused"))
    assert w.get_finished(set()) == (set(), {"b"})


@pytest.mark.parametrize("intent_ms,config_ms,sent_ms", [(0, 0, 20_000), (1500, 0, 1500), (1500, 800, 800), (0, 800, 800), (400, 5000, 400)])
def test_a_loads_deadline_is_the_shortest_of_the_intents_the_settings_and_the_sidecars_default(intent_ms, config_ms, sent_ms):
    """The scheduler bounds a LOAD by the time computing its tokens takes (the intent's
    ``deadline_ms``); ``load_timeout_ms`` and the sidecar's 20 s bound it too. The blocks are
    held until the not-after time that deadline gives."""
    c = FakeClient()
    w = WorkerConnector(c, load_timeout_ms=config_ms)
    w.register_kv_caches({"engineId": "e0"})
    sent_at = time.monotonic()
    intent = LoadIntent("a", "a#1", 0, 16, (1, 2, 3, 4), b"\0" * 32, 0, deadline_ms=intent_ms)
    w.start_load_kv(ConnectorMeta(loads=(intent,)))
    assert c.load_deadlines == [sent_ms]
    assert abs(c.not_after[0] / 1e9 - sent_at - sent_ms / 1000) < 0.25
