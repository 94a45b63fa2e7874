"""The codec: docs/protocol.md section 7's worked example, the TypeScript codec's bytes (the
cross-language fixture) for every message type, strict decoding of malformed replies, and the
encoders' refusals."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from kvtier_vllm import protocol as P
from kvtier_vllm.errors import (
    ERROR_CODES,
    InternalError,
    InvalidArgumentError,
    KvtierError,
    NotFoundError,
    ProtocolError,
    TooLargeError,
    error_for_code,
)
from kvtier_vllm.hashing import hash_chunks
from kvtier_vllm.namespace import derive_namespace
from kvtier_vllm.protocol_table import MESSAGES

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_MD = (ROOT / "docs" / "protocol.md").read_text()
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "cross-language.json").read_text())


def _codec_example(name: str) -> bytes:
    m = re.search(r"<!-- codec-example: " + re.escape(name) + r" -->\n```text\n(.*?)```", PROTOCOL_MD, re.S)
    assert m, f"codec example {name} not found in docs/protocol.md"
    hexits = "".join(line.split("#")[0] for line in m.group(1).splitlines())
    return bytes.fromhex(hexits.replace(" ", ""))


# ---------------------------------------------------------------------------------------------
# section 7


def test_worked_example_lookup_request():
    expected = _codec_example("lookup-request")
    assert len(expected) == 124
    chunks = hash_chunks(list(range(600)))  # vector A: two full chunks
    ns = derive_namespace(
        model_id="meta-llama/Meta-Llama-3-8B", dtype="bfloat16", num_layers=32, num_kv_heads=8,
        head_dim=128, block_size=16, tp_size=2, tp_rank=0,
    )
    got = P.encode_lookup(7, "req-1", [ns.id], chunks, [c.tokens for c in chunks], config={"pin": True})
    assert got == expected
    # hex namespaces and packed hashes spell the same request
    assert P.encode_lookup(7, "req-1", [ns.hex], b"".join(c.hash for c in chunks), [256, 256], config={"pin": True}) == expected


def test_worked_example_lookup_result():
    buf = _codec_example("lookup-result")
    assert len(buf) == 48
    msg_type, rid, rep = P.decode_reply(buf)
    assert (msg_type, rid) == (P.MsgType.LOOKUP_RESULT, 7)
    assert rep == P.LookupResult("req-1", "ok", 3, 512, 2, [P.TierTokens("cpu", 256), P.TierTokens("disk", 256)])


# ---------------------------------------------------------------------------------------------
# the TypeScript codec's bytes


def _encode_fixture_request(f: dict) -> bytes:
    rid, t = f["requestId"], f["type"]
    if t == "lookup":
        cfg = f["config"]
        return P.encode_lookup(
            rid, f["lookupId"], f["namespaces"], bytes.fromhex(f["hashes"]), f["tokenCounts"],
            pin=cfg.get("pin", True), prefetch=cfg.get("prefetch", True),
            compute_tokens_per_s=cfg.get("computeTokensPerSec"),
        )
    if t == "cancel":
        return P.encode_cancel(rid, f["lookupId"])
    if t == "clear":
        return P.encode_clear(rid, f["namespaces"])
    if t == "ping":
        return P.encode_ping(rid)
    if t == "stats":
        return P.encode_stats(rid)
    if t == "put":
        return P.encode_put(rid, f["namespace"], f["hash"], f["tokens"], bytes.fromhex(f["payload"]))
    if t == "get":
        return P.encode_get(rid, f["namespace"], f["hash"])
    if t == "register":
        return P.encode_register(rid, f["registration"])
    if t == "save":
        not_after = int(f["notAfterNs"]) if "notAfterNs" in f else None
        event = bytes.fromhex(f["cudaEvent"]) if "cudaEvent" in f else None
        fence = (f["fenceSlot"], f["fenceTicket"]) if "fenceSlot" in f else None
        return P.encode_save(
            rid, f["engineId"], f["engineRequestId"], f["skipChunks"], f["blockIds"], bytes.fromhex(f["chunkHashes"]),
            not_after_ns=not_after, cuda_event=event, fence=fence,
        )
    if t == "load":
        return P.encode_load(
            rid, f["engineId"], f["engineRequestId"], f["lookupId"], f["blockIds"], bytes.fromhex(f["chunkHashes"]),
            deadline_ms=f["deadlineMs"], state_slot=f["stateSlot"], skip_blocks=f.get("skipBlocks", 0),
            not_after_ns=int(f["notAfterNs"]) if "notAfterNs" in f else None,
            progress_slot=f.get("progressSlot"),
        )
    if t == "hold":
        return P.encode_hold(rid, f["engineId"], f["engineRequestId"], f["lookupId"])
    if t == "request-finished":
        return P.encode_request_finished(rid, f["engineId"], f["engineRequestId"], f["kind"])
    if t == "heartbeat":
        return P.encode_heartbeat(rid, f["engineId"])
    if t == "unregister":
        return P.encode_unregister(rid, f["engineId"])
    # A message with no encoder of its own: the table-driven one (tested against every case below).
    return _encode_by_table(f)


@pytest.mark.parametrize("case", FIXTURE["requests"], ids=[c["name"] for c in FIXTURE["requests"]])
def test_requests_match_the_typescript_codec(case):
    assert _encode_fixture_request(case["fields"]).hex() == case["hex"]


_TAG = {spec["code"]: name.lower().replace("_", "-") for name, spec in MESSAGES.items()}
_NAME = {tag: name for name, tag in ((n, _TAG[s["code"]]) for n, s in MESSAGES.items())}


def _ts_json(f: dict, v):
    """A decoded Python value in the TypeScript decoder's JSON form (the fixture's)."""
    kind = f["kind"]
    if kind in ("ns", "hash", "hashes", "blob", "bytes"):
        return v.hex()
    if kind == "u64":
        return str(v)
    if kind == "list":
        return [{g["name"]: _ts_json(g, getattr(x, g["key"])) for g in f["of"]} for x in v]
    return v


def _as_ts_fields(msg_type: int, rid: int, rep) -> dict:
    """The Python reply in the TypeScript decoder's JSON form, field by field of the table."""
    out = {"type": _TAG[msg_type], "requestId": rid}
    for f in MESSAGES[_NAME[out["type"]]]["fields"]:
        v = getattr(rep, f["key"])
        if v is None and f.get("optional"):
            continue  # absent from the frame, as from the TypeScript message
        out[f["name"]] = _ts_json(f, v)
    return out


