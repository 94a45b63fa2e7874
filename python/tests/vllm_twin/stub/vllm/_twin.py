"""Which vLLM revision the stand-in behaves as (set once per process, before anything is built).

``FIXTURE`` is the commit python/tests/fixtures/vllm_abstract_methods.json names: its
``scheduler.py`` and ``kv_connector/v1/base.py`` were read at that commit (``get_finished``; no
``get_transfer_results``). Its ``get_kv_connector_cache_layout`` is modelled on the helper that
answers ``"NHD"`` when no connector requires a layout (``utils.py`` at 18157ec2; the fixture
commit's own ``utils.py`` is not in the source index).

``CURRENT`` is commit 00f4240e: ``kv_connector/utils.py`` (the layout helper answers ``None``
when no connector requires a layout; the output aggregator carries ``failed_recving``) and
``v1/worker/kv_connector_model_runner_mixin.py`` (``get_transfer_results``; asynchronous loads
started after the forward pass) were read at that commit.
"""

from __future__ import annotations

FIXTURE = "003df2961dd8830c317a61f9745ccd557da9fa06"
CURRENT = "00f4240ee6458263d76cf51ca7901ce1350bb4d1"
VERSIONS = (FIXTURE, CURRENT)

_version = FIXTURE


def use(version: str) -> None:
    """Selects the modelled revision (one of :data:`VERSIONS`)."""
    global _version
    if version not in VERSIONS:
        raise ValueError(f"unknown vLLM revision {version!r}; modelled: {VERSIONS}")
    _version = version


def version() -> str:
    return _version


def is_current() -> bool:
    return _version == CURRENT
