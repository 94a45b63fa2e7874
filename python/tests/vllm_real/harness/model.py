"""What an engine is: the model's shape (a config directory vLLM's ``ModelConfig`` reads), its KV
cache, vLLM's settings and kvtier's extra config; and the ``VllmConfig`` built from them with
vLLM's own config classes."""

from __future__ import annotations

import json
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

#: Attention layers' names, as vLLM's Llama names them (the connector reads layer indices from them).
LAYER_NAME = "model.layers.{}.self_attn.attn"

_MODEL_DIRS: dict[tuple, Path] = {}


def model_dir(layers: int, kv_heads: int, head_dim: int, mla: bool = False) -> Path:
    """A directory holding a Hugging Face ``config.json`` of this shape (made once per process):
    Llama (KV heads × head size), or DeepSeek-V2 for MLA (a latent of ``head_dim``)."""
    key = (layers, kv_heads, head_dim, mla)
    if key in _MODEL_DIRS:
        return _MODEL_DIRS[key]
    d = Path(tempfile.mkdtemp(prefix="kvtier-vllm-model-"))
    if mla:
        cfg = {
            "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
            "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
            "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": layers,
            "kv_lora_rank": head_dim - 8, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
            "v_head_dim": 16, "q_lora_rank": None, "n_routed_experts": 4, "num_experts_per_tok": 2, "first_k_dense_replace": layers,
            "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
            "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
        }
    else:
        cfg = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 2 * kv_heads * head_dim, "intermediate_size": 128,
            "num_attention_heads": 2 * kv_heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
            "num_hidden_layers": layers, "vocab_size": 32000, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
        }
    (d / "config.json").write_text(json.dumps(cfg))
    _MODEL_DIRS[key] = d
    return d


