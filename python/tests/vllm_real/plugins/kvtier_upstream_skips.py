"""A pytest plugin for the run of vLLM's own connector unit tests (``-p kvtier_upstream_skips``):
the cases that need what this machine cannot have are reported as skipped, with the reason,
rather than left out unseen."""

from __future__ import annotations

import pytest

#: Case id -> why it cannot run on a machine without network access or a GPU.
NEEDS = {
    "tests/v1/kv_connector/unit/test_multi_connector.py::test_multi_example_connector_consistency":
        "builds vllm.LLM('facebook/opt-125m'): needs the model's weights and tokenizer from the Hugging Face hub",
    "tests/v1/kv_connector/unit/test_offloading_connector.py::test_tiering_offloading":
        "builds vllm.LLM('facebook/opt-125m'): needs the model's weights and tokenizer from the Hugging Face hub",
}


def pytest_collection_modifyitems(config, items):  # noqa: ARG001 - pytest's hook signature
    for item in items:
        base = item.nodeid.split("[", 1)[0]
        if base in NEEDS:
            item.add_marker(pytest.mark.skip(reason=NEEDS[base]))
