"""``vllm.distributed.kv_transfer.kv_connector.v1``: the names re-exported here."""

from .base import KVConnectorBase_V1, KVConnectorRole, SupportsHMA

__all__ = ["KVConnectorBase_V1", "KVConnectorRole", "SupportsHMA"]
