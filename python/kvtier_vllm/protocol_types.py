"""Protocol v1 constants, message type codes and reply objects (docs/protocol.md); the codec is
in :mod:`.protocol_encode` and :mod:`.protocol_decode`, all of it re-exported by :mod:`.protocol`."""

from __future__ import annotations

from typing import NamedTuple, Union

MAGIC = 0x766B  # the bytes 6b 76, "kv"
VERSION = 1
HEADER_BYTES = 8
HASH_BYTES = 32
#: Bytes of a CUDA interprocess event handle (``cudaIpcEventHandle_t``), SAVE's optional ``cudaEvent``.
CUDA_EVENT_BYTES = 64
NAMESPACE_BYTES = 16
MAX_LOOKUP_ID_BYTES = 256
MAX_NAMESPACES_PER_LOOKUP = 16
MAX_CHUNKS_PER_LOOKUP = 65536  # wire maximum; servers default to 8192
MAX_CONFIG_BYTES = 4096
MAX_ID_BYTES = 256
MAX_REGISTRATION_BYTES = 1024 * 1024
MAX_BLOCKS_PER_MESSAGE = 262_144
MAX_CHUNKS_PER_MESSAGE = 65_536
MAX_ERROR_CODE_BYTES = 64
_U32_MAX = 0xFFFF_FFFF


class MsgType:
    """Message type codes; a reply's code is its request's with the high bit set."""

    LOOKUP = 0x01
    CANCEL = 0x02
    CLEAR = 0x03
    PING = 0x04
    PUT = 0x05
    GET = 0x06
    STATS = 0x07
    REGISTER = 0x08
    SAVE = 0x09
    LOAD = 0x0A
    HOLD = 0x0B
    REQUEST_FINISHED = 0x0C
    HEARTBEAT = 0x0D
    UNREGISTER = 0x0E
    LOOKUP_RESULT = 0x81
    CANCEL_RESULT = 0x82
    CLEAR_RESULT = 0x83
    PONG = 0x84
    PUT_RESULT = 0x85
    GET_RESULT = 0x86
    STATS_RESULT = 0x87
    REGISTER_RESULT = 0x88
    SAVE_RESULT = 0x89
    LOAD_RESULT = 0x8A
    HOLD_RESULT = 0x8B
    REQUEST_FINISHED_RESULT = 0x8C
    HEARTBEAT_RESULT = 0x8D
    UNREGISTER_RESULT = 0x8E
    ERROR = 0xFF


#: REQUEST_FINISHED kind names and their wire bytes.
REQUEST_END_KINDS = {"finished": 0, "aborted": 1, "preempted": 2}
_LOOKUP_STATUS = ("ok", "canceled", "stale")
_PUT_OUTCOME = ("stored", "exists", "dropped")

# ------------------------------------------------------------------------------------------
# Reply objects


class TierTokens(NamedTuple):
    tier: str
    tokens: int


class LookupResult(NamedTuple):
    """LOOKUP_RESULT: ``status`` is ``'ok'``, ``'canceled'`` or ``'stale'``."""

    lookup_id: str
    status: str
    epoch: int
    hit_tokens: int
    hit_chunks: int
    tiers: list


class CancelResult(NamedTuple):
    found: bool


class ClearResult(NamedTuple):
    epoch: int


class Pong(NamedTuple):
    info: dict


class StatsResult(NamedTuple):
    stats: dict


class PutResult(NamedTuple):
    """``outcome``: ``'stored'``, ``'exists'`` or ``'dropped'``."""

    outcome: str


class GetResult(NamedTuple):
    found: bool
    tokens: int
    payload: bytes


class RegisterResult(NamedTuple):
    engine_id: str
    namespace: bytes
    chunk_size: int
    block_size: int


class SaveResult(NamedTuple):
    saved: int
    skipped: int
    dropped: int


class LoadResult(NamedTuple):
    loaded_tokens: int
    invalid_block_ids: list


class HoldResult(NamedTuple):
    held_chunks: int


class RequestFinishedResult(NamedTuple):
    released: bool


class HeartbeatResult(NamedTuple):
    known: bool


class UnregisterResult(NamedTuple):
    released: bool


class ErrorReply(NamedTuple):
    """ERROR: ``code`` is a known code (unknown ones read as ``KVT_INTERNAL``); ``raw_code`` is
    what the server sent."""

    code: str
    message: str
    raw_code: str


Reply = Union[
    LookupResult,
    CancelResult,
    ClearResult,
    Pong,
    StatsResult,
    PutResult,
    GetResult,
    RegisterResult,
    SaveResult,
    LoadResult,
    HoldResult,
    RequestFinishedResult,
    HeartbeatResult,
    UnregisterResult,
    ErrorReply,
]
