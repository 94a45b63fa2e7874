"""``KVConnectorFactory``: finds the connector class (built-in registry, else
``kv_connector_module_path``) and builds one per role, with vLLM's checks: a connector that does
not implement ``SupportsHMA`` is refused while the hybrid KV cache manager is on, and a class
whose ``__init__`` takes no ``kv_cache_config`` is built the old way."""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from .v1.base import KVConnectorRole, supports_hma


class KVConnectorFactory:
    _registry: dict[str, Callable[[], type]] = {}

    @classmethod
    def get_connector_class(cls, kv_transfer_config: Any) -> type:
        name = kv_transfer_config.kv_connector
        path = kv_transfer_config.kv_connector_module_path
        if path is not None:
            return getattr(importlib.import_module(path), name)
        if name in cls._registry:
            return cls._registry[name]()
        raise ValueError(f"Unsupported connector type: {name}")

    @classmethod
    def create_connector(cls, config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> Any:
        ktc = config.kv_transfer_config
        if ktc is None:
            raise ValueError("kv_transfer_config must be set to create a connector")
        connector_cls = cls.get_connector_class(ktc)
        hma_enabled = not config.scheduler_config.disable_hybrid_kv_cache_manager
        if hma_enabled and not supports_hma(connector_cls):
            raise ValueError(
                f"Connector {connector_cls.__name__} does not support HMA but "
                "HMA is enabled. Please set `--disable-hybrid-kv-cache-manager`."
            )
        if "kv_cache_config" not in inspect.signature(connector_cls.__init__).parameters:
            return connector_cls(config, role)
        return connector_cls(config, role, kv_cache_config)
