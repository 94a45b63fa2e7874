"""The kvtier protocol v1 codec (docs/protocol.md), the only encoder/decoder of the package.

Encoders (``encode_<message>``, one per request, generated from the message table into
:mod:`.protocol_encode`) build one request frame (header included) and refuse, before
sending, what the wire cannot carry (:class:`~kvtier_vllm.errors.InvalidArgumentError` /
:class:`~kvtier_vllm.errors.TooLargeError`). :func:`decode_reply` decodes one reply frame
strictly: a short frame, another magic or version, an unknown type, a truncated field, bytes
after the last field, invalid UTF-8 or malformed JSON raise
:class:`~kvtier_vllm.errors.ProtocolError`; a string declared longer than its limit raises
:class:`~kvtier_vllm.errors.TooLargeError`. An ERROR reply decodes to :class:`ErrorReply`
(an unknown code reads as ``KVT_INTERNAL``); it is returned, not raised.

Namespaces are 16 raw bytes (a 32-hex-digit string or a ``Namespace`` is accepted too); hashes
are packed 32-byte digests (a list of digests or ``Chunk`` objects is accepted too).
"""

from __future__ import annotations

from .protocol_args import check_rate
from .protocol_decode import decode_header, decode_reply, peek_request_id
from .protocol_encode import *  # noqa: F403 -- encode_<message> of every request (generated)
from .protocol_encode import __all__ as _ENCODERS
from .protocol_pack import encode_header, encode_message, namespace_bytes, pack_hashes
from .protocol_table import (
    CancelResult,
    ClearResult,
    ErrorReply,
    GetResult,
    HeartbeatResult,
    HoldResult,
    LoadResult,
    LookupResult,
    MsgType,
    Pong,
    PutResult,
    RegisterResult,
    Reply,
    RequestFinishedResult,
    SaveResult,
    StatsResult,
    TierRate,
    TierTokens,
    UnregisterResult,
)
from .protocol_types import (
    HASH_BYTES,
    HEADER_BYTES,
    MAGIC,
    MAX_BLOCKS_PER_MESSAGE,
    MAX_CHUNKS_PER_LOOKUP,
    MAX_CHUNKS_PER_MESSAGE,
    MAX_CONFIG_BYTES,
    MAX_ERROR_CODE_BYTES,
    MAX_ID_BYTES,
    MAX_LOOKUP_ID_BYTES,
    MAX_NAMESPACES_PER_LOOKUP,
    MAX_REGISTRATION_BYTES,
    NAMESPACE_BYTES,
    REQUEST_END_KINDS,
    VERSION,
)

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_BYTES",
    "HASH_BYTES",
    "NAMESPACE_BYTES",
    "MAX_LOOKUP_ID_BYTES",
    "MAX_NAMESPACES_PER_LOOKUP",
    "MAX_CHUNKS_PER_LOOKUP",
    "MAX_CONFIG_BYTES",
    "MAX_ID_BYTES",
    "MAX_REGISTRATION_BYTES",
    "MAX_BLOCKS_PER_MESSAGE",
    "MAX_CHUNKS_PER_MESSAGE",
    "MsgType",
    "REQUEST_END_KINDS",
    "TierTokens",
    "TierRate",
    "LookupResult",
    "CancelResult",
    "ClearResult",
    "Pong",
    "StatsResult",
    "PutResult",
    "GetResult",
    "RegisterResult",
    "SaveResult",
    "LoadResult",
    "HoldResult",
    "RequestFinishedResult",
    "HeartbeatResult",
    "UnregisterResult",
    "ErrorReply",
    "Reply",
    "encode_header",
    "encode_message",
    "check_rate",
    *_ENCODERS,
    "decode_header",
    "decode_reply",
    "peek_request_id",
    "namespace_bytes",
    "pack_hashes",
]
