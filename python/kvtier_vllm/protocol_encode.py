"""Protocol v1 request encoders (docs/protocol.md), re-exported by :mod:`.protocol`: each names
a request's fields and packs them with :func:`~.protocol_pack.encode_message`, which lays them
out by the generated message table and refuses what the wire cannot carry.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from .errors import InvalidArgumentError
from .protocol_pack import encode_header, encode_message, namespace_bytes, pack_hashes  # noqa: F401

#: a LOOKUP config with every option at its default: sent as 0 bytes
_DEFAULTS: dict = {}


def encode_lookup(
    request_id: int,
    lookup_id: str,
    namespaces: Sequence[Any],
    hashes: Any,
    token_counts: Any,
    pin: bool = True,
    prefetch: bool = True,
    config: dict | None = None,
    compute_tokens_per_s: float | None = None,
) -> bytes:
    """LOOKUP. ``token_counts``: one per hash (each sent as a u32; the server refuses 0 and
    counts over its ``maxTokensPerChunk``). The config JSON carries only non-default options
    (none -> 0 bytes), unless ``config`` is given: then that object is sent as compact JSON
    and ``pin``/``prefetch`` are ignored. ``compute_tokens_per_s`` (the engine's prefill rate,
    tokens/s, a positive finite number) adds ``computeTokensPerSec`` to it: the server then claims
    a tier's hits only where fetching them beats computing them, and its answer carries the tier
    rates (docs/protocol.md 4.1).
    """
    if config is None:
        if pin is True and prefetch is True:
            config = _DEFAULTS
        elif not isinstance(pin, bool) or not isinstance(prefetch, bool):
            raise InvalidArgumentError("pin and prefetch must be booleans")
        else:
            config = {k: False for k, on in (("pin", pin), ("prefetch", prefetch)) if not on}
    if compute_tokens_per_s is not None:
        config = {**config, "computeTokensPerSec": check_rate(compute_tokens_per_s)}
    return encode_message(
        "LOOKUP",
        request_id,
        {
            "lookup_id": lookup_id,
            "namespaces": namespaces,
            "hashes": hashes,
            "token_counts": token_counts,
            "config": config,
        },
    )


def check_rate(tokens_per_s: Any) -> float:
    """``tokens_per_s`` as a LOOKUP's ``computeTokensPerSec``.

    :raises InvalidArgumentError: unless it is a positive finite number (not a bool).
    """
    if (
        isinstance(tokens_per_s, bool)
        or not isinstance(tokens_per_s, (int, float))
        or not math.isfinite(tokens_per_s)
        or tokens_per_s <= 0
    ):
        raise InvalidArgumentError(f"compute_tokens_per_s must be a positive finite number, got {tokens_per_s!r}")
    return tokens_per_s


def encode_cancel(request_id: int, lookup_id: str) -> bytes:
    """CANCEL of a lookup id."""
    return encode_message("CANCEL", request_id, {"lookup_id": lookup_id})


def encode_clear(request_id: int, namespaces: Iterable[Any] = ()) -> bytes:
    """CLEAR of these namespaces (none: every namespace)."""
    return encode_message("CLEAR", request_id, {"namespaces": namespaces})


def encode_ping(request_id: int) -> bytes:
    return encode_message("PING", request_id, {})


def encode_stats(request_id: int) -> bytes:
    return encode_message("STATS", request_id, {})


def encode_put(request_id: int, namespace: Any, hash: Any, tokens: int, payload: Any) -> bytes:
    """PUT one chunk's bytes."""
    values = {"namespace": namespace, "hash": hash, "tokens": tokens, "payload": payload}
    return encode_message("PUT", request_id, values)


def encode_get(request_id: int, namespace: Any, hash: Any) -> bytes:
    """GET one chunk's bytes."""
    return encode_message("GET", request_id, {"namespace": namespace, "hash": hash})


