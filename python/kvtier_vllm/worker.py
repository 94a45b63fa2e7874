"""Worker side of the kvtier connector (vLLM ``KVConnectorBase_V1``, worker role).

Mirrors ``src/connector/worker-connector.ts`` (docs/connector.md). Loads start in
:meth:`WorkerConnector.start_load_kv` and saves in :meth:`WorkerConnector.wait_for_save`; neither
waits for the sidecar, so the forward pass is never held. Replies are collected without blocking
whenever the engine calls in (``get_finished`` once per step), and completions surface through
:meth:`~WorkerConnector.get_finished` and :meth:`~WorkerConnector.get_block_ids_with_load_errors`.

Failure never hangs the engine: every request has the client's deadline; a load that fails or
times out (sidecar down, pins gone, engine unknown after a sidecar restart) reports all its
blocks invalid (the engine recomputes them), a save that fails is dropped (a future miss).

Every SAVE and LOAD carries a not-after time on the host's monotonic clock (docs/protocol.md
4.9): a SAVE's is its reply deadline, a LOAD's its server deadline. The sidecar copies nothing
out of the blocks past a SAVE's and starts no chunk of a LOAD past its. When a transfer gets no
reply (the sidecar froze or went down), its blocks are kept until that time has passed (for a
LOAD, :data:`LOAD_GRACE_S` more, for a chunk copy under way), so a sidecar that reads the
request late never copies blocks the engine has reused. A transfer the sidecar answered, even
with an error, is settled at once.

With a sidecar that takes save fences (its PONG lists ``saveFence``) every SAVE holds a slot of
the worker's state file (:mod:`kvtier_vllm.save_fence`) and can be cancelled at once instead:
:meth:`~WorkerConnector.handle_preemptions` waits at most ``preemption_wait_s`` for the saves of
preempted requests and cancels the rest, and a SAVE unanswered after ``save_timeout_s`` is
cancelled, so a frozen sidecar holds no step and a finished request's blocks for no longer than
that. A save that failed, timed out or was cancelled this way (not one the sidecar dropped for
want of room) is reported by :meth:`~WorkerConnector.take_failed_saves`, so that the scheduler
saves those chunks again while the engine still has them. A
daemon thread with its **own** client (zmq sockets are not thread-safe) sends HEARTBEAT when the
worker has been silent for ``heartbeat_interval_s`` and registers again when the sidecar no longer
knows the engine (after a restart). :meth:`~WorkerConnector.close` sends UNREGISTER.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .connector_types import ConnectorMeta, LoadIntent, SaveIntent
from .errors import ClosedError, ConfigError, InvalidArgumentError, NotFoundError, RequestTimeoutError
from .save_fence import SaveFences

__all__ = ["WorkerConnector", "WorkerStats", "LOAD_GRACE_S", "PREEMPTION_WAIT_S", "SAVE_TIMEOUT_S"]

_log = logging.getLogger("kvtier_vllm.worker")

#: How long past a LOAD's not-after time its blocks are kept when no reply came: a chunk copy
#: the sidecar started just before that time completes within it.
LOAD_GRACE_S = 1.0
#: The sidecar's LOAD deadline when the worker names none (docs/protocol.md 4.9).
_DEFAULT_LOAD_DEADLINE_MS = 20_000  # the sidecar's default LOAD deadline
#: With save fences: how long ``handle_preemptions`` waits for a preempted request's saves
#: before it cancels them (the engine step's bound on what kvtier costs it).
PREEMPTION_WAIT_S = 0.025
#: With save fences: a SAVE still unanswered after this long is cancelled (its blocks go back).
SAVE_TIMEOUT_S = 1.0


@dataclass
class WorkerStats:
    """Counters since the worker connector started."""

    loads_started: int = 0
    loads_failed: int = 0
    saves_started: int = 0
    saves_failed: int = 0
    chunks_saved: int = 0
    chunks_dropped: int = 0
    registrations: int = 0
    #: SAVEs cancelled through their fence (preempted, past ``save_timeout_s``, shutdown).
    saves_cancelled: int = 0
    #: Layer-wise LOADs sent, and ``wait_for_layer_load`` calls that had one of them to wait for.
    layerwise_loads: int = 0
    layerwise_waits: int = 0


@dataclass
class _Transfer:
    kind: str  # 'load' | 'save'
    request_id: str
    pending: Any  # client Pending, or None when the send itself failed
    intent: Any
    #: Monotonic seconds before which the blocks are kept if no reply comes (see the module).
    hold_until: float = 0.0
    #: A fenced SAVE's ``(slot, ticket)``: it can be cancelled without waiting.
    fence: tuple[int, int] | None = None
    #: Monotonic seconds when it was sent.
    started: float = 0.0
    #: The worker's count of sidecar restarts seen when it was sent.
    generation: int = 0
    #: A layer-wise LOAD's progress word in the state file (None: it waits for the reply).
    progress_slot: int | None = None
    #: Settled (its reply taken).
    done: bool = False
    #: A layer-wise load past its deadline whose blocks were reported invalid before it settled.
    gave_up: bool = False


class WorkerConnector:
    """Worker-side connector over one :class:`~kvtier_vllm.client.KvtierClient`.

    :param client: owned; used from the engine's thread only.
    :param load_timeout_ms: server deadline of each load (chunks not started by then are
        invalid); 0 = the server's default.
    :param lookup_suffix: appended to every load's lookup id (this rank's suffix, see
        :mod:`kvtier_vllm.rank_lookup`).
    :param heartbeat_client_factory: makes the heartbeat thread's own client; None: no thread.
    :param heartbeat_interval_s: silence after which the thread sends HEARTBEAT.
    :param save_fences: the worker's state file (owned: closed by :meth:`close`), registered by
        the caller as the registration's ``stateFile``; None: SAVEs are never fenced.
    :param preemption_wait_s: with fences, the longest ``handle_preemptions`` waits.
    :param save_timeout_s: with fences, how long a SAVE may go unanswered before it is cancelled.
    :param clock: monotonic seconds (tests inject one).
    """

    def __init__(
        self,
        client: Any,
        *,
        load_timeout_ms: int = 0,
        lookup_suffix: str = "",
        heartbeat_client_factory: Callable[[], Any] | None = None,
        heartbeat_interval_s: float = 5.0,
        save_fences: SaveFences | None = None,
        preemption_wait_s: float = PREEMPTION_WAIT_S,
        save_timeout_s: float = SAVE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not callable(getattr(client, "send_load", None)):
            raise InvalidArgumentError("client must be a KvtierClient")
        if not isinstance(load_timeout_ms, int) or load_timeout_ms < 0:
            raise InvalidArgumentError(f"load_timeout_ms must be an integer >= 0, got {load_timeout_ms!r}")
        if not heartbeat_interval_s > 0:
            raise InvalidArgumentError(f"heartbeat_interval_s must be > 0, got {heartbeat_interval_s!r}")
        self._client = client
        self._load_timeout_ms = load_timeout_ms
        self._suffix = lookup_suffix
        self._hb_factory = heartbeat_client_factory
        self._hb_interval = float(heartbeat_interval_s)
        if not preemption_wait_s >= 0 or not save_timeout_s > 0:
            raise InvalidArgumentError(
                f"preemption_wait_s must be >= 0 and save_timeout_s > 0, got {preemption_wait_s!r}, {save_timeout_s!r}"
            )
        self._fences = save_fences
        self._preemption_wait_s = float(preemption_wait_s)
        self._save_timeout_s = float(save_timeout_s)
        #: Whether the sidecar takes save fences (its PONG's ``features``), learned at REGISTER.
        self._sidecar_fences = False
        #: Request id -> first chunk of a save that did not happen (reported once).
        self._failed_saves: dict[str, int] = {}
        #: The sidecar process answering (its PONG's ``instanceId``), and how many times another
        #: one took its place on a TCP endpoint: transfers sent before are then void.
        self._instance: str | None = None
        self._generation = 0
        #: Set by the heartbeat thread: another sidecar process answers (its instanceId); the
        #: engine thread registers with it on its own socket (see poll).
        self._restart_seen: str | None = None
        self._reregister: Any = None
        self._clock = clock
        self._registration: dict | None = None
        self._result: Any = None
        self._transfers: list[_Transfer] = []
        self._loading: dict[str, int] = {}
        self._finished_recving: set[str] = set()
        self._load_errors: set[int] = set()
        #: Whether the sidecar writes a layer-wise LOAD's progress (its PONG's ``features``).
        self._sidecar_layerwise = False
        #: This step's layer-wise loads, and the layers of the registration.
        self._layerwise: list[_Transfer] = []
        self._num_layers = 0
        self._awaiting_free: set[str] = set()
        self._pending_saves: tuple[SaveIntent, ...] = ()
        self._stats = WorkerStats()
        self._closed = False
        self.last_activity = clock()
        self._hb_stop = threading.Event()
        self._hb_wake = threading.Event()
        self._hb_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ registration

    @property
    def engine_id(self) -> str | None:
        return None if self._registration is None else self._registration["engineId"]

    @property
    def registered(self) -> bool:
        """True once the sidecar answered a REGISTER (the first, or the heartbeat thread's)."""
        return self._result is not None

    @property
    def state_file(self) -> dict | None:
        """The registration's ``stateFile`` (the save fences' file), or None without one."""
        return None if self._fences is None else self._fences.spec

    @property
    def registration_result(self) -> Any:
        """The sidecar's RegisterResult (engine_id, namespace, chunk_size, block_size), or None."""
        return self._result

    def stats(self) -> WorkerStats:
        return WorkerStats(**vars(self._stats))

    def register_kv_caches(self, registration: dict, timeout_ms: int | None = None) -> Any:
        """vLLM ``register_kv_caches``: sends REGISTER (see :func:`kvtier_vllm.kv_caches.build_registration`)
        and waits for the answer; starts the heartbeat thread.

        :raises KvtierError: from the sidecar (``KVT_INVALID_ARGUMENT`` for a bad registration,
            ``KVT_CONFIG`` for ``cuda`` on a sidecar without CUDA, ``KVT_TIMEOUT`` when down).
        """
        self._open()
        self._registration = dict(registration)
        self._num_layers = len(registration.get("layers") or ())
        if self._hb_factory is not None and self._hb_thread is None:
            # Started first: when the sidecar is not up yet, the thread registers once it is.
            self._hb_thread = threading.Thread(target=self._heartbeat_loop, name="kvtier-heartbeat", daemon=True)
            self._hb_thread.start()
        result = self._client.send_register(registration).wait(timeout_ms)
        problem = _layout_problem(registration, result)
        if problem is not None:
            self._unregister_quietly(self._client, registration)
            raise ConfigError(problem)
        self._result = result
        self._stats.registrations += 1
        self._learn_features(self._client)
        self._touch()
        return result

    @staticmethod
    def _unregister_quietly(client: Any, registration: dict | None) -> None:
        """Takes back a registration the sidecar would serve wrongly (its SAVEs and LOADs are
        then refused as an unknown engine's: loads recompute, nothing wrong is stored)."""
        engine = (registration or {}).get("engineId")
        if not isinstance(engine, str):
            return
        try:
            client.send_unregister(engine)
        except Exception as err:
            _log.warning("unregistering engine %s not sent: %s", engine, err)

    @property
    def fenced(self) -> bool:
        """True when SAVEs go with a fence (a state file, and a sidecar that takes them)."""
        return self._fences is not None and self._sidecar_fences

    def _learn_features(self, client: Any, timeout_ms: float = 1000.0) -> str | None:
        """Asks the sidecar (PING) whether it takes save fences (without an answer, SAVEs go
        without: the safe side, their blocks are kept until their not-after time) and which
        process it is: its ``instanceId``, returned (None without an answer). The first one
        seen is this worker's."""
        try:
            info = client.send_ping(timeout_ms).wait(timeout_ms)
        except Exception as err:
            _log.info("the sidecar did not say whether it takes save fences (%s); saves go without", err)
            self._sidecar_fences = False
            return None
        features = info.get("features") or ()
        self._sidecar_fences = self._fences is not None and "saveFence" in features
        self._sidecar_layerwise = self._fences is not None and "layerwiseLoad" in features
        instance = info.get("instanceId")
        if not isinstance(instance, str) or not instance:
            return None
        if self._instance is None:
            self._instance = instance
        return instance

    def _restarted(self, instance: str | None) -> bool:
        """Whether ``instance`` is another sidecar process than the one this worker registered
        with, on a TCP endpoint (where a port has one owner: the old process is gone)."""
        return (
            instance is not None
            and self._instance is not None
            and instance != self._instance
            and str(getattr(self._client, "endpoint", "")).startswith("tcp://")
        )

    def _register_after_restart(self) -> None:
        """Registers with a restarted sidecar on this thread's own socket, and voids everything
        sent before: a transfer sent before reached the old process (gone) or reaches the new
        one before this REGISTER on the same connection (it answers ``KVT_NOT_FOUND`` and acts on
        nothing), so its blocks are free at once; what is sent after reaches the new one after
        the REGISTER."""
        instance, self._restart_seen = self._restart_seen, None
        if self._reregister is not None or self._registration is None or not self._restarted(instance):
            return
        try:
            self._reregister = self._client.send_register(self._registration)
        except Exception as err:
            _log.warning("registering with the restarted sidecar not sent: %s", err)
            return
        self._instance = instance
        self._generation += 1
        _log.warning("the sidecar restarted; transfers sent to the old one are void")

    def _take_reregistration(self) -> None:
        p = self._reregister
        if p is None or not p.done:
            return
        self._reregister = None
        try:
            result = p.result()
            problem = _layout_problem(self._registration, result)
            if problem is not None:
                self._unregister_quietly(self._client, self._registration)
                raise ConfigError(problem)
            self._result = result
            self._stats.registrations += 1
            _log.warning("registered again with the restarted sidecar")
        except Exception as err:  # the heartbeat thread tries again
            _log.warning("registering with the restarted sidecar failed: %s", err)

    def drop_meta(self, meta: ConnectorMeta) -> None:
        """Settles a metadata without a sidecar (no registration could be made): its loads fail
        (every block invalid, the engine recomputes), its saves are dropped, delayed frees are
        reported by the next :meth:`get_finished`. Keeps the engine from waiting on kvtier."""
        for end in meta.finished:
            if end.delay_free:
                self._awaiting_free.add(end.request_id)
        for intent in meta.loads:
            self._stats.loads_failed += 1
            self._load_errors.update(intent.block_ids)
            if not getattr(intent, "layerwise", False):  # a synchronous load is not reported
                self._finished_recving.add(intent.request_id)
            self._release_lookup(intent.lookup_id)
        self._pending_saves = ()

    def _release_lookup(self, lookup_id: str) -> None:
        """Fire-and-forget CANCEL of a lookup whose LOAD is not sent: its pins go now rather
        than at their TTL (a sidecar that does not answer releases them at the TTL)."""
        try:
            self._client.cancel(lookup_id + self._suffix)
        except Exception as err:
            _log.debug("cancel of %s failed (the pin TTL releases it): %s", lookup_id, err)

    # ------------------------------------------------------------------ vLLM hooks

    def start_load_kv(self, meta: ConnectorMeta) -> None:
        """vLLM ``start_load_kv`` (with the bound metadata): sends this step's releases and loads
        and keeps its saves for :meth:`wait_for_save`. Returns at once.

        :raises InvalidArgumentError: before :meth:`register_kv_caches`. :raises ClosedError:
        """
        self._open()
        if self._registration is None:
            raise InvalidArgumentError("start_load_kv before register_kv_caches")
        if self._restart_seen is not None:
            self._register_after_restart()  # before this step's transfers, on the same socket
        engine = self.engine_id
        for end in meta.finished:
            if end.delay_free:
                self._awaiting_free.add(end.request_id)
            if end.kind == "preempted":
                continue  # preemption releases nothing on the sidecar
            try:
                self._client.send_request_finished(engine, end.request_id, end.kind)
            except Exception as err:  # the pin TTL and heartbeat timeout release it
                _log.warning("release of %s not sent: %s", end.request_id, err)
        self._layerwise = []
        for intent in meta.loads:
            self._start_load(intent)
        self._pending_saves = tuple(meta.saves)
        self._touch()

    def wait_for_layer_load(self, layer: int) -> None:
        """vLLM ``wait_for_layer_load`` for layer ``layer`` (its index in the registration):
        returns once every layer-wise load of this step has that layer in place (its progress
        word passed it), has settled, or has passed its deadline (then its blocks are reported
        invalid and the engine recomputes the request). A load whose progress cannot be read
        (no state file, a sidecar without ``layerwiseLoad``) is waited for whole at its first
        layer. Never waits past a load's not-after time."""
        if self._layerwise:
            self._stats.layerwise_waits += 1
        waiting = [t for t in self._layerwise if not t.done]
        spins = 0
        while waiting:
            self.poll()
            now = time.monotonic()
            left = []
            for t in waiting:
                if t.done:
                    continue
                if t.progress_slot is not None and self._fences.word(t.progress_slot) > layer:
                    continue
                if now >= t.hold_until - LOAD_GRACE_S:
                    self._give_up_layerwise(t)
                    continue
                left.append(t)
            waiting = left
            if waiting:
                spins += 1
                # Spin briefly (a layer's copy is often under a millisecond), then sleep a little.
                if spins > 64:
                    time.sleep(0.0002)

    def _give_up_layerwise(self, t: _Transfer) -> None:
        """A layer-wise load past its deadline: its blocks are invalid (the engine recomputes);
        the transfer stays until its reply or hold time, its slot with it."""
        if t.gave_up:
            return
        t.gave_up = True
        self._stats.loads_failed += 1
        self._load_errors.update(t.intent.block_ids)
        _log.warning("layer-wise load of %s passed its deadline; its blocks are reported invalid", t.request_id)

    def _finish_layerwise(self) -> None:
        """End of a step: every layer-wise load of it is complete (every layer in), settled, or
        given up on and held until the sidecar can no longer write its blocks (its reply, or its
        not-after time and the grace): the engine may recompute into those blocks next step."""
        pending = [t for t in self._layerwise if not t.done]
        self._layerwise = []
        for t in pending:
            if t.progress_slot is not None and self._fences.word(t.progress_slot) >= self._num_layers > 0:
                continue  # every layer in: nothing more is written (the reply settles it)
            while not t.done and time.monotonic() < t.hold_until:
                self.poll()
                if not t.done:
                    self._client.poll(timeout_ms=1)
            if not t.done:
                self._give_up_layerwise(t)

    def wait_for_save(
        self,
        synchronize: Callable[[], None] | None = None,
        cuda_event: Callable[[], bytes] | None = None,
    ) -> None:
        """vLLM ``wait_for_save``: sends the saves of the current metadata. The KV writes of this
        step must be complete before the sidecar reads the blocks from another process: on a GPU,
        ``cuda_event`` records an interprocess CUDA event on the current stream and returns its
        64-byte IPC handle, which every SAVE carries (the sidecar's copies wait for it on the
        GPU, so nothing here waits for the GPU); otherwise ``synchronize`` runs first (a stream
        synchronize). Does not wait for the sidecar: blocks stay valid because the scheduler
        delays the free of requests with saves and :meth:`handle_preemptions` waits for saves of
        preempted ones."""
        self._open()
        saves, self._pending_saves = self._pending_saves, ()
        if not saves:
            return
        if self._restart_seen is not None:
            self._register_after_restart()  # before these SAVEs, on the same socket
        event = None
        if cuda_event is not None:
            event = cuda_event()
        elif synchronize is not None:
            synchronize()
        for s in saves:
            self._start_save(s, event)
        self._touch()

    def handle_preemptions(self, request_ids: Iterable[str], timeout_s: float | None = None) -> bool:
        """vLLM ``handle_preemptions``: returns once no save still reads the blocks of these
        requests, so the engine may reuse them. Fenced saves are waited for at most
        ``preemption_wait_s`` (on the socket, no sleeping) and then cancelled; a save without a
        fence (a sidecar that takes none) is waited for until its not-after time, bounded by
        ``timeout_s``. Returns False if it gave up on one (then the sidecar's not-after check
        is what keeps the reused blocks out of the store)."""
        ids = set(request_ids)
        if not ids:
            return True
        deadline = None if timeout_s is None else self._clock() + timeout_s
        wait_until = self._clock() + self._preemption_wait_s
        while True:
            self.poll()
            saves = [t for t in self._transfers if t.kind == "save" and t.request_id in ids]
            if not saves:
                return True
            now = self._clock()
            if now >= wait_until:
                fenced = [t for t in saves if t.fence is not None]
                for t in fenced:
                    self._cancel(t, "its request was preempted", report=False)
                self._transfers = [t for t in self._transfers if t not in fenced]
                saves = [t for t in saves if t not in fenced]
                if not saves:
                    return True
            # Never before the saves' not-after times: the sidecar may read the blocks until then.
            if deadline is not None and now >= deadline and time.monotonic() >= max(t.hold_until for t in saves):
                _log.warning("handle_preemptions gave up waiting for saves of %s", sorted(ids))
                return False
            self._client.poll(timeout_ms=max(1.0, min(5.0, (wait_until - now) * 1000)) if now < wait_until else 20)

    def get_finished(self, finished_req_ids: Iterable[str] | None = None) -> tuple[set[str], set[str]]:
        """vLLM ``get_finished``: ``(finished_sending, finished_recving)``. ``finished_recving``:
        requests whose loads settled since the last call (loaded, or failed: see
        :meth:`get_block_ids_with_load_errors`); ``finished_sending``: ended requests whose free
        the scheduler delayed and that have no transfer left. Each id is reported once. A
        layer-wise load (synchronous, vLLM's ``load_kv_async`` False) is not reported here: it
        ends with its step (see :meth:`wait_for_layer_load`)."""
        if self._layerwise:
            self._finish_layerwise()
        self.poll()
        recving, self._finished_recving = self._finished_recving, set()
        busy = {t.request_id for t in self._transfers}
        sending = {rid for rid in self._awaiting_free if rid not in busy}
        self._awaiting_free -= sending
        return sending, recving

    def get_block_ids_with_load_errors(self) -> set[int]:
        """vLLM ``get_block_ids_with_load_errors``: blocks of failed loads since the last call
        (drained). The engine recomputes those requests from their first invalid block."""
        self.poll()
        out, self._load_errors = self._load_errors, set()
        return out

    def take_failed_saves(self) -> dict[str, int]:
        """Requests whose saves did not happen since the last call (drained): request id -> the
        first chunk not saved. Saves the sidecar dropped for want of room are not among them."""
        out, self._failed_saves = self._failed_saves, {}
        return out

    # ------------------------------------------------------------------ progress

    def poll(self) -> int:
        """Collects replies without blocking and settles finished transfers; returns how many settled."""
        if self._closed:
            return 0
        if self._restart_seen is not None:
            self._register_after_restart()
        try:
            self._client.poll()
        except Exception as err:
            _log.debug("poll failed: %s", err)
        self._take_reregistration()
        left: list[_Transfer] = []
        settled = 0
        now = time.monotonic()
        generation = self._generation
        for t in self._transfers:
            if t.generation < generation:
                # Sent to a sidecar process that is gone (another one answers on its endpoint):
                # no answer will come and nothing more will touch the blocks.
                if t.fence is not None:
                    self._fences.release(t.fence[0])
                    t.fence = None
                self._settle(t, ClosedError("the sidecar restarted before answering"))
                settled += 1
                continue
            if t.pending is not None and not t.pending.done:
                if t.fence is not None and now - t.started >= self._save_timeout_s:
                    self._cancel(t, f"no answer within {self._save_timeout_s:g} s")
                    settled += 1
                    continue
                left.append(t)
                continue
            if t.fence is not None and t.pending is not None and isinstance(t.pending.exception(), RequestTimeoutError):
                self._cancel(t, "no answer before its deadline")
                settled += 1
                continue
            if t.pending is not None and now < t.hold_until and isinstance(t.pending.exception(), RequestTimeoutError):
                left.append(t)  # no reply: the sidecar may still copy until the not-after time
                continue
            settled += 1
            self._settle(t)
        self._transfers = left
        return settled

    def in_flight(self) -> int:
        """Loads and saves not settled yet."""
        return len(self._transfers)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Waits (on the socket) until every transfer settled; False when ``timeout_s`` passed first."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        while True:
            self.poll()
            if not self._transfers:
                return True
            left_ms = 20.0 if deadline is None else (deadline - self._clock()) * 1000
            if left_ms <= 0:
                return False
            self._client.poll(timeout_ms=max(1.0, min(20.0, left_ms)))

    def close(self, timeout_s: float = 0.04) -> None:
        """Cancels fenced saves, waits at most ``timeout_s`` for the other transfers and the
        answer to UNREGISTER (best effort: the sidecar's heartbeat timeout releases the engine
        otherwise), stops the heartbeat thread and closes the client and the state file.
        Idempotent."""
        if self._closed:
            return
        end = self._clock() + timeout_s
        fenced = [t for t in self._transfers if t.fence is not None]
        for t in fenced:
            self._cancel(t, "the worker is shutting down", report=False)
        self._transfers = [t for t in self._transfers if t not in fenced]
        self.wait_idle(max(0.0, end - self._clock()))
        self._hb_stop.set()
        self._hb_wake.set()
        if self._registration is not None:
            try:
                left_ms = max(1.0, (end - self._clock()) * 1000)
                self._client.send_unregister(self.engine_id).wait(left_ms)
            except Exception as err:
                _log.info("UNREGISTER not answered (the heartbeat timeout releases the engine): %s", err)
        if self._hb_thread is not None:
            # The thread checks the stop flag between short waits and closes its own client.
            self._hb_thread.join(timeout=max(0.0, end - self._clock()))
        self._closed = True
        self._client.close()
        if self._fences is not None:
            self._fences.close()

    # ------------------------------------------------------------------ internals

    def _open(self) -> None:
        if self._closed:
            raise ClosedError("worker connector is closed")

    def _touch(self) -> None:
        self.last_activity = self._clock()

    def _start_load(self, intent: LoadIntent) -> None:
        self._stats.loads_started += 1
        layerwise = bool(getattr(intent, "layerwise", False))
        if not layerwise:
            self._loading[intent.request_id] = self._loading.get(intent.request_id, 0) + 1
        deadline_ms = min(x for x in (intent.deadline_ms, self._load_timeout_ms, _DEFAULT_LOAD_DEADLINE_MS) if x > 0)
        not_after = time.monotonic() + deadline_ms / 1000
        slot = self._fences.take() if layerwise and self._sidecar_layerwise else None
        try:
            pending = self._client.send_load(
                self.engine_id,
                intent.request_id,
                intent.lookup_id + self._suffix,
                list(intent.block_ids),
                intent.chunk_hashes,
                deadline_ms=deadline_ms,
                skip_blocks=intent.skip_blocks,
                not_after_ns=int(not_after * 1e9),
                **({"progress_slot": slot} if slot is not None else {}),
            )
        except Exception as err:
            _log.warning("load of %s not sent; its blocks are reported invalid: %s", intent.request_id, err)
            pending = None
        t = _Transfer(
            "load", intent.request_id, pending, intent, not_after + LOAD_GRACE_S, generation=self._generation, progress_slot=slot
        )
        self._transfers.append(t)
        if layerwise:
            self._stats.layerwise_loads += 1
            self._layerwise.append(t)

    def _start_save(self, intent: SaveIntent, cuda_event: bytes | None = None) -> None:
        self._stats.saves_started += 1
        now = time.monotonic()
        not_after = now + float(getattr(self._client, "request_timeout_s", 30.0))
        fence = self._fences.arm() if self.fenced else None
        try:
            pending = self._client.send_save(
                self.engine_id, intent.request_id, 0, list(intent.block_ids), intent.chunk_hashes,
                not_after_ns=int(not_after * 1e9),
                **({"cuda_event": cuda_event} if cuda_event is not None else {}),
                **({"fence": fence} if fence is not None else {}),
            )
        except Exception as err:
            _log.warning("save of %s not sent: %s", intent.request_id, err)
            pending = None
            if fence is not None:
                self._fences.release(fence[0])
                fence = None
        self._transfers.append(_Transfer("save", intent.request_id, pending, intent, not_after, fence, now, self._generation))

    def _cancel(self, t: _Transfer, why: str, report: bool = True) -> None:
        """Cancels a fenced SAVE through its fence and settles it: from here the engine may
        reuse its blocks. ``report``: its chunks count as not saved (see take_failed_saves)."""
        assert t.fence is not None
        self._fences.cancel(*t.fence)
        t.fence = None
        self._stats.saves_failed += 1
        self._stats.saves_cancelled += 1
        _log.info("save of %s cancelled: %s", t.request_id, why)
        if report:
            self._note_failed_save(t)

    def _note_failed_save(self, t: _Transfer) -> None:
        first = int(getattr(t.intent, "first_chunk", 0))
        self._failed_saves[t.request_id] = min(first, self._failed_saves.get(t.request_id, first))

    def _settle(self, t: _Transfer, forced: BaseException | None = None) -> None:
        err: BaseException | None = forced
        result = None
        if forced is not None:
            pass
        elif t.pending is None:
            err = ClosedError("not sent")
        else:
            try:
                result = t.pending.result()
            except Exception as e:
                err = e
        if isinstance(err, NotFoundError):
            self._hb_wake.set()  # the sidecar forgot us (restart): register again
        t.done = True
        if t.kind == "load":
            layerwise = bool(getattr(t.intent, "layerwise", False))
            if t.progress_slot is not None:
                self._fences.release(t.progress_slot)  # the sidecar writes it no more
                t.progress_slot = None
            if t.gave_up:
                self._release_lookup(t.intent.lookup_id)  # its blocks are already reported
            elif err is not None:
                # A load that never ran loaded nothing: every block is invalid and recomputed.
                self._stats.loads_failed += 1
                self._load_errors.update(t.intent.block_ids)
                _log.warning("load of %s failed; its blocks are reported invalid: %s", t.request_id, err)
                self._release_lookup(t.intent.lookup_id)
            else:
                invalid = list(result.invalid_block_ids)
                if invalid:
                    self._stats.loads_failed += 1
                    self._load_errors.update(invalid)
            if layerwise:
                return  # a synchronous load ends with its step, never in finished_recving
            left = self._loading.get(t.request_id, 1) - 1
            if left > 0:
                self._loading[t.request_id] = left
            else:
                self._loading.pop(t.request_id, None)
                self._finished_recving.add(t.request_id)
        else:
            if t.fence is not None:
                self._fences.release(t.fence[0])
                t.fence = None
            if err is not None:
                self._stats.saves_failed += 1  # a lost save costs a future hit: saved again
                _log.info("save of %s failed: %s", t.request_id, err)
                self._note_failed_save(t)
            else:
                self._stats.chunks_saved += int(result.saved)
                self._stats.chunks_dropped += int(result.dropped)

    def _heartbeat_loop(self) -> None:
        client = None
        try:
            client = self._hb_factory()
            while not self._hb_stop.is_set():
                woke = self._hb_wake.wait(self._hb_interval / 2)
                if self._hb_stop.is_set():
                    break
                self._hb_wake.clear()
                if not woke and self._result is not None and self._clock() - self.last_activity < self._hb_interval:
                    continue
                self._heartbeat_once(client, force_register=woke)
        except Exception as err:  # never let the thread die silently
            _log.error("heartbeat thread stopped: %s", err)
        finally:
            if client is not None:
                try:
                    client.close()
                except Exception:
                    pass

    def _await(self, pending: Any, timeout_ms: float) -> Any:
        """The reply, waited for in short slices so that :meth:`close` never waits on it."""
        end = time.monotonic() + timeout_ms / 1000
        while True:
            if self._hb_stop.is_set() and not pending.done:
                raise ClosedError("the worker connector is closing")
            left_ms = (end - time.monotonic()) * 1000
            if left_ms <= 0 and not pending.done:
                raise RequestTimeoutError(f"no reply within {timeout_ms:g} ms")
            try:
                return pending.wait(min(10.0, max(left_ms, 1.0)))
            except RequestTimeoutError:
                if pending.done:
                    raise

    def _heartbeat_once(self, client: Any, force_register: bool = False) -> None:
        engine = self.engine_id
        timeout_ms = int(max(1.0, self._hb_interval) * 1000)
        try:
            known = bool(self._await(client.send_heartbeat(engine), timeout_ms).known)
        except Exception as err:
            _log.debug("heartbeat not answered: %s", err)
            return
        self.last_activity = self._clock()
        if known and not force_register:
            return
        if not known:
            try:
                instance = self._learn_features(client, timeout_ms)
                if self._restarted(instance):
                    # Another process: the engine thread registers on its own socket, where the
                    # order of what it sent is kept (see _register_after_restart).
                    self._restart_seen = instance
                    return
                result = self._await(client.send_register(self._registration), timeout_ms)
                problem = _layout_problem(self._registration, result)
                if problem is not None:
                    self._unregister_quietly(client, self._registration)
                    raise ConfigError(problem)
                self._result = result
                self._stats.registrations += 1
                _log.warning("sidecar had forgotten engine %s; registered again", engine)
            except Exception as err:
                _log.warning("registering again failed: %s", err)


def _layout_problem(registration: dict | None, result: Any) -> str | None:
    """Why a REGISTER answer cannot be used, or None: a registration of ``HND`` blocks needs a
    sidecar that reorders them to the stored form and says so (``blockLayout`` in its answer);
    an older one would store them as they are, under the namespace NHD engines read."""
    wanted = (registration or {}).get("blockLayout", "NHD")
    got = getattr(result, "block_layout", None)
    if wanted != "HND" or got == "HND":
        return None
    return (
        "the sidecar did not confirm blockLayout HND (it answered "
        f"{got!r}): it is older than this connector and would store these HND blocks without "
        "reordering them; upgrade the sidecar"
    )
