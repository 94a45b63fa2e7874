"""kvtier's connector under vLLM's own code (the vendored vLLM commit): vLLM's ``Scheduler`` and
``AsyncScheduler``, its connector factory, ``ensure_kv_transfer_initialized`` and
``KVConnectorModelRunnerMixin`` drive ``KvtierConnector`` against a real sidecar. Runs in the
environment ``env.py`` makes (``npm run test:vllm``); without vLLM nothing here is collected."""
