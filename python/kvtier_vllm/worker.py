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
with an error, is settled at once. A
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
from .errors import ClosedError, InvalidArgumentError, NotFoundError, RequestTimeoutError

__all__ = ["WorkerConnector", "WorkerStats", "LOAD_GRACE_S"]

_log = logging.getLogger("kvtier_vllm.worker")

#: How long past a LOAD's not-after time its blocks are kept when no reply came: a chunk copy
#: the sidecar started just before that time completes within it.
LOAD_GRACE_S = 1.0
#: The sidecar's LOAD deadline when the worker names none (docs/protocol.md 4.9).
_DEFAULT_LOAD_DEADLINE_S = 20.0


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


@dataclass
class _Transfer:
    kind: str  # 'load' | 'save'
    request_id: str
    pending: Any  # client Pending, or None when the send itself failed
    intent: Any
    #: Monotonic seconds before which the blocks are kept if no reply comes (see the module).
    hold_until: float = 0.0


class WorkerConnector:
    """Worker-side connector over one :class:`~kvtier_vllm.client.KvtierClient`.

    :param client: owned; used from the engine's thread only.
    :param load_timeout_ms: server deadline of each load (chunks not started by then are
        invalid); 0 = the server's default.
    :param lookup_suffix: appended to every load's lookup id (this rank's suffix, see
        :mod:`kvtier_vllm.rank_lookup`).
    :param heartbeat_client_factory: makes the heartbeat thread's own client; None: no thread.
    :param heartbeat_interval_s: silence after which the thread sends HEARTBEAT.
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
        self._clock = clock
        self._registration: dict | None = None
        self._result: Any = None
        self._transfers: list[_Transfer] = []
        self._loading: dict[str, int] = {}
        self._finished_recving: set[str] = set()
        self._load_errors: set[int] = set()
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
        if self._hb_factory is not None and self._hb_thread is None:
            # Started first: when the sidecar is not up yet, the thread registers once it is.
            self._hb_thread = threading.Thread(target=self._heartbeat_loop, name="kvtier-heartbeat", daemon=True)
            self._hb_thread.start()
        result = self._client.send_register(registration).wait(timeout_ms)
        self._result = result
        self._stats.registrations += 1
        self._touch()
        return result

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
            self._finished_recving.add(intent.request_id)
        self._pending_saves = ()

    # ------------------------------------------------------------------ vLLM hooks

    def start_load_kv(self, meta: ConnectorMeta) -> None:
        """vLLM ``start_load_kv`` (with the bound metadata): sends this step's releases and loads
        and keeps its saves for :meth:`wait_for_save`. Returns at once.

        :raises InvalidArgumentError: before :meth:`register_kv_caches`. :raises ClosedError:
        """
        self._open()
        if self._registration is None:
            raise InvalidArgumentError("start_load_kv before register_kv_caches")
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
        for intent in meta.loads:
            self._start_load(intent)
        self._pending_saves = tuple(meta.saves)
        self._touch()

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
        requests, so the engine may reuse them. Waits on the socket (no sleeping); bounded by the
        client's request deadline, or ``timeout_s``. Returns False if it gave up."""
        ids = set(request_ids)
        if not ids:
            return True
        deadline = None if timeout_s is None else self._clock() + timeout_s
        while True:
            self.poll()
            saves = [t for t in self._transfers if t.kind == "save" and t.request_id in ids]
            if not saves:
                return True
            # Never before the saves' not-after times: the sidecar may read the blocks until then.
            if deadline is not None and self._clock() >= deadline and time.monotonic() >= max(t.hold_until for t in saves):
                _log.warning("handle_preemptions gave up waiting for saves of %s", sorted(ids))
                return False
            self._client.poll(timeout_ms=20)

    def get_finished(self, finished_req_ids: Iterable[str] | None = None) -> tuple[set[str], set[str]]:
        """vLLM ``get_finished``: ``(finished_sending, finished_recving)``. ``finished_recving``:
        requests whose loads settled since the last call (loaded, or failed: see
        :meth:`get_block_ids_with_load_errors`); ``finished_sending``: ended requests whose free
        the scheduler delayed and that have no transfer left. Each id is reported once."""
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

    # ------------------------------------------------------------------ progress

    def poll(self) -> int:
        """Collects replies without blocking and settles finished transfers; returns how many settled."""
        if self._closed:
            return 0
        try:
            self._client.poll()
        except Exception as err:
            _log.debug("poll failed: %s", err)
        left: list[_Transfer] = []
        settled = 0
        now = time.monotonic()
        for t in self._transfers:
            if t.pending is not None and not t.pending.done:
                left.append(t)
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
            if deadline is not None and self._clock() >= deadline:
                return False
            self._client.poll(timeout_ms=20)

    def close(self, timeout_s: float = 5.0) -> None:
        """Waits (bounded) for transfers in flight, stops the heartbeat thread, sends UNREGISTER
        (best effort) and closes the client. Idempotent."""
        if self._closed:
            return
        self.wait_idle(timeout_s)
        self._hb_stop.set()
        self._hb_wake.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=timeout_s)
        if self._registration is not None:
            try:
                self._client.send_unregister(self.engine_id).wait(int(timeout_s * 1000))
            except Exception as err:
                _log.info("UNREGISTER not answered (the heartbeat timeout releases the engine): %s", err)
        self._closed = True
        self._client.close()

    # ------------------------------------------------------------------ internals

    def _open(self) -> None:
        if self._closed:
            raise ClosedError("worker connector is closed")

    def _touch(self) -> None:
        self.last_activity = self._clock()

    def _start_load(self, intent: LoadIntent) -> None:
        self._stats.loads_started += 1
        self._loading[intent.request_id] = self._loading.get(intent.request_id, 0) + 1
        deadline_s = self._load_timeout_ms / 1000 if self._load_timeout_ms else _DEFAULT_LOAD_DEADLINE_S
        not_after = time.monotonic() + deadline_s
        try:
            pending = self._client.send_load(
                self.engine_id,
                intent.request_id,
                intent.lookup_id + self._suffix,
                list(intent.block_ids),
                intent.chunk_hashes,
                deadline_ms=self._load_timeout_ms,
                skip_blocks=intent.skip_blocks,
                not_after_ns=int(not_after * 1e9),
            )
        except Exception as err:
            _log.warning("load of %s not sent; its blocks are reported invalid: %s", intent.request_id, err)
            pending = None
        self._transfers.append(_Transfer("load", intent.request_id, pending, intent, not_after + LOAD_GRACE_S))

    def _start_save(self, intent: SaveIntent, cuda_event: bytes | None = None) -> None:
        self._stats.saves_started += 1
        not_after = time.monotonic() + float(getattr(self._client, "request_timeout_s", 30.0))
        try:
            pending = self._client.send_save(
                self.engine_id, intent.request_id, 0, list(intent.block_ids), intent.chunk_hashes,
                not_after_ns=int(not_after * 1e9),
                **({"cuda_event": cuda_event} if cuda_event is not None else {}),
            )
        except Exception as err:
            _log.warning("save of %s not sent: %s", intent.request_id, err)
            pending = None
        self._transfers.append(_Transfer("save", intent.request_id, pending, intent, not_after))

    def _settle(self, t: _Transfer) -> None:
        err: BaseException | None = None
        result = None
        if t.pending is None:
            err = ClosedError("not sent")
        else:
            try:
                result = t.pending.result()
            except Exception as e:
                err = e
        if isinstance(err, NotFoundError):
            self._hb_wake.set()  # the sidecar forgot us (restart): register again
        if t.kind == "load":
            if err is not None:
                # A load that never ran loaded nothing: every block is invalid and recomputed.
                self._stats.loads_failed += 1
                self._load_errors.update(t.intent.block_ids)
                _log.warning("load of %s failed; its blocks are reported invalid: %s", t.request_id, err)
                # Nobody took the lookup's pins: release them now rather than at their TTL.
                try:
                    self._client.cancel(t.intent.lookup_id + self._suffix)
                except Exception as cerr:
                    _log.debug("cancel of %s failed (the pin TTL releases it): %s", t.intent.lookup_id, cerr)
            else:
                invalid = list(result.invalid_block_ids)
                if invalid:
                    self._stats.loads_failed += 1
                    self._load_errors.update(invalid)
            left = self._loading.get(t.request_id, 1) - 1
            if left > 0:
                self._loading[t.request_id] = left
            else:
                self._loading.pop(t.request_id, None)
                self._finished_recving.add(t.request_id)
        else:
            if err is not None:
                self._stats.saves_failed += 1  # a lost save only costs a future hit
                _log.info("save of %s failed: %s", t.request_id, err)
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
                return pending.wait(min(100.0, max(left_ms, 1.0)))
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
                self._result = self._await(client.send_register(self._registration), timeout_ms)
                self._stats.registrations += 1
                _log.warning("sidecar had forgotten engine %s; registered again", engine)
            except Exception as err:
                _log.warning("registering again failed: %s", err)