def encode_register(request_id: int, registration: dict) -> bytes:
    """REGISTER: the registration object as compact UTF-8 JSON."""
    return encode_message("REGISTER", request_id, {"registration": registration})


def encode_save(
    request_id: int,
    engine_id: str,
    engine_request_id: str,
    skip_chunks: int,
    block_ids: Any,
    hashes: Any,
    not_after_ns: int | None = None,
    cuda_event: bytes | None = None,
    fence: tuple[int, int] | None = None,
) -> bytes:
    """SAVE blocks as chunks (``engine_request_id`` is the engine's request, a string).
    ``not_after_ns`` (the host's monotonic clock, ns; ``time.monotonic_ns()``) adds the optional
    trailing field: the server copies nothing past it and discards a copy that finishes after it;
    None leaves it out. ``cuda_event`` (the 64-byte ``cudaIpcEventHandle_t`` of an interprocess
    event recorded after the blocks were written) follows it: the server's copies wait for the
    event on the GPU (``not_after_ns`` is then written as 0 when None). ``fence`` = ``(slot,
    ticket)`` follows them (zeros before it when absent): the SAVE stands while slot ``slot`` of
    the registered state file holds ``ticket`` (docs/protocol.md 4.9, only to a server whose
    PONG lists ``saveFence``)."""
    values = {
        "engine_id": engine_id,
        "engine_request_id": engine_request_id,
        "skip_chunks": skip_chunks,
        "block_ids": block_ids,
        "chunk_hashes": hashes,
        "not_after_ns": not_after_ns,
        "cuda_event": cuda_event,
        "fence_slot": None if fence is None else fence[0],
        "fence_ticket": None if fence is None else fence[1],
    }
    return encode_message("SAVE", request_id, values)


def encode_load(
    request_id: int,
    engine_id: str,
    engine_request_id: str,
    lookup_id: str,
    block_ids: Any,
    hashes: Any,
    deadline_ms: int = 0,
    state_slot: int = -1,
    skip_blocks: int = 0,
    not_after_ns: int | None = None,
) -> bytes:
    """LOAD pinned chunks into blocks. ``skip_blocks`` > 0 adds the optional trailing field
    (leading blocks of the first chunk the engine already holds, absent from ``block_ids``);
    0 leaves it out, so servers without it accept the frame. ``not_after_ns`` (as for
    :func:`encode_save`: no chunk starts past it) follows ``skip_blocks``, which is then written
    too, 0 included."""
    values = {
        "engine_id": engine_id,
        "engine_request_id": engine_request_id,
        "lookup_id": lookup_id,
        "deadline_ms": deadline_ms,
        "state_slot": state_slot,
        "block_ids": block_ids,
        "chunk_hashes": hashes,
        "skip_blocks": skip_blocks if skip_blocks != 0 else None,
        "not_after_ns": not_after_ns,
    }
    return encode_message("LOAD", request_id, values)


def encode_hold(request_id: int, engine_id: str, engine_request_id: str, lookup_id: str) -> bytes:
    """HOLD a lookup's pins for an engine request."""
    values = {"engine_id": engine_id, "engine_request_id": engine_request_id, "lookup_id": lookup_id}
    return encode_message("HOLD", request_id, values)


def encode_request_finished(
    request_id: int, engine_id: str, engine_request_id: str, kind: str
) -> bytes:
    """REQUEST_FINISHED: ``kind`` is ``'finished'``, ``'aborted'`` or ``'preempted'``."""
    values = {"engine_id": engine_id, "engine_request_id": engine_request_id, "kind": kind}
    return encode_message("REQUEST_FINISHED", request_id, values)


def encode_heartbeat(request_id: int, engine_id: str) -> bytes:
    return encode_message("HEARTBEAT", request_id, {"engine_id": engine_id})


def encode_unregister(request_id: int, engine_id: str) -> bytes:
    return encode_message("UNREGISTER", request_id, {"engine_id": engine_id})
