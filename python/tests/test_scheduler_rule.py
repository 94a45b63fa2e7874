"""Never slower than recomputing" on the scheduler side (docs/vllm.md): the rate the lookups
carry (configured, or learned from the engine's steps), the deadline it gives them, what of an
answer is claimed, and when a request waits a step for its lookup. The lookup client is a
stand-in whose answers the test releases, as in test_scheduler.py."""

from __future__ import annotations

import pytest

from kvtier_vllm import protocol as P
from kvtier_vllm.config import KvtierConfig
from kvtier_vllm.connector_types import ConnectorRequest
from kvtier_vllm.errors import ConfigError, InvalidArgumentError
from kvtier_vllm.lookup_rule import LookupDetails, StepClock, lookup_wait_ms
from kvtier_vllm.rank_lookup import RankLookup
from kvtier_vllm.scheduler import SchedulerConnector

BLOCK, CHUNK = 4, 16


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class RateLookup:
    """A lookup client that takes the rate: records what each call carried; answers and their
    details are set by the test."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.answers: dict[str, int] = {}
        self.details: dict[str, LookupDetails] = {}
        self.forgotten: list[str] = []
        self.canceled: list[str] = []

    def lookup(self, lookup_id, hashes, counts, namespaces=None, compute_tokens_per_s=None, timeout_ms=None):
        self.calls.append({"id": lookup_id, "rate": compute_tokens_per_s, "timeout_ms": timeout_ms, "chunks": len(counts)})
        return self.answers.pop(lookup_id, None)

    def lookup_details(self, lookup_id):
        return self.details.pop(lookup_id, None)

    def forget(self, lookup_id):
        self.forgotten.append(lookup_id)

    def cancel(self, lookup_id):
        self.canceled.append(lookup_id)


def prompt(rid: str, n: int) -> ConnectorRequest:
    return ConnectorRequest(rid, [(i * 31 + len(rid)) % 40_000 for i in range(n)])


def rates(disk: str) -> list:
    return [P.TierRate("cpu", "none", 0, 0, 0), P.TierRate("disk", disk, 50_000_000, 900, 0)]


def cpu_then_disk(cpu: int, disk: int, decision: str) -> LookupDetails:
    return LookupDetails("ok", cpu + disk, [P.TierTokens("cpu", cpu), P.TierTokens("disk", disk)], 64, rates(decision))


def test_step_clock_learns_the_rate_from_prefill_steps_only():
    clock = Clock()
    steps = StepClock(CHUNK, clock, min_samples=2)
    assert steps.tokens_per_s is None and steps.step_ms == 0
    for tokens, took in ((400, 0.1), (4, 0.02), (800, 0.2)):  # 4000 tokens/s twice; a decode step
        steps.step(tokens)
        clock.now += took
    steps.step(0)  # the engine goes idle: the 800-token step took 0.2 s
    assert steps.samples == 2 and steps.tokens_per_s == pytest.approx(4000)
    assert steps.step_ms == pytest.approx(200)
    clock.now += 30
    steps.step(400)  # the first step after idling says nothing about the last one
    clock.now += 7  # held up for longer than any step takes: not a sample
    steps.step(400)
    assert steps.samples == 2 and steps.step_ms == pytest.approx(200)
    clock.now += 0.05
    steps.step(0)  # 400 tokens in 50 ms: 8000 tokens/s moves the mean by a quarter
    assert steps.tokens_per_s == pytest.approx(5000)


def test_lookups_carry_the_configured_rate_and_a_deadline_from_it():
    lk = RateLookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK, prefill_tokens_per_s=8000)
    req = prompt("a", 70)  # 4 full chunks before the last token
    assert sc.get_num_new_matched_tokens(req, 16) == (None, False)
    call = lk.calls[-1]
    assert call["rate"] == 8000 and call["chunks"] == 4
    assert call["timeout_ms"] == lookup_wait_ms(64 - 16, 8000) == 6  # 48 claimable tokens at 8000/s
    assert sc.rule_stats()["lookups_bounded"] == 1


def test_only_what_the_sidecars_rule_admitted_is_claimed():
    lk = RateLookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK, prefill_tokens_per_s=8000)
    req = prompt("a", 70)
    assert sc.get_num_new_matched_tokens(req, 0) == (None, False)
    # 32 tokens in host memory, 32 more on a disk the sidecar did not load from
    lk.answers["a#1"], lk.details["a#1"] = 64, cpu_then_disk(32, 32, "decline")
    assert sc.get_num_new_matched_tokens(req, 0) == (32, True)
    assert sc.rule_stats()["declined_tokens"] == 32
    lk2 = RateLookup()
    sc2 = SchedulerConnector(lk2, BLOCK, CHUNK, prefill_tokens_per_s=8000)
    sc2.get_num_new_matched_tokens(req, 0)
    lk2.answers["a#1"], lk2.details["a#1"] = 64, cpu_then_disk(32, 32, "load")
    assert sc2.get_num_new_matched_tokens(req, 0) == (64, True)
    assert sc2.rule_stats()["declined_tokens"] == 0


def test_without_a_rate_every_hit_is_claimed_and_lookups_wait_the_clients_timeout():
    lk = RateLookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK)
    req = prompt("a", 70)
    sc.get_num_new_matched_tokens(req, 0)
    assert lk.calls[-1]["rate"] is None and lk.calls[-1]["timeout_ms"] is None
    lk.answers["a#1"], lk.details["a#1"] = 64, cpu_then_disk(32, 32, "decline")
    assert sc.get_num_new_matched_tokens(req, 0) == (64, True)
    assert sc.prefill_tokens_per_s is None


def run_steps(sc: SchedulerConnector, clock: Clock, n: int, tokens: int, took: float, running=("busy",)) -> None:
    for _ in range(n):
        sc.engine_step(tokens, running)
        clock.now += took


def test_a_pending_lookup_holds_a_request_back_only_when_computing_would_take_longer_than_a_step():
    clock = Clock()
    lk = RateLookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK, clock=clock, prefill_tokens_per_s="auto")
    assert sc.prefill_tokens_per_s is None, "nothing learned yet: the rule is off"
    run_steps(sc, clock, 5, 1000, 0.1)  # 10,000 tokens/s, 100 ms steps, another request running
    assert sc.prefill_tokens_per_s == pytest.approx(10_000)
    # 48 claimable tokens compute in 4.8 ms, far less than the 100 ms step the request would wait
    short = prompt("short", 50)
    assert sc.get_num_new_matched_tokens(short, 0) == (0, False)
    assert lk.calls[-1]["rate"] == pytest.approx(10_000) and lk.calls[-1]["timeout_ms"] == 5
    assert sc.rule_stats()["computed_instead"] == 1
    assert lk.forgotten == [], "the lookup goes on: an ask before the request is admitted uses it"
    lk.answers["short#1"] = 48
    assert sc.get_num_new_matched_tokens(short, 0) == (48, True)
    # 2,000 claimable tokens take 200 ms to compute: worth waiting a 100 ms step
    long = prompt("long", 2001)
    assert sc.get_num_new_matched_tokens(long, 0) == (None, False)
    # an idle engine steps again at once: any pending lookup is worth that
    sc.engine_step(0, ())
    assert sc.get_num_new_matched_tokens(prompt("idle", 50), 0) == (None, False)
    # the request itself running (a preempted one asked again) is no other request's step
    sc.engine_step(1000, ("self",))
    assert sc.get_num_new_matched_tokens(prompt("self", 50), 0) == (None, False)


def test_a_request_admitted_without_its_pending_lookup_releases_it():
    clock = Clock()
    lk = RateLookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK, clock=clock, prefill_tokens_per_s="auto")
    run_steps(sc, clock, 5, 1000, 0.1)
    req = prompt("a", 50)
    assert sc.get_num_new_matched_tokens(req, 0) == (0, False)
    sc.update_state_after_alloc(req, list(range(13)), 0)
    assert lk.forgotten == ["a#1"]


def test_an_answer_the_engines_prefix_covers_is_not_looked_up_again_while_the_request_waits():
    lk = RateLookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK)
    req = prompt("a", 70)
    assert sc.get_num_new_matched_tokens(req, 32) == (None, False)
    lk.answers["a#1"] = 32  # all of it inside the engine's own 32-token prefix
    assert sc.get_num_new_matched_tokens(req, 32) == (0, False)
    assert lk.canceled == ["a#1"], "its pins go at once"
    calls = len(lk.calls)
    for _ in range(5):  # waiting for room, asked every step
        assert sc.get_num_new_matched_tokens(req, 32) == (0, False)
    assert len(lk.calls) == calls, "no new lookup while the engine's prefix covers the answer"
    # the engine's prefix shrank below the answer (its blocks were evicted): worth asking again
    assert sc.get_num_new_matched_tokens(req, 16) == (None, False)
    assert lk.calls[-1]["id"] == "a#2"


class RankClient:
    def __init__(self, answer: int, details: LookupDetails) -> None:
        self.answer, self.details, self.calls = answer, details, []

    def lookup(self, lookup_id, hashes, counts, namespaces, compute_tokens_per_s=None, timeout_ms=None):
        self.calls.append((lookup_id, compute_tokens_per_s, timeout_ms))
        return self.answer

    def lookup_details(self, lookup_id):
        return self.details

    def cancel(self, lookup_id):
        pass


def test_rank_lookup_gives_the_rank_whose_rule_admitted_least():
    generous = RankClient(64, cpu_then_disk(32, 32, "load"))
    strict = RankClient(64, cpu_then_disk(32, 32, "decline"))
    rl = RankLookup([(generous, b"\1" * 16, "@r0"), (strict, b"\2" * 16, "@r1")])
    sc = SchedulerConnector(rl, BLOCK, CHUNK, prefill_tokens_per_s=5000)
    assert sc.get_num_new_matched_tokens(prompt("a", 70), 0) == (32, True)
    assert generous.calls == [("a#1@r0", 5000, lookup_wait_ms(64, 5000))]
    assert strict.calls == [("a#1@r1", 5000, lookup_wait_ms(64, 5000))]


@pytest.mark.parametrize("value,want", [("auto", "auto"), ("off", "off"), (12000, 12000.0), ("2.5e4", 25000.0)])
def test_prefill_tokens_per_s_setting(value, want):
    assert KvtierConfig.from_extra({"prefill_tokens_per_s": value}).prefill_tokens_per_s == want
    assert KvtierConfig().prefill_tokens_per_s == "auto"


@pytest.mark.parametrize("bad", [0, -1, True, "fast", None, float("inf")])
def test_bad_prefill_tokens_per_s_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match="prefill_tokens_per_s"):
        KvtierConfig.from_extra({"prefill_tokens_per_s": bad})
    with pytest.raises(InvalidArgumentError, match="prefill_tokens_per_s"):
        SchedulerConnector(RateLookup(), BLOCK, CHUNK, prefill_tokens_per_s=bad if bad is not None else "x")


def test_a_loads_deadline_is_the_time_computing_its_tokens_takes():
    from kvtier_vllm.scheduler import LOAD_DEADLINE_FLOOR_MS

    lk = RateLookup()
    sc = SchedulerConnector(lk, BLOCK, CHUNK, prefill_tokens_per_s=10)  # 10 tokens/s: 48 tokens in 4.8 s
    req = prompt("a", 70)
    sc.get_num_new_matched_tokens(req, 16)
    lk.answers["a#1"] = 64
    assert sc.get_num_new_matched_tokens(req, 16) == (48, True)
    sc.update_state_after_alloc(req, list(range(18)), 48)
    (load,) = sc.build_connector_meta().loads
    assert load.deadline_ms == 4800
    fast = SchedulerConnector(RateLookup(), BLOCK, CHUNK, prefill_tokens_per_s=1e9)
    fast._lookup.answers["b#1"] = 64
    b = prompt("b", 70)
    fast.get_num_new_matched_tokens(b, 0)
    fast.update_state_after_alloc(b, list(range(18)), 64)
    assert fast.build_connector_meta().loads[0].deadline_ms == LOAD_DEADLINE_FLOOR_MS, "never below the floor"
    off = SchedulerConnector(RateLookup(), BLOCK, CHUNK)
    off._lookup.answers["c#1"] = 64
    c = prompt("c", 70)
    off.get_num_new_matched_tokens(c, 0)
    off.update_state_after_alloc(c, list(range(18)), 64)
    assert off.build_connector_meta().loads[0].deadline_ms == 0, "no rate: the workers' load_timeout_ms"
