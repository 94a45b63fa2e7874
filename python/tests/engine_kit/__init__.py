"""The parts of the engines that drive kvtier's connector in the tests (python/tests/vllm_real
under vLLM's own code, python/tests/vllm_twin for other vLLM revisions): the KV a stand-in model
writes, the shared-memory KV caches it writes into, and the end-of-run checks on the sidecar."""
