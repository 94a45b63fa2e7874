"""What a stand-in model writes into a vLLM KV cache, and the shared-memory KV caches it writes
into: used by the engines that drive kvtier's connector (python/tests/vllm_real under vLLM's own
code, python/tests/vllm_twin for other vLLM revisions)."""
