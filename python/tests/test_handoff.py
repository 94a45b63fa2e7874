"""Disaggregated prefill in the scheduler connector, without a sidecar: a producer's finished
request names what it saved; a consumer's request carrying those parameters looks up with
``await_chunks``/``await_ms`` and stays pending (never claiming 0 for the prefill-rate rule); bad
parameters are logged, counted and looked up plainly; the config keys are checked."""

from __future__ import annotations

import logging

import pytest

from kvtier_vllm.config import KvtierConfig
from kvtier_vllm.connector_types import ConnectorRequest, ScheduledRequest
from kvtier_vllm.errors import ConfigError
from kvtier_vllm.handoff import HandoffRole
from kvtier_vllm.hashing import hash_chunks
from kvtier_vllm.scheduler import SchedulerConnector

BLOCK, CHUNK = 4, 16
NS = bytes(range(16))
PRODUCER = "tcp://10.0.0.5:5555"


class Lookup:
    def __init__(self):
        self.calls, self.answers = [], {}

    def lookup(self, lookup_id, hashes, counts, **kw):
        self.calls.append((lookup_id, len(counts), kw))
        return self.answers.pop(lookup_id, None)

    def forget(self, lookup_id):
        pass

    def cancel(self, lookup_id):
        pass


def role(produces: bool, **kw) -> HandoffRole:
    return HandoffRole(produces=produces, namespace=NS, chunk_size=CHUNK, sidecar=PRODUCER, wait_ms=5000, **kw)


def req(rid="r", n=70):
    return ConnectorRequest(rid, [(i * 31 + 7) % 30000 for i in range(n)])


def produced_params(n=70) -> dict:
    lk = Lookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK, handoff=role(True))
    r = req("p", n)
    sc.build_connector_meta([ScheduledRequest(r, list(range(n // BLOCK + 1)), 0, n)])
    delay, params = sc.request_finished(r, [])
    assert delay is True, "the producer keeps the blocks while the saves may read them"
    return params


def test_producer_names_what_it_saved():
    p = produced_params()["kvtier"]
    chunks = hash_chunks(req().prompt_token_ids, chunk_size=CHUNK)
    assert p["chunks"] == 4 and p["last_hash"] == chunks[3].hash.hex()
    assert p["namespace"] == NS.hex() and p["sidecar"] == PRODUCER and p["chunk_size"] == CHUNK


def test_kv_both_names_nothing():
    sc = SchedulerConnector(Lookup(), BLOCK, CHUNK, handoff=role(False))
    r = req()
    sc.build_connector_meta([ScheduledRequest(r, list(range(18)), 0, 70)])
    assert sc.request_finished(r, [])[1] is None


def test_consumer_waits_with_await_and_no_rate_rule():
    lk = Lookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK, handoff=role(False), prefill_tokens_per_s=1e12)
    params = produced_params()
    r = req("d")
    for _ in range(3):
        assert sc.get_num_new_matched_tokens(r, 0, params) == (None, False), "pending, whatever the rate"
    lid, n, kw = lk.calls[0]
    assert n == 4 and kw == {"await_chunks": 4, "await_ms": 5000}
    lk.answers[lid] = 64
    assert sc.get_num_new_matched_tokens(r, 0, params) == (64, True)
    assert sc.handoff_stats()["awaited"] == 1


@pytest.mark.parametrize(
    "bad",
    [
        "not a dict",
        {"kvtier": "x"},
        {"kvtier": {"version": 2}},
        {"kvtier": {"namespace": "00" * 16}},
        {"kvtier": {"sidecar": "tcp://10.9.9.9:1"}},
        {"kvtier": {"chunks": 0}},
        {"kvtier": {"chunks": 99}},
        {"kvtier": {"last_hash": "ab" * 32}},
        {"kvtier": {"chunk_size": 32}},
    ],
)
def test_bad_params_are_logged_and_looked_up_plainly(bad, caplog):
    good = produced_params()
    if isinstance(bad, dict) and isinstance(bad["kvtier"], dict):
        bad = {"kvtier": {**good["kvtier"], **bad["kvtier"]}}
    lk = Lookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK, handoff=role(False, producers=[PRODUCER]))
    caplog.set_level(logging.ERROR, logger="kvtier_vllm.handoff")
    assert sc.get_num_new_matched_tokens(req("d"), 0, bad) == (None, False)
    assert lk.calls[0][2] == {}, "a plain lookup"
    assert sc.handoff_stats()["refused_params"] == 1
    assert [r.getMessage() for r in caplog.records if "request d:" in r.getMessage()]


def test_other_connectors_params_are_no_error(caplog):
    lk = Lookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK, handoff=role(False))
    assert sc.get_num_new_matched_tokens(req("d"), 0, {"do_remote_decode": True}) == (None, False)
    assert lk.calls[0][2] == {} and sc.handoff_stats()["refused_params"] == 0 and not caplog.records


def test_config_keys():
    c = KvtierConfig.from_extra({"handoff_wait_ms": 250, "handoff_producers": [PRODUCER]})
    assert c.handoff_wait_ms == 250 and c.handoff_producers == (PRODUCER,)
    with pytest.raises(ConfigError, match="handoff_wait_ms"):
        KvtierConfig.from_extra({"handoff_wait_ms": -1})
    with pytest.raises(ConfigError, match="handoff_producers"):
        KvtierConfig.from_extra({"handoff_producers": "tcp://x:1"})
