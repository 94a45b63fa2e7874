"""The chunk hasher against docs/protocol.md section 9 (its test vectors and its reference script)
and against the TypeScript hasher (the cross-language fixture)."""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
from pathlib import Path

import pytest

from kvtier_vllm.errors import InvalidArgumentError
from kvtier_vllm.hashing import Chunk, hash_chunks, hash_seed, hex_to_hash, pack_hashes

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_MD = (ROOT / "docs" / "protocol.md").read_text()
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "cross-language.json").read_text())


def _section(title_prefix: str, next_prefix: str) -> str:
    start = PROTOCOL_MD.index(title_prefix)
    return PROTOCOL_MD[start : PROTOCOL_MD.index(next_prefix, start)]


def _parse_vectors() -> list[tuple[str, list[int], dict, list[tuple[int, int, str]]]]:
    """The lettered vectors of section 9.3: `**X.** <description>:` then a code block of
    `start end hash` lines (or "no chunks")."""
    text = _section("### 9.3 Test vectors", "#### Reference script")
    out = []
    for m in re.finditer(r"\*\*([A-Z])\.\*\* (.*?)(?=\n\*\*[A-Z]\.\*\*|\nNamespaces:)", text, re.S):
        letter, body = m.group(1), m.group(2)
        desc = body.split("```")[0]
        tm = re.search(r"tokens `([^`]*)`", desc)
        spec = tm.group(1)
        if ".." in spec:
            a, b = spec.split("..")
            tokens = list(range(int(a), int(b) + 1))
        else:
            tokens = json.loads(spec)
        kw: dict = {}
        if cm := re.search(r"chunkSize (\d+)", desc):
            kw["chunk_size"] = int(cm.group(1))
        if sm := re.search(r'salt `"([^"]*)"`', desc):
            kw["salt"] = sm.group(1)
        if lm := re.search(r'lora `"([^"]*)"`', desc):
            kw["lora"] = lm.group(1)
        if "partial on" in desc:
            kw["partial"] = True
        spans = re.findall(r'\("([^"]+)", (\d+), (\d+)\)', desc)
        if spans:
            kw["mm"] = [(i, int(o), int(n)) for i, o, n in spans]
        if "any options" in desc:
            kw["partial"] = True
        chunks: list[tuple[int, int, str]] = []
        if "no chunks" not in desc:
            block = body.split("```")[1]
            for line in block.strip().splitlines():
                s, e, h = line.split()
                chunks.append((int(s), int(e), h))
        out.append((letter, tokens, kw, chunks))
    return out


VECTORS = _parse_vectors()


def test_the_doc_has_every_vector():
    assert [v[0] for v in VECTORS][:8] == list("ABCDEFGH")
    assert {"I", "J", "K"} <= {v[0] for v in VECTORS}, "LoRA and mm vectors I, J, K"


@pytest.mark.parametrize("letter,tokens,kw,expected", VECTORS, ids=[v[0] for v in VECTORS])
def test_protocol_md_vectors(letter, tokens, kw, expected):
    got = [(c.start, c.end, c.hash.hex()) for c in hash_chunks(tokens, **kw)]
    assert got == expected


def test_protocol_md_seed_tables():
    table = _section("Seeds:", "**A.**")
    plain = re.findall(r'^\| `"([^"]*)"`\s*\| `([0-9a-f]{64})` \|$', table, re.M)
    lora = re.findall(r'^\| `"([^"]*)"`\s*\| `"([^"]*)"`\s*\| `([0-9a-f]{64})` \|$', table, re.M)
    assert len(plain) >= 3 and len(lora) >= 2
    for salt, seed in plain:
        assert hash_seed(salt).hex() == seed
    for salt, name, seed in lora:
        assert hash_seed(salt, name).hex() == seed


def _reference_script() -> dict:
    text = PROTOCOL_MD[PROTOCOL_MD.index("#### Reference script") :]
    code = text.split("```python")[1].split("```")[0]
    env: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, "protocol.md reference script", "exec"), env)
    return env


def test_against_the_reference_script_on_random_inputs():
    ref = _reference_script()
    rng = random.Random(1234)
    for _ in range(200):
        n = rng.randrange(0, 700)
        tokens = [rng.randrange(0, 2**32) for _ in range(n)]
        kw = dict(chunk_size=rng.choice([1, 3, 16, 64, 256]), partial=rng.random() < 0.5)
        if rng.random() < 0.5:
            kw["salt"] = rng.choice(["", "t", "tenant-β", "🚀"])
        if rng.random() < 0.4:
            kw["lora"] = rng.choice(["", "a", "lora-é"])
        if rng.random() < 0.5:
            kw["mm"] = [
                (rng.choice(["img", "aud", b"\x00\xff"]), rng.randrange(0, 800), rng.randrange(1, 300))
                for _ in range(rng.randrange(0, 5))
            ]
        ref_kw = dict(kw)
        if ref_kw.get("lora") is None:
            ref_kw.pop("lora", None)
        expected = ref["hash_chunks"](tokens, **ref_kw)
        got = [(c.start, c.end, c.hash.hex()) for c in hash_chunks(tokens, **kw)]
        assert got == expected, kw


@pytest.mark.parametrize("case", FIXTURE["hashes"], ids=[c["name"] for c in FIXTURE["hashes"]])
def test_cross_language_hashes(case):
    spec = case["tokens"]
    if isinstance(spec, list):
        tokens = spec
    elif "range" in spec:
        tokens = list(range(*spec["range"]))
    else:
        n, x, mod = spec["lcg"]
        tokens = []
        for _ in range(n):
            x = (1664525 * x + 1013904223) % 2**32
            tokens.append(x % mod)
    kw: dict = {}
    for src, dst in (("chunkSize", "chunk_size"), ("salt", "salt"), ("partial", "partial"), ("lora", "lora")):
        if src in case:
            kw[dst] = case[src]
    if "mm" in case:
        kw["mm"] = [
            {"id": bytes.fromhex(s["idHex"]) if "idHex" in s else s["id"], "offset": s["offset"], "length": s["length"]}
            for s in case["mm"]
        ]
    got = [[c.start, c.end, c.hash.hex()] for c in hash_chunks(tokens, **kw)]
    assert got == case["chunks"]


