"""The engine the scenarios run: vLLM's scheduler in the test process, tensor-parallel worker
processes with vLLM's model-runner connector code around a stand-in forward pass."""