def _py_value(f: dict, v):
    """A fixture (TypeScript JSON) value as the Python encoder takes it."""
    if f["kind"] in ("hashes", "blob", "bytes"):
        return bytes.fromhex(v)
    return int(v) if f["kind"] == "u64" else v


def _encode_by_table(fields: dict) -> bytes:
    name = _NAME[fields["type"]]
    values = {f["key"]: _py_value(f, fields[f["name"]]) for f in MESSAGES[name]["fields"] if f["name"] in fields}
    return P.encode_message(name, fields["requestId"], values)


@pytest.mark.parametrize("case", FIXTURE["requests"], ids=[c["name"] for c in FIXTURE["requests"]])
def test_the_table_driven_encoder_matches_the_typescript_codec(case):
    assert _encode_by_table(case["fields"]).hex() == case["hex"]


def test_every_message_of_the_table_is_in_the_fixture():
    seen = {c["fields"]["type"] for c in FIXTURE["requests"] + FIXTURE["replies"]}
    assert set(_TAG.values()) <= seen


@pytest.mark.parametrize("case", FIXTURE["replies"], ids=[c["name"] for c in FIXTURE["replies"]])
def test_replies_decode_as_the_typescript_codec_does(case):
    msg_type, rid, rep = P.decode_reply(bytes.fromhex(case["hex"]))
    got = _as_ts_fields(msg_type, rid, rep)
    want = dict(case["fields"])
    assert got == want


def test_unknown_error_code_reads_as_internal_and_keeps_the_raw_code():
    case = next(c for c in FIXTURE["replies"] if "unknown code" in c["name"])
    _, _, rep = P.decode_reply(bytes.fromhex(case["hex"]))
    assert rep.code == "KVT_INTERNAL" and rep.raw_code == "KVT_FROM_THE_FUTURE"
    err = error_for_code(rep.raw_code, rep.message)
    assert isinstance(err, InternalError) and err.code == "KVT_INTERNAL" and "KVT_FROM_THE_FUTURE" in str(err)