@dataclass
class EngineSpec:
    """One vLLM engine over kvtier (see the module)."""

    endpoint: str
    #: kvtier's ``model_id`` (namespaces): engines share KV only under the same id.
    model_id: str = "vllm-real-model"
    layers: int = 2
    kv_heads: int = 4
    head_dim: int = 8
    mla: bool = False
    dtype: str = "float16"
    backend: str = "flash_attn"
    block_size: int = 16
    num_blocks: int = 64
    chunk_size: int = 32
    tp: int = 2
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    async_scheduling: bool = False
    #: vLLM's scheduling policy: ``fcfs`` or ``priority`` (preempts the lowest priority first).
    policy: str = "fcfs"
    #: vLLM's ``scheduler_reserve_full_isl``: a request is admitted only when its whole prompt
    #: fits (False: when its first chunk does, so running requests can outgrow the blocks).
    reserve_full_isl: bool = True
    kv_role: str = "kv_both"
    kv_load_failure_policy: str = "recompute"
    disable_hybrid_kv_cache_manager: bool = True
    enable_prefix_caching: bool = True
    #: vLLM's ``--kv-events-config``: events published on this ZMQ endpoint (None: off), under
    #: this topic (the first frame of every message).
    kv_events_endpoint: str | None = None
    kv_events_topic: str = ""
    #: vLLM's ``prefix_caching_hash_algo`` (``sha256_cbor`` with ``PYTHONHASHSEED`` set gives
    #: block hashes another program can compute).
    prefix_caching_hash_algo: str = "sha256"
    extra: dict = field(default_factory=dict)
    #: Ranks whose KV cache file the sidecar cannot open (their REGISTER fails).
    unopenable_ranks: tuple = ()
    #: The KV caches in process memory, as vLLM's CPU backend allocates them (no file).
    in_process_kv: bool = False
    #: Environment of the workers while the engine lives (the scheduler's is the test's own).
    env: dict = field(default_factory=dict)
    #: vLLM ``KVCacheGroupSpec`` list replacing the one full-attention group (hybrid models).
    kv_cache_groups: list | None = None
    #: A sidecar fault to start at a connector call: ``(role, method, action)``, role
    #: ``scheduler`` or ``worker`` (rank 0), see :mod:`.faults`.
    fault_at: tuple | None = None
    engine_id: str = field(default_factory=lambda: f"vllm-real-{uuid.uuid4().hex[:8]}")

    #: The connector's settings at kvtier's defaults, as a deployment has them; else shorter
    #: timeouts that keep fault scenarios short (heartbeats at 0.2 s, so a restarted sidecar
    #: knows the workers again at once; a silent sidecar probed after 2 s) and the rule "never
    #: slower than recomputing" off: the stand-in model computes far faster than a real one,
    #: so its learned rate would decline what these tests load (tests/vllm_real/test_prefill_rate.py
    #: tests the rule).
    default_timeouts: bool = False

    def extra_config(self) -> dict:
        short = {
            "lookup_timeout_ms": 3000,
            "request_timeout_ms": 5000,
            "liveness_timeout_ms": 2000,
            "heartbeat_interval_ms": 200,
            "prefill_tokens_per_s": "off",
        }
        return {
            "endpoint": self.endpoint,
            "chunk_size": self.chunk_size,
            "model_id": self.model_id,
            **({} if self.default_timeouts else short),
            **self.extra,
        }

    def vllm_config(self):
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            KVTransferConfig,
            ModelConfig,
            ParallelConfig,
            SchedulerConfig,
            VllmConfig,
        )

        model = ModelConfig(
            model=str(model_dir(self.layers, self.kv_heads, self.head_dim, self.mla)),
            dtype=self.dtype,
            seed=0,
            skip_tokenizer_init=True,
            max_model_len=4096,
        )
        kw = {}
        if self.kv_events_endpoint is not None:
            from vllm.config import KVEventsConfig

            kw["kv_events_config"] = KVEventsConfig(
                enable_kv_cache_events=True, publisher="zmq", endpoint=self.kv_events_endpoint, topic=self.kv_events_topic
            )
        cfg = VllmConfig(
            model_config=model,
            cache_config=CacheConfig(
                block_size=self.block_size,
                enable_prefix_caching=self.enable_prefix_caching,
                prefix_caching_hash_algo=self.prefix_caching_hash_algo,
            ),
            scheduler_config=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                max_model_len=4096,
                is_encoder_decoder=False,
                async_scheduling=self.async_scheduling,
                policy=self.policy,
                scheduler_reserve_full_isl=self.reserve_full_isl,
                disable_hybrid_kv_cache_manager=self.disable_hybrid_kv_cache_manager,
            ),
            parallel_config=ParallelConfig(tensor_parallel_size=self.tp),
            kv_transfer_config=KVTransferConfig(
                kv_connector="KvtierConnector",
                kv_connector_module_path="kvtier_vllm.connector",
                kv_role=self.kv_role,
                engine_id=self.engine_id,
                kv_load_failure_policy=self.kv_load_failure_policy,
                kv_connector_extra_config=self.extra_config(),
            ),
            device_config=DeviceConfig("cpu"),
            **kw,
        )
        cfg.cache_config.num_gpu_blocks = self.num_blocks
        return cfg

    def kv_cache_config(self, vllm_config):
        """vLLM's ``KVCacheConfig`` of this engine: one group of every attention layer."""
        import torch
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            MLAAttentionSpec,
        )

        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[self.dtype]
        names = [LAYER_NAME.format(i) for i in range(self.layers)]
        per_rank_heads = 1 if self.mla else self.kv_heads // self.tp
        if self.mla:
            spec = MLAAttentionSpec(block_size=self.block_size, num_kv_heads=1, head_size=self.head_dim, dtype=dtype)
        else:
            spec = FullAttentionSpec(block_size=self.block_size, num_kv_heads=per_rank_heads, head_size=self.head_dim, dtype=dtype)
        groups = self.kv_cache_groups if self.kv_cache_groups is not None else [KVCacheGroupSpec(names, spec)]
        return KVCacheConfig(num_blocks=self.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
