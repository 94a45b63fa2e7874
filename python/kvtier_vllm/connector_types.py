"""Shapes shared by the scheduler-side and worker-side connectors (docs/connector.md).

They mirror vLLM's KV connector V1: the scheduler builds one :class:`ConnectorMeta` per step, the
engine hands it to every worker, and the workers report completions back as a
:class:`ConnectorOutput`. Everything here is plain data (picklable; vLLM ships the metadata to its
workers), with no vLLM import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence, Tuple, Union

__all__ = [
    "MmSpan",
    "ConnectorRequest",
    "LoadIntent",
    "SaveIntent",
    "RequestEnd",
    "ConnectorMeta",
    "ScheduledRequest",
    "ConnectorOutput",
    "END_KINDS",
]

#: An extra-input span that changes KV besides the tokens: (id, first prompt token, tokens).
MmSpan = Tuple[Union[bytes, str], int, int]

#: How a request left the scheduler: terminal (finished, aborted) or preempted (asks again).
END_KINDS = ("finished", "aborted", "preempted")


@dataclass(frozen=True)
class ConnectorRequest:
    """What the connectors read from an engine request."""

    request_id: str
    #: Prompt token ids, each in [0, 2**32). Hashed once per request and cached.
    prompt_token_ids: Sequence[int]
    #: Cache salt (tenant isolation); None: the connector's default salt.
    cache_salt: str | None = None
    #: LoRA adapter name (vLLM ``lora_request.lora_name``); None: no adapter.
    lora: str | None = None
    #: Multimodal placeholder spans, see :data:`MmSpan`.
    mm: Sequence[MmSpan] = ()
    #: True when the request ended by abort rather than by finishing.
    aborted: bool = False


@dataclass(frozen=True)
class LoadIntent:
    """Load a lookup's pinned chunks into blocks (worker: LOAD).

    Chunk ``first_chunk + i`` goes to ``block_ids[i * B - skip_blocks ...]`` (B blocks per chunk):
    the first chunk's leading ``skip_blocks`` blocks are the engine's own and are not listed.
    """

    request_id: str
    lookup_id: str
    first_chunk: int
    #: Tokens the load provides beyond the engine's prefix: chunks * chunk_size - skip_blocks * block_size.
    num_tokens: int
    block_ids: Tuple[int, ...]
    #: Packed 32-byte chunk hashes, one per chunk.
    chunk_hashes: bytes
    skip_blocks: int = 0
    #: The LOAD's deadline, ms (0: the worker's ``load_timeout_ms``): with the engine's prefill
    #: rate, about the time computing the tokens takes, so a sidecar that cannot load them in
    #: that time holds the request no longer than computing them would.
    deadline_ms: int = 0
    #: Layer by layer, in the step that schedules the request (vLLM's synchronous load): the
    #: forward pass waits for each layer in ``wait_for_layer_load`` and overlaps the rest.
    layerwise: bool = False


@dataclass(frozen=True)
class SaveIntent:
    """Save the blocks of full prompt chunks after this step's forward pass (worker: SAVE)."""

    request_id: str
    first_chunk: int
    block_ids: Tuple[int, ...]
    chunk_hashes: bytes


@dataclass(frozen=True)
class RequestEnd:
    """A request that ended since the last metadata."""

    request_id: str
    kind: str  # one of END_KINDS
    #: True when the scheduler kept the blocks (vLLM ``delay_free_blocks``): a worker reports the
    #: id in ``finished_sending`` once its transfers are over.
    delay_free: bool


@dataclass(frozen=True)
class ConnectorMeta:
    """The per-step metadata, built once and consumed once."""

    loads: Tuple[LoadIntent, ...] = ()
    saves: Tuple[SaveIntent, ...] = ()
    finished: Tuple[RequestEnd, ...] = ()

    def preempted(self) -> list[str]:
        """Ids of the requests preempted in this step (their saves must end before block reuse)."""
        return [e.request_id for e in self.finished if e.kind == "preempted"]


@dataclass(frozen=True)
class ScheduledRequest:
    """One request the scheduler runs this step (vLLM ``NewRequestData`` / ``CachedRequestData``)."""

    request: ConnectorRequest
    #: The request's whole block table, from its first block.
    block_ids: Sequence[int]
    #: Tokens whose KV existed before this step (local prefix cache and loads included).
    num_computed_tokens: int
    #: Tokens this step computes.
    num_scheduled_tokens: int


@dataclass
class ConnectorOutput:
    """Completions the workers reported (vLLM ``KVConnectorOutput``), fed back to the scheduler."""

    finished_sending: Iterable[str] = field(default_factory=set)
    finished_recving: Iterable[str] = field(default_factory=set)
    #: Blocks of failed loads; the engine recomputes from the first of them.
    invalid_block_ids: Iterable[int] = field(default_factory=set)