# ---------------------------------------------------------------------------------------------
# strict decoding

REPLY_HEX = [bytes.fromhex(c["hex"]) for c in FIXTURE["replies"]]
REPLY_IDS = [c["name"] for c in FIXTURE["replies"]]


@pytest.mark.parametrize("buf", REPLY_HEX, ids=REPLY_IDS)
def test_every_truncation_is_refused(buf):
    """Every cut is refused, but where trailing optional fields begin: there the reply reads as
    the same one without them."""
    _, _, whole = P.decode_reply(buf)
    for n in range(len(buf)):
        try:
            _, _, part = P.decode_reply(buf[:n])
        except ProtocolError:
            continue
        spec = MESSAGES[_NAME[_TAG[buf[3]]]]
        dropped = [f["key"] for f in spec["fields"] if f.get("optional") and getattr(part, f["key"]) is None]
        assert dropped and getattr(whole, dropped[0]) is not None, f"a cut at {n} bytes was read"
        assert part._replace(**{k: getattr(whole, k) for k in dropped}) == whole


@pytest.mark.parametrize("buf", REPLY_HEX, ids=REPLY_IDS)
def test_trailing_bytes_are_refused(buf):
    with pytest.raises(ProtocolError, match="trailing"):
        P.decode_reply(buf + b"\x00")


def test_header_checks_in_order():
    good = bytes.fromhex(FIXTURE["replies"][0]["hex"])
    with pytest.raises(ProtocolError, match="shorter than the 8-byte header"):
        P.decode_reply(b"kv\x01\x81")
    with pytest.raises(ProtocolError, match="magic"):
        P.decode_reply(b"vk" + good[2:])
    with pytest.raises(ProtocolError, match="version 2"):
        P.decode_reply(good[:2] + b"\x02" + good[3:])
    used = {spec["code"] for spec in MESSAGES.values() if spec["dir"] == "reply"}
    unknown = [c for c in range(0x80, 0x100) if c not in used]
    for bad_type in (0x01, *unknown[:3], unknown[-1]):  # a request code, reply codes the table lacks
        with pytest.raises(ProtocolError, match="unknown reply type"):
            P.decode_reply(good[:3] + bytes([bad_type]) + good[4:])
    assert P.peek_request_id(good) == 7 and P.peek_request_id(b"kv") == 0


def _frame(msg_type: int, body: bytes, rid: int = 1) -> bytes:
    return P.encode_header(msg_type, rid) + body


def _s(b: bytes) -> bytes:
    return struct.pack("<H", len(b)) + b


def test_bad_utf8_is_refused():
    tail = b"\x00" + struct.pack("<IIIB", 1, 0, 0, 0)
    with pytest.raises(ProtocolError, match="UTF-8"):
        P.decode_reply(_frame(P.MsgType.LOOKUP_RESULT, _s(b"\xff\xfe") + tail))
    with pytest.raises(ProtocolError, match="UTF-8"):  # an encoded surrogate is not UTF-8 either
        P.decode_reply(_frame(P.MsgType.LOOKUP_RESULT, _s(b"\xed\xa0\x80") + tail))
    with pytest.raises(ProtocolError, match="UTF-8"):
        P.decode_reply(_frame(P.MsgType.ERROR, _s(b"KVT_PROTOCOL") + _s(b"\xc3")))
    with pytest.raises(ProtocolError, match="UTF-8"):
        P.decode_reply(_frame(P.MsgType.REGISTER_RESULT, _s(b"\x80") + bytes(16) + bytes(8)))
    with pytest.raises(ProtocolError):
        P.decode_reply(_frame(P.MsgType.PONG, struct.pack("<I", 2) + b"\xff}"))


