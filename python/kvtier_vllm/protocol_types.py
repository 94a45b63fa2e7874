"""Protocol v1 constants (docs/protocol.md); the message type codes and reply objects are in the
generated message table (:mod:`.protocol_table`), the codec in :mod:`.protocol_encode` and
:mod:`.protocol_decode`, all of it re-exported by :mod:`.protocol`."""

from __future__ import annotations

from .protocol_table import MESSAGES

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


#: REQUEST_FINISHED kind names and their wire bytes.
REQUEST_END_KINDS = {
    name: i
    for f in MESSAGES["REQUEST_FINISHED"]["fields"]
    if f["kind"] == "enum"
    for i, name in enumerate(f["names"])
}
