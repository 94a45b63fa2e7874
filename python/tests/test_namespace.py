"""Namespace derivation against docs/protocol.md section 9.2 and the TypeScript implementation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvtier_vllm.errors import InvalidArgumentError
from kvtier_vllm.namespace import (
    DTYPE_BYTES,
    bytes_per_token,
    derive_namespace,
    head_covers,
    kv_head_range,
    normalize_dtype,
)

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_MD = (ROOT / "docs" / "protocol.md").read_text()
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "cross-language.json").read_text())

LLAMA = dict(
    model_id="meta-llama/Meta-Llama-3-8B", dtype="bfloat16", num_layers=32, num_kv_heads=8, head_dim=128, block_size=16
)
DSV3 = dict(
    model_id="deepseek-ai/DeepSeek-V3", dtype="bfloat16", num_layers=61, num_kv_heads=1, head_dim=576, block_size=64, mla=True
)

_KEYS = {
    "model_id": "model_id",
    "dtype": "dtype",
    "num_layers": "num_layers",
    "num_kv_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "block_size": "block_size",
    "layout_version": "layout_version",
    "pp_size": "pp_size",
    "pp_rank": "pp_rank",
    "pp_first_layer": "pp_first_layer",
}


def _worked_examples() -> list[tuple[dict, str]]:
    """Every canonical encoding printed in section 9.2's worked example, as (kwargs, text)."""
    start = PROTOCOL_MD.index("#### Worked example", PROTOCOL_MD.index("### 9.2"))
    text = PROTOCOL_MD[start : PROTOCOL_MD.index("#### Bytes per token", start)]
    out = []
    for block in re.findall(r"```\n(kvtier-ns/v2\n.*?)```", text, re.S):
        kw: dict = {}
        heads = None
        for line in block.splitlines()[1:]:
            k, v = line.split("=", 1)
            if k == "mla":
                kw["mla"] = v == "1"
            elif v == "*":
                continue
            elif k == "kv_head_start":
                heads = [int(v), None]
            elif k == "kv_head_end":
                heads[1] = int(v)
            else:
                kw[_KEYS[k]] = v if k in ("model_id", "dtype") else int(v)
        if heads is not None:  # the TP size and rank that hold exactly these heads
            width = heads[1] - heads[0]
            kw["tp_size"], kw["tp_rank"] = kw["num_kv_heads"] // width, heads[0] // width
        out.append((kw, block))
    return out


def test_worked_example_encodings():
    examples = _worked_examples()
    assert len(examples) >= 2, "the TP example and the pipeline-parallel one"
    for kw, block in examples:
        assert derive_namespace(**kw).encoding == block


def _doc_mentions(hex_id: str) -> bool:
    return f"`{hex_id}`" in PROTOCOL_MD