@pytest.mark.parametrize("case", FIXTURE["seeds"], ids=lambda c: f"{c['salt']}|{c['lora']}")
def test_cross_language_seeds(case):
    assert hash_seed(case["salt"], case["lora"]).hex() == case["seed"]


def test_prefix_property_and_partial_chunks():
    toks = list(range(1000))
    full = hash_chunks(toks, chunk_size=100)
    assert hash_chunks(toks[:550], chunk_size=100) == full[:5]
    part = hash_chunks(toks[:550], chunk_size=100, partial=True)
    assert part[:5] == full[:5] and part[5].end == 550 and part[5].hash != full[5].hash
    assert all(isinstance(c, Chunk) and len(c.hash) == 32 for c in full)
    assert part[5].tokens == 50


def test_salt_lora_and_mm_isolate():
    toks = list(range(512))
    base = hash_chunks(toks)
    assert hash_chunks(toks, salt="a")[0].hash != base[0].hash
    assert hash_chunks(toks, lora="a")[0].hash != base[0].hash
    assert hash_chunks(toks, lora="")[0].hash == base[0].hash  # empty = none
    assert hash_chunks(toks, salt="a", lora="b")[0].hash != hash_chunks(toks, salt="ab")[0].hash
    mm = hash_chunks(toks, mm=[("img", 300, 10)])
    assert mm[0] == base[0] and mm[1].hash != base[1].hash  # only the chunk it overlaps
    assert hash_chunks(toks, mm=[("img", 300, 10)]) != hash_chunks(toks, mm=[("img2", 300, 10)])
    # a span is given as bytes, a str (its UTF-8), a tuple or a dict
    assert hash_chunks(toks, mm=[(b"img", 300, 10)]) == hash_chunks(toks, mm=[{"id": "img", "offset": 300, "length": 10}])
    # order of the spans given does not matter
    a = hash_chunks(toks, mm=[("x", 10, 5), ("y", 10, 5), ("z", 0, 300)])
    b = hash_chunks(toks, mm=[("z", 0, 300), ("y", 10, 5), ("x", 10, 5)])
    assert a == b


def test_integer_arrays_hash_like_lists():
    np = pytest.importorskip("numpy")
    toks = list(range(0, 3000, 3))
    for dtype in (np.int64, np.uint32, np.int32):
        assert hash_chunks(np.array(toks, dtype=dtype), chunk_size=64, partial=True) == hash_chunks(
            toks, chunk_size=64, partial=True
        )
    assert hash_chunks(tuple(toks)) == hash_chunks(toks)
    with pytest.raises(InvalidArgumentError, match="token 1 "):
        hash_chunks(np.array([1, -1, 2], dtype=np.int64))
    with pytest.raises(InvalidArgumentError):
        hash_chunks(np.array([1.0, 2.0]))


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(tokens=[1, -1]), "token 1 "),
        (dict(tokens=[1, 2**32]), "token 1 "),
        (dict(tokens=[1.5]), "token 0 "),
        (dict(tokens=["3"]), "token 0 "),
        (dict(tokens=[1, 2, 3, None], chunk_size=2), "token 3 "),  # the unhashed tail is checked too
        (dict(tokens=[1], chunk_size=0), "chunk_size"),
        (dict(tokens=[1], chunk_size=2**20 + 1), "chunk_size"),
        (dict(tokens=[1], chunk_size=True), "chunk_size"),
        (dict(tokens=[1], partial=1), "partial"),
        (dict(tokens=[1], salt=b"x"), "salt"),
        (dict(tokens=[1], salt="\ud800"), "salt"),
        (dict(tokens=[1], lora="\udfff"), "lora"),
        (dict(tokens=[1], mm=[("", 0, 1)]), r"mm\[0\].id"),
        (dict(tokens=[1], mm=[(b"x" * 1025, 0, 1)]), r"mm\[0\].id"),
        (dict(tokens=[1], mm=[(1, 0, 1)]), r"mm\[0\].id"),
        (dict(tokens=[1], mm=[("x", -1, 1)]), r"mm\[0\].offset"),
        (dict(tokens=[1], mm=[("x", 0, 0)]), r"mm\[0\].length"),
        (dict(tokens=[1], mm=[("x", 2**32 - 10, 10)]), r"mm\[0\].length"),
        (dict(tokens=[1], mm=[("x", 0)]), r"mm\[0\]"),
    ],
)
def test_refuses_bad_input(kw, match):
    tokens = kw.pop("tokens")
    with pytest.raises(InvalidArgumentError, match=match) as info:
        hash_chunks(tokens, **kw)
    assert info.value.code == "KVT_INVALID_ARGUMENT"


def test_hex_helpers():
    h = hash_chunks([1], chunk_size=1)[0].hash
    assert hex_to_hash(h.hex()) == h
    for bad in (h.hex().upper(), h.hex()[:-1], " " + h.hex()[1:], "g" * 64, 5):
        with pytest.raises(InvalidArgumentError):
            hex_to_hash(bad)
    cs = hash_chunks(list(range(8)), chunk_size=2)
    assert pack_hashes(cs) == b"".join(c.hash for c in cs) == pack_hashes([c.hash for c in cs])
