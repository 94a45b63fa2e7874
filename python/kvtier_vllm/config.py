"""The connector's settings, read from vLLM's ``kv_connector_extra_config``.

Every key is optional; defaults live in :data:`DEFAULTS`. Unknown keys are refused (a typo must
not silently fall back to a default), with a message naming the key and the allowed ones.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from .errors import ConfigError

__all__ = ["KvtierConfig", "DEFAULTS"]


@dataclass(frozen=True)
class KvtierConfig:
    """Resolved connector settings (see docs/vllm.md for each key)."""

    #: The sidecar's ROUTER endpoint (one sidecar per node).
    endpoint: str = "tcp://127.0.0.1:5555"
    #: One endpoint per KV rank (index ``pp_rank * tp_size + tp_rank``) when ranks run on several
    #: nodes; empty: every rank uses ``endpoint``.
    rank_endpoints: tuple = ()
    #: How long the scheduler waits for a lookup before counting it a miss (and cancelling it).
    lookup_timeout_ms: int = 2000
    #: The engine's prefill rate (tokens/s) for "never slower than recomputing": a number,
    #: ``"auto"`` (learned from the engine's own steps) or ``"off"`` (every hit is claimed and a
    #: lookup waits up to ``lookup_timeout_ms``).
    prefill_tokens_per_s: float | str = "auto"
    #: Deadline of every other request (REGISTER, SAVE, LOAD replies, ...) on the client.
    request_timeout_ms: int = 30000
    #: Silence (with requests in flight) after which a PING probes the sidecar, and the time that
    #: PING has to answer before the sidecar counts as down (everything in flight fails at once).
    liveness_timeout_ms: int = 5000
    #: Server deadline of a LOAD (0: the sidecar's default, 20 s).
    load_timeout_ms: int = 0
    #: Tokens per stored chunk; a multiple of vLLM's block size.
    chunk_size: int = 256
    #: Worker silence after which a HEARTBEAT is sent.
    heartbeat_interval_ms: int = 5000
    #: Default cache salt of requests without one.
    salt: str = ""
    #: Model id in the namespace; default: vLLM's ``model_config.model``.
    model_id: str | None = None
    #: In-block layout (``NHD``/``HND``); default: vLLM's KV cache layout.
    kv_layout: str | None = None
    #: Per-layer tensor layout: ``auto``, ``flash_attn``, ``flashinfer`` or ``mla``.
    tensor_layout: str = "auto"
    #: Layers of the model's attention stack, when ``num_hidden_layers`` is not it.
    num_layers: int | None = None
    #: Load from kvtier (default: unless ``kv_role`` is ``kv_producer``).
    load: bool | None = None
    #: Save to kvtier (default: unless ``kv_role`` is ``kv_consumer``).
    save: bool | None = None
    #: Disaggregated prefill, on a consumer: the longest a request whose ``kv_transfer_params``
    #: name a producer's save waits for those chunks (its lookup stays pending; steps go on).
    #: Past it the request loads what arrived and computes the rest. 0: no wait.
    handoff_wait_ms: int = 10000
    #: Disaggregated prefill, on a consumer: the producers' sidecar endpoints whose parameters are
    #: taken (others are logged and ignored); empty: any.
    handoff_producers: tuple = ()
    #: Bound on waiting for the sidecar at shutdown (transfers in flight, UNREGISTER's answer);
    #: fenced saves are cancelled at once, and the sidecar releases an engine that did not say
    #: goodbye after its heartbeat timeout.
    shutdown_timeout_ms: int = 40
    #: With a sidecar that takes save fences: the longest ``handle_preemptions`` waits for a
    #: preempted request's saves before it cancels them (then the engine reuses the blocks).
    preemption_wait_ms: int = 25
    #: With save fences: a SAVE unanswered after this long is cancelled and its blocks go back to
    #: the engine; its chunks are saved again while the engine still has them.
    save_timeout_ms: int = 1000
    #: CurveZMQ (docs/security.md): the sidecar's public key, Z85 text or the path of its .pub.
    server_public_key: str | None = None
    #: CurveZMQ: this engine's secret key file (mode 0600); its public key is on the sidecar's
    #: allow-list. Both keys or neither.
    client_secret_key_file: str | None = None
    #: Report kvtier's chunks as vLLM KV cache events (docs/events.md); needs the sidecar's event
    #: stream (its ``events`` config).
    kv_events: bool = False
    #: Loads layer by layer in the step that schedules the request (vLLM's synchronous load):
    #: each attention layer waits for its own KV only, so the forward pass overlaps the rest.
    layerwise_loads: bool = False
    #: The sidecar's event stream and replay endpoints; default: what its PING says.
    events_endpoint: str | None = None
    events_replay_endpoint: str | None = None
    #: Chunks the event mapping remembers (per worker and in the scheduler).
    kv_events_max_chunks: int = 65536

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> "KvtierConfig":
        """Validates ``kv_connector_extra_config``.

        :raises ConfigError: naming the first bad key and what is allowed.
        """
        extra = dict(extra or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ConfigError(f"unknown kv_connector_extra_config key(s) {unknown}; allowed: {sorted(known)}")
        out: dict[str, Any] = {}
        for name, value in extra.items():
            out[name] = _check(name, value)
        if (out.get("server_public_key") is None) != (out.get("client_secret_key_file") is None):
            raise ConfigError(
                "kv_connector_extra_config.server_public_key and client_secret_key_file go together (CurveZMQ needs both)"
            )
        return cls(**out)


def _int(name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"kv_connector_extra_config.{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _str(name: str, v: Any, allow_empty: bool = False) -> str:
    if not isinstance(v, str) or (not allow_empty and not v.strip()):
        raise ConfigError(f"kv_connector_extra_config.{name} must be a {'' if allow_empty else 'non-empty '}string, got {v!r}")
    return v


def _endpoint(name: str, v: Any) -> str:
    s = _str(name, v)
    if "://" not in s:
        raise ConfigError(f"kv_connector_extra_config.{name} must be a ZeroMQ endpoint like tcp://127.0.0.1:5555, got {v!r}")
    return s


def _check(name: str, v: Any) -> Any:
    if name == "endpoint":
        return _endpoint(name, v)
    if name == "rank_endpoints":
        if not isinstance(v, (list, tuple)):
            raise ConfigError(f"kv_connector_extra_config.rank_endpoints must be a list of endpoints, got {v!r}")
        return tuple(_endpoint(f"rank_endpoints[{i}]", e) for i, e in enumerate(v))
    if name in (
        "lookup_timeout_ms",
        "request_timeout_ms",
        "liveness_timeout_ms",
        "heartbeat_interval_ms",
        "shutdown_timeout_ms",
        "save_timeout_ms",
    ):
        return _int(name, v, 1, 3_600_000)
    if name == "prefill_tokens_per_s":
        if v in ("auto", "off"):
            return v
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                pass
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e12:
            raise ConfigError(
                f"kv_connector_extra_config.prefill_tokens_per_s must be a positive number of tokens/s, 'auto' or 'off', got {v!r}"
            )
        return float(v)
    if name == "preemption_wait_ms":
        return _int(name, v, 0, 60_000)
    if name == "handoff_wait_ms":
        return _int(name, v, 0, 600_000)
    if name == "handoff_producers":
        if not isinstance(v, (list, tuple)):
            raise ConfigError(f"kv_connector_extra_config.handoff_producers must be a list of endpoints, got {v!r}")
        return tuple(_endpoint(f"handoff_producers[{i}]", e) for i, e in enumerate(v))
    if name == "kv_events_max_chunks":
        return _int(name, v, 1, 1 << 26)
    if name in ("events_endpoint", "events_replay_endpoint"):
        return None if v is None else _endpoint(name, v)
    if name == "load_timeout_ms":
        return _int(name, v, 0, 3_600_000)
    if name == "chunk_size":
        return _int(name, v, 1, 1 << 20)
    if name == "num_layers":
        return None if v is None else _int(name, v, 1, 100_000)
    if name == "salt":
        return _str(name, v, allow_empty=True)
    if name in ("model_id", "server_public_key", "client_secret_key_file"):
        return None if v is None else _str(name, v)
    if name == "kv_layout":
        if v is None:
            return None
        s = _str(name, v).upper()
        if s not in ("NHD", "HND"):
            raise ConfigError(f"kv_connector_extra_config.kv_layout must be 'NHD' or 'HND', got {v!r}")
        return s
    if name == "tensor_layout":
        s = _str(name, v)
        if s not in ("auto", "flash_attn", "flashinfer", "mla"):
            raise ConfigError(f"kv_connector_extra_config.tensor_layout must be auto, flash_attn, flashinfer or mla, got {v!r}")
        return s
    if name in ("kv_events", "layerwise_loads"):
        if not isinstance(v, bool):
            raise ConfigError(f"kv_connector_extra_config.{name} must be true or false, got {v!r}")
        return v
    if name in ("load", "save"):
        if v is not None and not isinstance(v, bool):
            raise ConfigError(f"kv_connector_extra_config.{name} must be true or false, got {v!r}")
        return v
    raise ConfigError(f"kv_connector_extra_config.{name} is not a setting")  # unreachable: checked above


DEFAULTS = KvtierConfig()