@pytest.mark.parametrize(
    "kw,hex_id,label",
    [
        (dict(LLAMA, tp_size=2, tp_rank=0), "a9da765632a7de95394439b16b6ed39f", "meta-llama/Meta-Llama-3-8B/bfloat16/L32/H8x128/B16/h0-4/v1"),
        (dict(LLAMA, tp_size=2, tp_rank=1), "cdf60246c253dbe1fb1715f1dee10c2a", None),
        (dict(DSV3, tp_size=8, tp_rank=3), "585a8179300136bff281ba3e15397a88", "deepseek-ai/DeepSeek-V3/bfloat16/L61/H1x576/B64/mla/v1"),
        (dict(DSV3, tp_size=1, tp_rank=0), "585a8179300136bff281ba3e15397a88", None),
        (dict(LLAMA, tp_size=1, tp_rank=0), "8c7025b306a898cef85b1f8156b8dbc4", None),
        (dict(LLAMA, tp_size=4, tp_rank=1), "d3202475ecb0fac57b91f463a0761984", None),
        (dict(LLAMA, tp_size=16, tp_rank=5), "f28719570c2cbf3b30aaa6bcaf21214e", None),
        (
            dict(LLAMA, num_layers=8, tp_size=2, pp_size=4, pp_rank=1, pp_first_layer=8),
            "be9f7e0c33e72523732cc63c326f401d",
            "meta-llama/Meta-Llama-3-8B/bfloat16/L8/H8x128/B16/h0-4/pp4r1@L8/v1",
        ),
        (dict(LLAMA, num_layers=8, tp_size=2, pp_size=4, pp_rank=0, pp_first_layer=0), "6cc2e884566277c77191b53f6de3433b", None),
        (dict(LLAMA, num_layers=8, tp_size=2, pp_size=4, pp_rank=2, pp_first_layer=16), "46c457496ad2173e5c2ee07fd8eb3dcd", None),
        (dict(LLAMA, num_layers=8, tp_size=2, pp_size=4, pp_rank=3, pp_first_layer=24), "5c38d8197a4597ed256097154ffab332", None),
        (dict(DSV3, num_layers=30, tp_size=8, tp_rank=3, pp_size=2, pp_rank=1, pp_first_layer=31), "6bbcf286cb2041fd8ca787ff1e95a52f", None),
    ],
)
def test_protocol_md_ids(kw, hex_id, label):
    assert _doc_mentions(hex_id), f"{hex_id} is no longer in docs/protocol.md"
    ns = derive_namespace(**kw)
    assert ns.hex == hex_id and ns.id == bytes.fromhex(hex_id) and len(ns.id) == 16
    if label is not None:
        assert ns.label == label
        if "/mla/" not in label:  # the doc prints the labels of its Llama examples
            assert f"`{label}`" in PROTOCOL_MD


def _kwargs(spec: dict) -> dict:
    snake = {
        "modelId": "model_id",
        "dtype": "dtype",
        "numLayers": "num_layers",
        "numKvHeads": "num_kv_heads",
        "headDim": "head_dim",
        "blockSize": "block_size",
        "tpSize": "tp_size",
        "tpRank": "tp_rank",
        "mla": "mla",
        "layoutVersion": "layout_version",
        "ppSize": "pp_size",
        "ppRank": "pp_rank",
        "ppFirstLayer": "pp_first_layer",
    }
    return {snake[k]: v for k, v in spec.items()}


@pytest.mark.parametrize("case", FIXTURE["namespaces"], ids=[c["name"] for c in FIXTURE["namespaces"]])
def test_cross_language_namespaces(case):
    kw = _kwargs(case["spec"])
    ns = derive_namespace(**kw)
    assert ns.hex == case["id"]
    assert ns.label == case["label"]
    assert ns.encoding == case["encoding"]
    assert list(kv_head_range(**kw)) == case["heads"]
    covers = [
        {"width": w, "shards": [[a, b, n.hex] for a, b, n in shards]} for w, shards in head_covers(**kw)
    ]
    assert covers == case["covers"]


def test_tp_sizes_share_by_heads():
    # rank 2 of TP 8 and rank 5 of TP 16 hold head 2 alone; rank 1 of TP 4 holds heads 2..3
    assert derive_namespace(**LLAMA, tp_size=8, tp_rank=2) == derive_namespace(**LLAMA, tp_size=16, tp_rank=5)
    assert kv_head_range(**LLAMA, tp_size=4, tp_rank=1) == (2, 4)
    tp1 = dict(head_covers(**LLAMA, tp_size=1, tp_rank=0))
    assert [n for _, _, n in tp1[4]] == [derive_namespace(**LLAMA, tp_size=2, tp_rank=r) for r in (0, 1)]
    assert head_covers(**DSV3, tp_size=8, tp_rank=3) == []


def test_pipeline_stages_never_share_and_pp1_is_plain():
    ids = {derive_namespace(**dict(LLAMA, num_layers=16, pp_size=2, pp_rank=r, pp_first_layer=16 * r)).hex for r in range(2)}
    assert len(ids) == 2
    # two stages with equal layer counts differ even if everything else is equal
    assert derive_namespace(**dict(LLAMA, pp_size=2, pp_rank=0)).hex != derive_namespace(**dict(LLAMA, pp_size=2, pp_rank=1)).hex
    assert derive_namespace(**dict(LLAMA, pp_size=1)).hex == derive_namespace(**LLAMA).hex
    # MLA ranks share, MLA stages do not
    assert derive_namespace(**dict(DSV3, tp_size=4, tp_rank=1)).hex == derive_namespace(**DSV3).hex
    assert derive_namespace(**dict(DSV3, pp_size=2, pp_rank=0)).hex != derive_namespace(**dict(DSV3, pp_size=2, pp_rank=1)).hex