def test_values_out_of_range_are_refused():
    ok_tail = struct.pack("<IIIB", 1, 0, 0, 0)
    with pytest.raises(ProtocolError, match="status 3"):
        P.decode_reply(_frame(P.MsgType.LOOKUP_RESULT, _s(b"a") + b"\x03" + ok_tail))
    with pytest.raises(ProtocolError, match="outcome 3"):
        P.decode_reply(_frame(P.MsgType.PUT_RESULT, b"\x03"))
    with pytest.raises(TooLargeError):
        P.decode_reply(_frame(P.MsgType.LOOKUP_RESULT, _s(b"a" * 257) + b"\x00" + ok_tail))
    with pytest.raises(TooLargeError):
        P.decode_reply(_frame(P.MsgType.ERROR, _s(b"K" * 65) + _s(b"")))
    with pytest.raises(TooLargeError):
        P.decode_reply(_frame(P.MsgType.REGISTER_RESULT, _s(b"e" * 257) + bytes(24)))
    # the limits themselves are fine
    _, _, rep = P.decode_reply(_frame(P.MsgType.LOOKUP_RESULT, _s(b"a" * 256) + b"\x02" + ok_tail))
    assert rep.status == "stale" and rep.epoch == 1
    _, _, rep = P.decode_reply(_frame(P.MsgType.ERROR, _s(b"KVT_" + b"X" * 60) + _s("é".encode() * 600)))
    assert rep.code == "KVT_INTERNAL" and len(rep.message) == 600


def test_counts_that_run_past_the_frame_are_truncation():
    with pytest.raises(ProtocolError, match="invalid block ids"):
        P.decode_reply(_frame(P.MsgType.LOAD_RESULT, struct.pack("<II", 0, 3) + struct.pack("<II", 1, 2)))
    with pytest.raises(ProtocolError, match="payload"):
        P.decode_reply(_frame(P.MsgType.GET_RESULT, b"\x01" + struct.pack("<II", 1, 10) + b"abc"))
    with pytest.raises(ProtocolError, match="tier"):
        P.decode_reply(_frame(P.MsgType.LOOKUP_RESULT, _s(b"a") + b"\x00" + struct.pack("<IIIB", 1, 5, 1, 2) + _s(b"cpu") + struct.pack("<I", 5)))


def test_lookup_result_fast_path_agrees_with_the_strict_reader():
    """decode_reply reads a LOOKUP_RESULT in a few struct calls and leaves anything unusual to
    the field-by-field reader: both give the same result or the same error on every
    truncation, extension and bit flip of a few frames."""
    from kvtier_vllm import protocol_decode as D

    def strict(buf):
        try:
            return D._d_lookup(D._Reader(buf))
        except KvtierError as err:
            return type(err), str(err)

    def fast(buf):
        try:
            return P.decode_reply(buf)[2]
        except KvtierError as err:
            return type(err), str(err)

    frames = [
        _frame(P.MsgType.LOOKUP_RESULT, _s(lid) + bytes([status]) + struct.pack("<IIIB", 3, 512, 2, len(tiers))
               + b"".join(_s(t) + struct.pack("<I", 256) for t in tiers))
        for lid, status, tiers in (
            (b"req-1", 0, [b"cpu", b"disk"]),
            ("é-lookup".encode(), 1, []),
            (b"x" * 256, 2, [b"s3" * 40]),
        )
    ]
    for buf in frames:
        variants = [buf[:n] for n in range(8, len(buf) + 1)] + [buf + b"\x00", buf + b"\x00" * 4]
        variants += [buf[:i] + bytes([buf[i] ^ m]) + buf[i + 1 :] for i in range(8, len(buf)) for m in (0x01, 0x80, 0xFF)]
        for v in variants:
            assert fast(v) == strict(v), v.hex()


def test_json_replies():
    def pong(text: bytes) -> bytes:
        return _frame(P.MsgType.PONG, struct.pack("<I", len(text)) + text)

    assert P.decode_reply(pong(b'{"a":1}'))[2] == P.Pong({"a": 1})
    assert P.decode_reply(pong(b"[1,2]"))[2] == P.Pong({})  # not an object: {}
    assert P.decode_reply(pong(b"null"))[2] == P.Pong({})
    for bad in (b"{", b"", b"{'a':1}", b'{"a":NaN}', b'{"a":Infinity}'):
        with pytest.raises(ProtocolError, match="JSON"):
            P.decode_reply(pong(bad))


