"""The vLLM adapter: its methods against vLLM's abstract methods (a fixture taken from vLLM's
source, and vLLM's class itself where vLLM is importable), its settings, and the vLLM-free
conversions it delegates to."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvtier_vllm.config import KvtierConfig
from kvtier_vllm.connector_types import ConnectorRequest
from kvtier_vllm.errors import ConfigError
from kvtier_vllm.namespace import derive_namespace
from kvtier_vllm.vllm_glue import BlockTables, all_rank_namespaces, connector_request, first_group, model_shape, pp_layer_range

HERE = Path(__file__).resolve().parent
FIXTURE = json.loads((HERE / "fixtures" / "vllm_abstract_methods.json").read_text())
ADAPTER = HERE.parent / "kvtier_vllm" / "connector.py"
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    out = [p.arg for p in a.posonlyargs + a.args]
    if a.vararg:
        out.append("*" + a.vararg.arg)
    out += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        out.append("**" + a.kwarg.arg)
    return out


def _adapter_methods() -> dict[str, list[str]]:
    tree = ast.parse(ADAPTER.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KvtierConnector")
    return {n.name: _params(n) for n in cls.body if isinstance(n, ast.FunctionDef)}


def test_fixture_names_its_vllm_commit():
    assert len(FIXTURE["commit"]) == 40 and FIXTURE["class"] == "KVConnectorBase_V1"


def test_adapter_implements_every_abstract_method_with_vllms_parameters():
    methods = _adapter_methods()
    for name, params in {**FIXTURE["abstract"], **FIXTURE["hooks"], **FIXTURE["classmethods"]}.items():
        assert name in methods, f"KvtierConnector lacks {name}"
        assert methods[name] == params, f"{name}: {methods[name]} != vLLM's {params}"
    assert methods["__init__"] == FIXTURE["init"]
    for prop in FIXTURE["properties"]:
        assert prop in methods


def test_adapter_is_the_only_module_importing_vllm():
    pkg = ADAPTER.parent
    for path in pkg.glob("*.py"):
        tree = ast.parse(path.read_text())
        mods = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        mods += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        uses = any(m == "vllm" or m.startswith("vllm.") for m in mods)
        assert uses == (path.name == "connector.py"), path.name


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed here (pip install vllm on a GPU host to run this check)")
def test_adapter_against_vllms_base_class():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    from kvtier_vllm.connector import KvtierConnector

    assert issubclass(KvtierConnector, KVConnectorBase_V1)
    for name in getattr(KVConnectorBase_V1, "__abstractmethods__", ()):
        mine = getattr(KvtierConnector, name)
        assert list(inspect.signature(mine).parameters) == list(inspect.signature(getattr(KVConnectorBase_V1, name)).parameters), name
    assert not getattr(KvtierConnector, "__abstractmethods__", None)


def test_config_defaults_and_validation():
    c = KvtierConfig.from_extra({"endpoint": "tcp://10.0.0.1:6000", "chunk_size": 512, "kv_layout": "hnd"})
    assert (c.endpoint, c.chunk_size, c.kv_layout, c.lookup_timeout_ms) == ("tcp://10.0.0.1:6000", 512, "HND", 2000)
    for bad in ({"endpoit": "x"}, {"endpoint": "127.0.0.1:5555"}, {"chunk_size": 0}, {"kv_layout": "XYZ"}, {"load": "yes"}):
        with pytest.raises(ConfigError):
            KvtierConfig.from_extra(bad)


def test_connector_request_from_a_vllm_like_request():
    req = SimpleNamespace(
        request_id="r1",
        prompt_token_ids=[1, 2, 3],
        cache_salt="s",
        lora_request=SimpleNamespace(lora_name="adapter-a"),
        mm_features=[SimpleNamespace(mm_hash="abc", identifier="x-abc", mm_position=SimpleNamespace(offset=1, length=2))],
        status=SimpleNamespace(name="FINISHED_ABORTED"),
    )
    assert connector_request(req) == ConnectorRequest("r1", (1, 2, 3), "s", "adapter-a", (("abc", 1, 2),), True)
    assert connector_request(SimpleNamespace(request_id="r2", prompt_token_ids=None)).prompt_token_ids == ()


def test_block_tables_from_scheduler_outputs():
    bt = BlockTables(4)
    req = ConnectorRequest("a", tuple(range(40)))
    bt.remember(req)
    first = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="a", block_ids=([1, 2, 3],), num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[], num_computed_tokens=[], resumed_req_ids=set()),
        num_scheduled_tokens={"a": 12},
    )
    (s,) = bt.scheduled(first)
    assert (list(s.block_ids), s.num_computed_tokens, s.num_scheduled_tokens) == ([1, 2, 3], 0, 12)
    nxt = SimpleNamespace(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=SimpleNamespace(req_ids=["a"], new_block_ids=[([4, 5],)], num_computed_tokens=[12], resumed_req_ids=set()),
        num_scheduled_tokens={"a": 8},
    )
    assert list(bt.scheduled(nxt)[0].block_ids) == [1, 2, 3, 4, 5]
    resumed = SimpleNamespace(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=SimpleNamespace(req_ids=["a"], new_block_ids=[([9, 8],)], num_computed_tokens=[0], resumed_req_ids={"a"}),
        num_scheduled_tokens={"a": 8},
    )
    assert list(bt.scheduled(resumed)[0].block_ids) == [9, 8]
    assert first_group(SimpleNamespace(get_block_ids=lambda: ([7, 6], [1]))) == [7, 6]


def _vllm_config(tp=2, pp=2, layers=30, mla=False, cache_dtype="auto"):
    return SimpleNamespace(
        model_config=SimpleNamespace(
            model="org/model", dtype="torch.bfloat16", use_mla=mla,
            get_total_num_hidden_layers=lambda: layers, get_total_num_kv_heads=lambda: 8, get_head_size=lambda: 576 if mla else 128,
        ),
        cache_config=SimpleNamespace(block_size=16, cache_dtype=cache_dtype),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp),
    )


def test_every_ranks_namespace_from_the_model_config():
    shape = model_shape(_vllm_config(), KvtierConfig())
    assert (shape.dtype, shape.num_layers, shape.world) == ("bfloat16", 30, 4)
    ranks = all_rank_namespaces(shape)
    assert [(k, sfx) for k, _, sfx in ranks] == [(0, "@r0"), (1, "@r1"), (2, "@r2"), (3, "@r3")]
    assert len({ns for _, ns, _ in ranks}) == 4, "two stages with equal layer counts do not share KV"
    assert ranks[2][1] == derive_namespace(
        model_id="org/model", dtype="bfloat16", num_layers=15, num_kv_heads=8, head_dim=128, block_size=16,
        tp_size=2, tp_rank=0, pp_size=2, pp_rank=1, pp_first_layer=15,
    ).id
    single = all_rank_namespaces(model_shape(_vllm_config(tp=1, pp=1), KvtierConfig()))
    assert [sfx for _, _, sfx in single] == [""]
    fp8 = model_shape(_vllm_config(cache_dtype="fp8"), KvtierConfig())
    assert fp8.dtype == "fp8"


def test_pp_layer_ranges_follow_vllm():
    assert [pp_layer_range(61, r, 4) for r in range(4)] == [(0, 15), (15, 30), (30, 46), (46, 61)]
    assert pp_layer_range(10, 1, 2, "3,7") == (3, 10)
    with pytest.raises(ConfigError):
        pp_layer_range(10, 0, 2, "3,3")