@pytest.mark.parametrize(
    "spelling,canonical",
    [
        ("bf16", "bfloat16"),
        ("torch.bfloat16", "bfloat16"),
        ("  Torch.Float16 ", "float16"),
        ("half", "float16"),
        ("FP32", "float32"),
        ("float", "float32"),
        ("fp8", "float8_e4m3"),
        ("float8_e4m3fn", "float8_e4m3"),
        ("e5m2", "float8_e5m2"),
        ("int8", "int8"),
        ("uint8", "uint8"),
    ],
)
def test_dtype_aliases(spelling, canonical):
    assert normalize_dtype(spelling) == canonical


@pytest.mark.parametrize("bad", ["auto", "float8_e4m3fnuz", "", "fp4", None, 16])
def test_dtype_refused(bad):
    with pytest.raises(InvalidArgumentError):
        normalize_dtype(bad)


def test_numpy_dtype_objects():
    np = pytest.importorskip("numpy")
    assert normalize_dtype(np.dtype("float16")) == "float16"


def test_bytes_per_token():
    assert bytes_per_token(**LLAMA) == 131072
    assert bytes_per_token(**dict(LLAMA, tp_size=2)) == 65536
    assert bytes_per_token(**dict(LLAMA, tp_size=16)) == 2 * 32 * 1 * 128 * 2  # replicated heads
    assert bytes_per_token(**DSV3) == 70272
    assert set(DTYPE_BYTES) == {"float32", "float16", "bfloat16", "float8_e4m3", "float8_e5m2", "int8", "uint8"}


@pytest.mark.parametrize(
    "override,match",
    [
        (dict(model_id=""), "model_id"),
        (dict(model_id=" x"), "whitespace"),
        (dict(model_id="x\u3000"), "whitespace"),
        (dict(model_id="a\nb"), "control"),
        (dict(model_id="a\x7fb"), "control"),
        (dict(model_id="a\ud800"), "well-formed"),
        (dict(model_id="x" * 513), "at most 512"),
        (dict(model_id="\U0001f680" * 257), "at most 512"),  # UTF-16 units, as the spec counts
        (dict(num_layers=0), "num_layers"),
        (dict(num_layers=100_001), "num_layers"),
        (dict(num_layers=True), "num_layers"),
        (dict(num_kv_heads=0), "num_kv_heads"),
        (dict(head_dim=2**20 + 1), "head_dim"),
        (dict(block_size=1.0), "block_size"),
        (dict(tp_size=3), "divide"),
        (dict(tp_size=2, tp_rank=2), "tp_rank"),
        (dict(tp_size=65537), "tp_size"),
        (dict(layout_version=0), "layout_version"),
        (dict(mla=1), "mla"),
        (dict(pp_size=0), "pp_size"),
        (dict(pp_size=1025), "pp_size"),
        (dict(pp_size=2, pp_rank=2), "pp_rank"),
        (dict(pp_first_layer=4), "pp_first_layer must be 0"),
        (dict(pp_size=2, pp_first_layer=-1), "pp_first_layer"),
    ],
)
def test_refused_specs(override, match):
    with pytest.raises(InvalidArgumentError, match=match):
        derive_namespace(**dict(LLAMA, **override))


def test_accepted_edge_specs():
    derive_namespace(**dict(LLAMA, model_id="\U0001f680" * 256))  # 512 UTF-16 units
    derive_namespace(**dict(LLAMA, model_id="a\x85b"))  # not a C0 control: allowed, as in TS
    derive_namespace(**dict(LLAMA, tp_size=3, mla=True, num_kv_heads=1))  # MLA: no divisibility rule