def test_booleans_read_any_value_but_1_as_false():
    assert P.decode_reply(_frame(P.MsgType.CANCEL_RESULT, b"\x02"))[2] == P.CancelResult(False)
    assert P.decode_reply(_frame(P.MsgType.HEARTBEAT_RESULT, b"\x01"))[2] == P.HeartbeatResult(True)


def test_error_classes():
    assert set(ERROR_CODES) == {
        "KVT_PROTOCOL", "KVT_TOO_LARGE", "KVT_INVALID_ARGUMENT", "KVT_CAPACITY", "KVT_CLOSED",
        "KVT_INTERNAL", "KVT_BACKEND", "KVT_CORRUPT", "KVT_UNKNOWN_NAMESPACE", "KVT_NOT_FOUND",
        "KVT_TIMEOUT", "KVT_ABORTED", "KVT_CONFIG", "KVT_UNAUTHENTICATED", "KVT_FORBIDDEN",
    }
    for code, cls in ERROR_CODES.items():
        err = error_for_code(code, "m")
        assert type(err) is cls and err.code == code and isinstance(err, KvtierError)
        assert str(err) == f"{code}: m"
    e = error_for_code("KVT_NOT_FOUND", "x")
    assert isinstance(e, NotFoundError)
    import pickle

    again = pickle.loads(pickle.dumps(e))
    assert type(again) is NotFoundError and again.code == "KVT_NOT_FOUND" and again.message == "x"


# ---------------------------------------------------------------------------------------------
# encoders refuse what the wire cannot carry

NS = bytes(range(16))
H32 = bytes(32)


@pytest.mark.parametrize(
    "call,exc",
    [
        (lambda: P.encode_lookup(1, "", [NS], b"", []), InvalidArgumentError),
        (lambda: P.encode_lookup(1, "x" * 257, [NS], b"", []), TooLargeError),
        (lambda: P.encode_lookup(1, "é" * 129, [NS], b"", []), TooLargeError),  # 258 bytes
        (lambda: P.encode_lookup(1, "\ud800", [NS], b"", []), InvalidArgumentError),
        (lambda: P.encode_lookup(1, "a", [], b"", []), InvalidArgumentError),
        (lambda: P.encode_lookup(1, "a", [NS] * 17, b"", []), InvalidArgumentError),
        (lambda: P.encode_lookup(1, "a", [b"short"], b"", []), InvalidArgumentError),
        (lambda: P.encode_lookup(1, "a", ["48F3D9651EAF7E9014CF0C0D7BC30FBA"], b"", []), InvalidArgumentError),
        (lambda: P.encode_lookup(1, "a", [NS], H32, []), InvalidArgumentError),
        (lambda: P.encode_lookup(1, "a", [NS], H32[:31], [1]), InvalidArgumentError),
        (lambda: P.encode_lookup(1, "a", [NS], H32, [-1]), InvalidArgumentError),
        (lambda: P.encode_lookup(1, "a", [NS], H32, [2**32]), InvalidArgumentError),
        (lambda: P.encode_lookup(1, "a", [NS], H32 * 65537, [1] * 65537), TooLargeError),
        (lambda: P.encode_lookup(1, "a", [NS], H32, [1], config={"x": "y" * 4096}), TooLargeError),
        (lambda: P.encode_cancel(1, ""), InvalidArgumentError),
        (lambda: P.encode_clear(1, [NS] * 256), TooLargeError),
        (lambda: P.encode_put(1, NS, H32[:5], 1, b"x"), InvalidArgumentError),
        (lambda: P.encode_put(1, NS, H32, -1, b"x"), InvalidArgumentError),
        (lambda: P.encode_get(1, "zz" * 16, H32), InvalidArgumentError),
        (lambda: P.encode_register(1, [1]), InvalidArgumentError),
        (lambda: P.encode_register(1, {"x": float("nan")}), InvalidArgumentError),
        (lambda: P.encode_register(1, {"x": "y" * (1 << 20)}), TooLargeError),
        (lambda: P.encode_save(1, "", "r", 0, [], b""), InvalidArgumentError),
        (lambda: P.encode_save(1, "e", "r" * 257, 0, [], b""), TooLargeError),
        (lambda: P.encode_save(1, "e", "r", -1, [], b""), InvalidArgumentError),
        (lambda: P.encode_save(1, "e", "r", 0, [0] * 262_145, b""), TooLargeError),
        (lambda: P.encode_save(1, "e", "r", 0, [], H32 * 65537), TooLargeError),
        (lambda: P.encode_save(1, "e", "r", 0, [-1], H32), InvalidArgumentError),
        (lambda: P.encode_load(1, "e", "r", "", [0], H32), InvalidArgumentError),
        (lambda: P.encode_load(1, "e", "r", "l", [0], H32, state_slot=-2), InvalidArgumentError),
        (lambda: P.encode_load(1, "e", "r", "l", [0], H32, state_slot=2**31), InvalidArgumentError),
        (lambda: P.encode_load(1, "e", "r", "l", [0], H32, deadline_ms=-1), InvalidArgumentError),
        (lambda: P.encode_load(1, "e", "r", "l", [], b"", skip_blocks=1), InvalidArgumentError),
        (lambda: P.encode_load(1, "e", "r", "l", [0], H32, skip_blocks=-1), InvalidArgumentError),
        (lambda: P.encode_hold(1, "e", "", "l"), InvalidArgumentError),
        (lambda: P.encode_request_finished(1, "e", "r", "done"), InvalidArgumentError),
        (lambda: P.encode_request_finished(1, "e", "r", 0), InvalidArgumentError),
        (lambda: P.encode_heartbeat(1, ""), InvalidArgumentError),
        (lambda: P.encode_unregister(1, "x" * 300), TooLargeError),
    ],
)
def test_encoders_refuse(call, exc):
    with pytest.raises(exc):
        call()


