"""Scheduler side of the kvtier connector (vLLM ``KVConnectorBase_V1``, scheduler role).

Mirrors ``src/connector/scheduler-connector.ts`` (docs/connector.md): pure bookkeeping over a
non-blocking lookup client (:class:`kvtier_vllm.client.KvtierClient`, or a
:class:`~kvtier_vllm.client.MultiLookupClient` over one sidecar per rank). No method waits for
I/O. Claims are whole chunks (kvtier stores and loads whole chunks), never the last prompt token,
and only beyond what the engine's own prefix cache computed; when that prefix ends inside a stored
chunk (block-aligned, not chunk-aligned), the rest of that chunk is claimed and the LOAD skips the
blocks the engine already has (``skip_blocks``). vLLM-free: the adapter in
:mod:`kvtier_vllm.connector` converts vLLM's objects.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from .connector_types import (
    ConnectorMeta,
    ConnectorOutput,
    ConnectorRequest,
    LoadIntent,
    RequestEnd,
    SaveIntent,
    ScheduledRequest,
)
from ._validate import require_int as _int
from .errors import ClosedError, InvalidArgumentError
from .handoff import HandoffRole
from .hashing import hash_chunks
from .lookup_rule import StepClock, admitted_tokens, lookup_wait_ms, worth_a_step

__all__ = ["SchedulerConnector"]

_log = logging.getLogger("kvtier_vllm.scheduler")

#: Loads failing in a row (no load succeeding in between) after which offers pause.
LOAD_FAILURES_BEFORE_PAUSE = 2
#: With a prefill rate, a LOAD's deadline is the time computing its tokens takes, at least this.
LOAD_DEADLINE_FLOOR_MS = 1000
#: The first pause, doubled for every further failure in a row, up to the longest.
FIRST_PAUSE_S = 1.0
LONGEST_PAUSE_S = 60.0


@dataclass
class _Offer:
    num_computed: int
    tokens: int


@dataclass
class _Tracked:
    request_id: str
    prompt_length: int
    #: Hashes of the prompt's full chunks.
    hashes: list
    attempt: int = 0
    lookup_id: str = ""
    #: none | pending | answered | covered | consumed. ``covered``: answered with every hit
    #: inside the engine's own prefix; its pins released and its number kept, so a request
    #: waiting to be admitted does not look up again every other step (losing its place while
    #: each new lookup is pending). A new lookup is made once the prefix no longer covers it.
    lookup: str = "none"
    hit_tokens: int = 0
    offered: _Offer | None = None
    intent: LoadIntent | None = None
    loading: LoadIntent | None = None
    stored_chunks: int = 0
    saved_any: bool = False
    #: First chunk a load of this request failed at: never offered to it again.
    failed_chunk: int | None = None
    #: An answer kept across a preemption: its pins go once the new lookup answered.
    stale_lookup_id: str = ""
    #: The engine allocated blocks for the request since its last ask (an ask after that is a
    #: new admission: after a preemption or a failed load).
    admitted: bool = False
    #: Leading chunks a producer engine saved for this request (its ``kv_transfer_params``): its
    #: lookups wait for them (disaggregated prefill); 0: a plain lookup.
    await_chunks: int = 0
    #: The request's transfer parameters were read (once per request).
    params_read: bool = False
    #: The lookup attempt last counted as awaited.
    attempt_awaited: int = 0




class SchedulerConnector:
    """Scheduler-side connector.

    :param lookup: owned (``close()`` closes it when it has ``close``): an object with
        ``lookup(lookup_id, hashes, token_counts[, namespaces]) -> int | None`` that never blocks,
        ``forget(lookup_id)`` and ``cancel(lookup_id)``.
    :param block_size: engine block size in tokens.
    :param chunk_size: tokens per stored chunk, a multiple of ``block_size`` (must match the
        workers' registration); default 256.
    :param salt: default cache salt of requests that carry none.
    :param namespaces: namespace ids (16 bytes each) every lookup names — one per rank this
        sidecar hosts, derived with :func:`kvtier_vllm.namespace.derive_namespace`; None when the
        lookup client knows its own (a ``MultiLookupClient``).
    :param clock: monotonic seconds (the pause after failed loads, the engine's steps; tests
        inject one).
    :param prefill_tokens_per_s: the engine's prefill rate for "never slower than recomputing"
        (docs/vllm.md): a positive number (tokens/s), ``"auto"`` (learned from the engine's
        steps, see :class:`~.lookup_rule.StepClock`; until then the rule is off) or None (off:
        every hit is claimed, a lookup waits up to the client's ``lookup_timeout_ms``). With a
        rate, every lookup names it, so the sidecar claims a tier below host memory only where
        fetching beats computing; a lookup gets at most the time computing its claimable tokens
        takes; only what the sidecar's rule admitted is claimed; and a pending lookup holds a
        request back a step only when computing what it could claim takes longer than that step
        (else the request computes if admitted now; asked again before that, the answer counts).
    :param handoff: disaggregated prefill (:mod:`~.handoff`): on a producer, finished requests
        name what they saved; on a consumer, requests whose ``kv_transfer_params`` name a
        producer's save wait for it. None: neither.
    :param layerwise_loads: offer hits as synchronous loads (vLLM's ``load_kv_async`` False):
        the request is scheduled in the step that loads, and its forward pass waits for each
        layer in ``wait_for_layer_load`` while the later layers land. Default: asynchronous loads
        (the request waits a step or more and computes with every layer in place).
    :raises InvalidArgumentError: on bad options.

    Loads that fail are not offered again: a request whose load failed is never offered the
    chunks from the failed one on, and after :data:`LOAD_FAILURES_BEFORE_PAUSE` failed loads
    in a row (a worker that cannot load, e.g. its registration failed) no load is offered for
    :data:`FIRST_PAUSE_S`, doubling with every further failure up to :data:`LONGEST_PAUSE_S`;
    a load that succeeds ends the pause. Requests then compute, so a kvtier that cannot load
    costs time, never a request that does not finish.
    """

    def __init__(
        self,
        lookup: Any,
        block_size: int,
        chunk_size: int = 256,
        salt: str = "",
        namespaces: Sequence[bytes] | None = None,
        clock: Callable[[], float] = time.monotonic,
        prefill_tokens_per_s: float | str | None = None,
        handoff: HandoffRole | None = None,
        layerwise_loads: bool = False,
    ) -> None:
        if not callable(getattr(lookup, "lookup", None)):
            raise InvalidArgumentError("lookup must be a KvtierClient or MultiLookupClient")
        self._lookup = lookup
        self._block = _int("block_size", block_size, 1, 1 << 20)
        self._chunk = _int("chunk_size", chunk_size, 1, 1 << 20)
        if self._chunk % self._block:
            raise InvalidArgumentError(f"chunk_size must be a multiple of block_size ({self._block}), got {self._chunk}")
        self._bpc = self._chunk // self._block
        if not isinstance(salt, str):
            raise InvalidArgumentError(f"salt must be a string, got {salt!r}")
        self._salt = salt
        self._namespaces = None if namespaces is None else [bytes(n) for n in namespaces]
        self._requests: dict[str, _Tracked] = {}
        self._ended: list[RequestEnd] = []
        self._closed = False
        self._clock = clock
        self._failures_in_a_row = 0
        self._paused_until = 0.0
        self._fixed_rate: float | None = None
        self._steps: StepClock | None = None
        if prefill_tokens_per_s == "auto":
            self._steps = StepClock(self._chunk, clock)
        elif prefill_tokens_per_s is not None:
            r = prefill_tokens_per_s
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r < float("inf"):
                raise InvalidArgumentError(
                    f"prefill_tokens_per_s must be a positive number of tokens/s, 'auto' or None, got {r!r}"
                )
            self._fixed_rate = float(r)
        self._details = callable(getattr(lookup, "lookup_details", None))
        #: Requests the last step scheduled (the step a waiting request would wait for).
        self._running: set[str] = set()
        self._rule = {"declined_tokens": 0, "computed_instead": 0, "lookups_bounded": 0}
        self._handoff = handoff
        self._handoffs = {"awaited": 0, "refused_params": 0, "params_sent": 0}
        if not isinstance(layerwise_loads, bool):
            raise InvalidArgumentError(f"layerwise_loads must be true or false, got {layerwise_loads!r}")
        self._layerwise = layerwise_loads

    @property
    def block_size(self) -> int:
        return self._block

    @property
    def chunk_size(self) -> int:
        return self._chunk

    @property
    def tracked_requests(self) -> int:
        """Requests the connector currently tracks (gauges and leak checks)."""
        return len(self._requests)

    @property
    def sidecar_reachable(self) -> bool:
        """False while the lookup client counts a sidecar as down (its lookups answer 0 at
        once); True when it cannot tell."""
        return bool(getattr(self._lookup, "reachable", True))

    def chunk_hashes(self, request_id: str) -> list[bytes]:
        """The kvtier hashes of a tracked request's full prompt chunks (empty when untracked)."""
        t = self._requests.get(request_id)
        return [] if t is None else list(t.hashes)

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """The rate the rule uses now (configured or learned); None while it is off."""
        if self._fixed_rate is not None:
            return self._fixed_rate
        return None if self._steps is None else self._steps.tokens_per_s

    def rule_stats(self) -> dict:
        """What "never slower than recomputing" did: ``lookups_bounded`` (lookups sent with the
        rate and a deadline from it), ``declined_tokens`` (hits the sidecar's rule did not admit),
        ``computed_instead`` (asks answered 0 because waiting a step for the pending lookup could
        not beat computing)."""
        return dict(self._rule)

    def handoff_stats(self) -> dict:
        """Disaggregated prefill: ``params_sent`` (a producer's finished requests that named
        what they saved), ``awaited`` (a consumer's lookups that waited for a producer's save),
        ``refused_params`` (transfer parameters refused: malformed, another model or prompt, an
        unlisted producer; those requests looked up plainly)."""
        return dict(self._handoffs)

    def engine_step(self, tokens: int, request_ids: Iterable[str] = ()) -> None:
        """The engine scheduled a step of ``tokens`` tokens for ``request_ids`` (from vLLM's
        ``SchedulerOutput``; the adapter calls it before :meth:`build_connector_meta`): its pace
        for the learned rate, and which requests run (a request waiting for a lookup waits for
        their step)."""
        self._running = set(request_ids)
        if self._steps is not None:
            self._steps.step(_int("tokens", tokens))

    def _step_ms(self, request_id: str) -> float:
        """What a request asked now waits before it is asked again: the engine's last step while
        other requests run, 0 while it is idle (it steps again at once)."""
        if self._steps is None or not (self._running - {request_id}):
            return 0.0
        return self._steps.step_ms

    @property
    def offers_paused(self) -> bool:
        """True while loads are not offered after failed loads in a row (see the class)."""
        return self._clock() < self._paused_until

    # ------------------------------------------------------------------ vLLM hooks

    def get_num_new_matched_tokens(
        self, request: ConnectorRequest, num_computed_tokens: int, transfer_params: Any = None
    ) -> tuple[int | None, bool]:
        """vLLM ``get_num_new_matched_tokens``: ``(None, False)`` while the lookup is pending
        ("ask again next step"), else the tokens kvtier can load beyond ``num_computed_tokens`` and
        whether the load is async (when tokens > 0: always, unless ``layerwise_loads``).
        ``transfer_params``: the request's ``kv_transfer_params`` (a consumer engine's request
        carries what the producer's :meth:`request_finished` named; its lookups then wait for
        those chunks, up to the handoff's bound). Bad parameters are logged and ignored.

        :raises InvalidArgumentError: for a bad request or count. :raises ClosedError:
        """
        self._open()
        t = self._track(request)
        if not t.params_read:
            t.params_read = True
            if transfer_params is not None and self._handoff is not None:
                n = self._handoff.awaited_chunks(transfer_params, t.request_id, t.hashes)
                if n is None:
                    self._handoffs["refused_params"] += 1
                else:
                    t.await_chunks = n
        computed = _int("num_computed_tokens", num_computed_tokens)
        if t.admitted and t.loading is None and t.intent is None:
            # Asked again after it was admitted: preempted (the engine may ask before it tells
            # build_connector_meta) or recomputing after a failed load. Look up afresh.
            self._renew_lookup(t)
        t.offered = None
        lookup_chunks = self._lookup_chunks(t)
        if t.failed_chunk is not None:
            lookup_chunks = min(lookup_chunks, t.failed_chunk)
        # A local prefix that ends inside a block cannot be extended by block-granular loads.
        if computed % self._block or computed >= lookup_chunks * self._chunk or self.offers_paused:
            self._release_lookup(t)
            return 0, False
        if t.lookup == "covered" and self._claim(t, lookup_chunks) > computed:
            t.lookup = "none"  # the engine's prefix no longer covers the answer: ask afresh
        if t.lookup in ("none", "consumed"):
            t.attempt += 1
            t.lookup_id = f"{t.request_id}#{t.attempt}"
            t.lookup = "pending"
            if self._details and self.prefill_tokens_per_s is not None:
                self._rule["lookups_bounded"] += 1
        if t.lookup == "pending":
            rate = self.prefill_tokens_per_s
            claimable = lookup_chunks * self._chunk - computed
            answer = self._ask(t, lookup_chunks, claimable, rate)
            if answer is None:
                if self._awaits(t, lookup_chunks):
                    return None, False  # the producer's save is what this request waits for
                if rate is None or worth_a_step(claimable, rate, self._step_ms(t.request_id)):
                    return None, False
                # Computing what it could claim takes less than the step it would wait: it
                # computes if admitted now; the lookup goes on for an ask before that.
                self._rule["computed_instead"] += 1
                return 0, False
            t.lookup = "answered"
            t.hit_tokens = int(answer)
            self._drop_stale_lookup(t)
            t.stored_chunks = max(t.stored_chunks, t.hit_tokens // self._chunk)
            _log.debug("lookup answered: request %s, %d tokens", t.request_id, t.hit_tokens)
        claim = self._claim(t, lookup_chunks)
        tokens = claim - computed if claim > computed else 0
        if tokens == 0:
            if t.hit_tokens > 0 and t.lookup == "answered":
                self._release_lookup(t)  # nothing to load: the pins would only wait for their TTL
                t.lookup = "covered"
            return 0, False
        t.offered = _Offer(computed, tokens)
        return tokens, not self._layerwise

    def update_state_after_alloc(self, request: ConnectorRequest, block_ids: Sequence[int], num_external_tokens: int) -> None:
        """vLLM ``update_state_after_alloc``: records which blocks receive which chunks.
        ``block_ids`` is the request's whole block table; ``num_external_tokens`` what
        :meth:`get_num_new_matched_tokens` returned (0 clears the intent). A second call for the
        same request replaces the first.

        :raises InvalidArgumentError: when the tokens were not offered or the table is too short.
        """
        self._open()
        tokens = _int("num_external_tokens", num_external_tokens)
        rid = getattr(request, "request_id", None)
        t = self._requests.get(rid)
        if t is not None:
            t.admitted = True
        if tokens == 0:
            if t is not None:
                t.intent = None
                # Admitted with nothing to load: a lookup in flight or its pins are not wanted.
                if t.lookup in ("pending", "answered"):
                    self._release_lookup(t)
            return
        offered = None if t is None else t.offered
        if offered is None or tokens > offered.tokens or (offered.num_computed + tokens) % self._chunk:
            raise InvalidArgumentError(
                f"update_state_after_alloc: {tokens} external tokens for request {rid} were not offered "
                f"(offered {0 if offered is None else offered.tokens}; loads end on a chunk boundary of {self._chunk})"
            )
        first = offered.num_computed // self._chunk
        skip = (offered.num_computed % self._chunk) // self._block
        end = (offered.num_computed + tokens) // self._chunk
        table = list(block_ids)
        if len(table) < end * self._bpc:
            raise InvalidArgumentError(
                f"update_state_after_alloc: chunks {first}..{end - 1} need {end * self._bpc} blocks in the table, got {len(table)}"
            )
        t.intent = LoadIntent(
            request_id=t.request_id,
            lookup_id=t.lookup_id,
            first_chunk=first,
            num_tokens=tokens,
            block_ids=tuple(table[first * self._bpc + skip : end * self._bpc]),
            chunk_hashes=b"".join(t.hashes[first:end]),
            skip_blocks=skip,
            deadline_ms=self._load_deadline_ms(tokens),
            layerwise=self._layerwise,
        )

    def build_connector_meta(self, scheduled: Iterable[ScheduledRequest] = ()) -> ConnectorMeta:
        """vLLM ``build_connector_meta``: the loads recorded since the last call, the saves of
        full prompt chunks that this step completes (chunks kvtier holds are skipped), and the
        requests that ended. Each item appears in exactly one metadata.
        """
        self._open()
        # One socket check per step even when no request asks: expires deadlines and lets a
        # sidecar that was down be probed and found back.
        poll = getattr(self._lookup, "poll", None)
        if callable(poll):
            poll()
        loads: list[LoadIntent] = []
        for t in self._requests.values():
            if t.intent is None:
                continue
            loads.append(t.intent)
            t.loading, t.intent = t.intent, None
            t.lookup = "consumed"  # the load consumes the lookup's pins; a later ask needs a new lookup
            t.stored_chunks = max(t.stored_chunks, t.loading.first_chunk + self._chunks_of(t.loading))
        saves: list[SaveIntent] = []
        for i, s in enumerate(scheduled):
            t = self._track(s.request)
            computed = _int(f"scheduled[{i}].num_computed_tokens", s.num_computed_tokens) + _int(
                f"scheduled[{i}].num_scheduled_tokens", s.num_scheduled_tokens
            )
            blocks = list(s.block_ids or ())
            full = min(len(t.hashes), min(computed, t.prompt_length) // self._chunk, len(blocks) // self._bpc)
            if full <= t.stored_chunks:
                continue
            bpc = self._bpc
            saves.append(
                SaveIntent(
                    request_id=t.request_id,
                    first_chunk=t.stored_chunks,
                    block_ids=tuple(blocks[t.stored_chunks * bpc : full * bpc]),
                    chunk_hashes=b"".join(t.hashes[t.stored_chunks : full]),
                )
            )
            t.stored_chunks = full
            t.saved_any = True
        finished, self._ended = self._ended, []
        return ConnectorMeta(tuple(loads), tuple(saves), tuple(finished))

    def update_connector_output(self, output: ConnectorOutput | Any) -> None:
        """vLLM ``update_connector_output``: settles loads reported in ``finished_recving``; a
        failed load's chunks (from the first invalid block on) count as not stored, so they are
        saved again once the engine recomputes them, and are never offered to that request again.
        Loads failing in a row pause all offers (see the class)."""
        invalid = set(getattr(output, "invalid_block_ids", None) or ())
        done = set(getattr(output, "finished_recving", None) or ())
        for t in self._requests.values():
            load = t.loading
            if load is None:
                continue
            if invalid:
                at = next((i for i, b in enumerate(load.block_ids) if b in invalid), -1)
                if at >= 0:
                    chunk = load.first_chunk + (at + load.skip_blocks) // self._bpc
                    t.stored_chunks = min(t.stored_chunks, chunk)
                    t.failed_chunk = chunk if t.failed_chunk is None else min(t.failed_chunk, chunk)
            # A layer-wise load ends with the step that ran it: this output is that step's.
            if t.request_id in done or load.layerwise:
                t.loading = None
                self._load_settled(failed=any(b in invalid for b in load.block_ids))

    def _load_settled(self, failed: bool) -> None:
        if not failed:
            self._failures_in_a_row = 0
            self._paused_until = 0.0
            return
        self._failures_in_a_row += 1
        over = self._failures_in_a_row - LOAD_FAILURES_BEFORE_PAUSE
        if over >= 0:
            pause = min(LONGEST_PAUSE_S, FIRST_PAUSE_S * (2 ** min(over, 16)))
            self._paused_until = self._clock() + pause
            _log.warning(
                "kvtier: %d loads failed in a row; no loads are offered for %.0f s (requests compute)",
                self._failures_in_a_row,
                pause,
            )

    def request_finished(self, request: ConnectorRequest | Any, block_ids: Sequence[int] | None = None) -> tuple[bool, dict | None]:
        """vLLM ``request_finished`` (terminal free: finished or aborted). Cancels a pending
        lookup, releases unused pins, drops an unsent load and queues the release for the
        workers. Returns ``(delay_free, None)``: ``delay_free`` when saves may still read the
        blocks (the engine then frees them when a worker reports the id in
        ``finished_sending``). Never for a request whose load is in flight: vLLM itself keeps
        the blocks of a request aborted while loading until ``finished_recving`` names it, and
        frees them then; a delayed free as well would name a request vLLM already dropped. (A
        loading request has no saves in flight: its earlier blocks were freed at preemption,
        after ``handle_preemptions`` waited for their saves.) The parameters are None, except on a
        producer engine (``handoff`` that produces): a finished request that saved chunks names
        them (:meth:`~.handoff.HandoffRole.params`), for vLLM's proxy to pass to the consumer."""
        t = self._requests.pop(getattr(request, "request_id", None), None)
        if t is None:
            return False, None
        self._running.discard(t.request_id)
        self._release_lookup(t)
        t.intent = None
        delay = t.saved_any and t.loading is None
        kind = "aborted" if getattr(request, "aborted", False) else "finished"
        self._ended.append(RequestEnd(t.request_id, kind, delay))
        params = None
        if self._handoff is not None and self._handoff.produces and kind == "finished" and t.stored_chunks > 0:
            params = self._handoff.params(t.request_id, t.hashes[: t.stored_chunks])
            self._handoffs["params_sent"] += 1
        return delay, params

    def request_preempted(self, request: ConnectorRequest | Any) -> None:
        """Preemption (the engine frees the blocks and requeues the request): the next ask looks
        up afresh — the request's own chunks saved since its last answer count too. The old
        answer's pins stay until the new one is in, then are released. An unsent load is dropped
        (its blocks are gone). Workers get the id so they can finish saves that read those
        blocks."""
        rid = request if isinstance(request, str) else getattr(request, "request_id", None)
        t = self._requests.get(rid)
        if t is None:
            return
        t.intent = None
        t.offered = None
        # What kvtier holds of it is what the next lookup finds: a save cancelled by the
        # preemption is made again when the request computes those chunks again.
        t.stored_chunks = 0
        self._renew_lookup(t)
        self._ended.append(RequestEnd(t.request_id, "preempted", False))

    def saves_failed(self, request_id: str, first_chunk: int) -> None:
        """The workers report that a save of this request did not happen from ``first_chunk``
        on (failed, timed out, cancelled): while the request runs, the next metadata saves those
        chunks again from its blocks. Unknown (ended) requests: nothing."""
        t = self._requests.get(request_id)
        if t is not None and first_chunk < t.stored_chunks:
            t.stored_chunks = int(first_chunk)

    def reset_cache(self) -> bool:
        """vLLM ``reset_cache`` / ``reset_prefix_cache``: forgets cached lookup answers (releasing
        their pins) so waiting requests look up afresh. Recorded or running loads are kept."""
        for t in self._requests.values():
            if t.intent is not None or t.loading is not None:
                continue
            self._release_lookup(t)
            t.offered = None
        return True

    def close(self) -> None:
        """Releases what it tracks and closes the lookup client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for t in self._requests.values():
            self._release_lookup(t)
        self._requests.clear()
        self._ended = []
        close = getattr(self._lookup, "close", None)
        if callable(close):
            close()

    # ------------------------------------------------------------------ internals

    def _open(self) -> None:
        if self._closed:
            raise ClosedError("scheduler connector is closed")

    def _track(self, request: ConnectorRequest | Any) -> _Tracked:
        rid = getattr(request, "request_id", None)
        if not isinstance(rid, str) or not rid:
            raise InvalidArgumentError(f"request.request_id must be a non-empty string, got {rid!r}")
        t = self._requests.get(rid)
        if t is not None:
            return t
        tokens = getattr(request, "prompt_token_ids", None)
        if tokens is None:
            tokens = ()  # e.g. prompt embeddings: nothing kvtier can key
        salt = getattr(request, "cache_salt", None)
        chunks = hash_chunks(
            tokens,
            chunk_size=self._chunk,
            salt=self._salt if salt is None else salt,
            lora=getattr(request, "lora", None) or None,
            mm=list(getattr(request, "mm", ()) or ()) or None,
        )
        t = _Tracked(rid, len(tokens), [c.hash for c in chunks])
        self._requests[rid] = t
        return t

    def _lookup_chunks(self, t: _Tracked) -> int:
        """Full chunks that end before the last prompt token (which the engine always computes)."""
        return min(len(t.hashes), max(0, t.prompt_length - 1) // self._chunk)

    def _load_deadline_ms(self, tokens: int) -> int:
        """A load may take as long as computing its tokens would (at least
        :data:`LOAD_DEADLINE_FLOOR_MS`); 0 (the workers' ``load_timeout_ms``) without a rate."""
        rate = self.prefill_tokens_per_s
        return 0 if rate is None else max(LOAD_DEADLINE_FLOOR_MS, lookup_wait_ms(tokens, rate))

    def _claim(self, t: _Tracked, lookup_chunks: int) -> int:
        """Tokens the last answer lets the request claim from its start: whole chunks, never the
        last prompt token."""
        claim = min(t.hit_tokens, t.prompt_length - 1, lookup_chunks * self._chunk)
        claim -= claim % self._block
        return claim - claim % self._chunk

    def _ask(self, t: _Tracked, lookup_chunks: int, claimable: int, rate: float | None) -> int | None:
        """The request's lookup (non-blocking): None while pending, else the hit tokens, or with
        a rate, what the sidecar's rule admitted, the wait bounded by the time computing the
        ``claimable`` tokens takes."""
        hashes = b"".join(t.hashes[:lookup_chunks])
        counts = [self._chunk] * lookup_chunks
        args: tuple = (t.lookup_id, hashes, counts) if self._namespaces is None else (
            t.lookup_id, hashes, counts, self._namespaces)
        if self._awaits(t, lookup_chunks):
            # A producer saved these chunks: wait for them rather than weigh computing them.
            assert self._handoff is not None
            if t.attempt_awaited != t.attempt:
                t.attempt_awaited = t.attempt
                self._handoffs["awaited"] += 1
            return self._lookup.lookup(
                *args, await_chunks=min(t.await_chunks, lookup_chunks), await_ms=self._handoff.wait_ms
            )
        if rate is None or not self._details:
            return self._lookup.lookup(*args)
        answer = self._lookup.lookup(
            *args, compute_tokens_per_s=rate, timeout_ms=lookup_wait_ms(max(1, claimable), rate)
        )
        if answer is None:
            return None
        details = self._lookup.lookup_details(t.lookup_id)
        if details is None:
            return int(answer)
        admitted = min(int(answer), admitted_tokens(details))
        self._rule["declined_tokens"] += int(answer) - admitted
        return admitted

    def _awaits(self, t: _Tracked, lookup_chunks: int) -> bool:
        """Whether the request's lookup waits for a producer's save."""
        return t.await_chunks > 0 and lookup_chunks > 0 and self._handoff is not None and self._handoff.wait_ms > 0

    def _chunks_of(self, intent: LoadIntent) -> int:
        return (len(intent.block_ids) + intent.skip_blocks) // self._bpc

    def _renew_lookup(self, t: _Tracked) -> None:
        """The next ask starts a new lookup; an answer's pins stay until that one is in."""
        t.admitted = False
        if t.lookup == "covered":
            t.lookup = "none"
        if t.lookup == "answered":
            self._drop_stale_lookup(t)
            if t.hit_tokens > 0:
                t.stale_lookup_id = t.lookup_id
            t.lookup = "none"

    def _drop_stale_lookup(self, t: _Tracked) -> None:
        if t.stale_lookup_id:
            stale, t.stale_lookup_id = t.stale_lookup_id, ""
            try:
                self._lookup.cancel(stale)
            except Exception as err:  # the pin TTL releases it
                _log.debug("cancel of %s failed: %s", stale, err)

    def _release_lookup(self, t: _Tracked) -> None:
        self._drop_stale_lookup(t)
        try:
            if t.lookup == "pending":
                self._lookup.forget(t.lookup_id)
            elif t.lookup == "answered" and t.hit_tokens > 0:
                self._lookup.cancel(t.lookup_id)
        except Exception as err:  # a lost CANCEL only leaves pins to their TTL
            _log.debug("lookup release failed for %s (the pin TTL releases it): %s", t.lookup_id, err)
        if t.lookup in ("pending", "answered"):
            t.lookup = "consumed"