def test_encoders_accept_arrays_and_limits():
    np = pytest.importorskip("numpy")
    a = P.encode_save(1, "e", "r", 0, np.arange(8, dtype=np.int64), H32)
    b = P.encode_save(1, "e", "r", 0, list(range(8)), H32)
    from array import array

    c = P.encode_save(1, "e", "r", 0, array("I", range(8)), H32)
    d = P.encode_save(1, "e", "r", 0, tuple(range(8)), H32)
    assert a == b == c == d
    # a list packs through array("I"); anything int-like packs as struct would pack it
    assert P.encode_save(1, "e", "r", 0, [np.int64(3), True, 2**32 - 1], H32) == P.encode_save(
        1, "e", "r", 0, (3, 1, 2**32 - 1), H32
    )
    with pytest.raises(InvalidArgumentError):
        P.encode_save(1, "e", "r", 0, np.array([-1]), H32)
    with pytest.raises(InvalidArgumentError):
        P.encode_save(1, "e", "r", 0, np.array([1.5]), H32)
    P.encode_lookup(1, "x" * 256, [NS] * 16, b"", [])  # the limits themselves
    P.encode_load(1, "e" * 256, "r", "l", [], b"", state_slot=2**31 - 1)
    # skip_blocks 0 leaves the optional field out: old servers accept the frame
    base = P.encode_load(1, "e", "r", "l", [0, 1], H32)
    assert P.encode_load(1, "e", "r", "l", [0, 1], H32, skip_blocks=2) == base + struct.pack("<I", 2)
    # a lookup's config carries only what differs from the defaults
    assert P.encode_lookup(1, "a", [NS], b"", []).endswith(struct.pack("<I", 0))
    assert P.encode_lookup(1, "a", [NS], b"", [], prefetch=False).endswith(b'{"prefetch":false}')


def test_save_cuda_event_must_be_a_64_byte_handle():
    h = bytes(32)
    with pytest.raises(InvalidArgumentError, match="cuda_event must be 64 bytes"):
        P.encode_save(1, "e", "r", 0, [0], h, cuda_event=bytes(63))
    # Without a not-after time the event is preceded by a zero one.
    frame = P.encode_save(1, "e", "r", 0, [0], h, cuda_event=bytes(range(64)))
    assert frame[-72:-64] == bytes(8) and frame[-64:] == bytes(range(64))
