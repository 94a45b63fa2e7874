"""The per-message request methods generated from the message table (``npm run gen:protocol``):
every request of :mod:`kvtier_vllm.protocol_table` has an ``encode_<message>`` in
:mod:`kvtier_vllm.protocol` and a ``send_<message>`` and blocking ``<message>`` on the client,
whose parameters carry the table's fields, and which send what the TypeScript codec sends (the
cross-language fixture). A message added to the table without regenerating fails here."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import zmq

from kvtier_vllm import protocol as P
from kvtier_vllm.client import KvtierClient
from kvtier_vllm.client_requests import SEND_PARAMS, RequestMethods
from kvtier_vllm.errors import InvalidArgumentError
from kvtier_vllm.protocol_encode import PARAMS
from kvtier_vllm.protocol_table import MESSAGES
from kvtier_vllm.transport import ClientTransport

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "cross-language.json").read_text())
REQUESTS = [name for name, spec in MESSAGES.items() if spec["dir"] == "request"]
#: the client's methods of a request's own name that are hand-written (another behaviour)
HAND_WRITTEN = {"lookup", "cancel"}


def _params(fn, skip: str) -> list[str]:
    return [n for n in inspect.signature(fn).parameters if n != skip]


def _fields(name: str) -> list[str]:
    return [f["key"] for f in MESSAGES[name]["fields"]]


@pytest.mark.parametrize("name", REQUESTS)
def test_every_request_has_an_encoder_whose_parameters_carry_its_fields(name):
    fn = getattr(P, f"encode_{name.lower()}", None)
    assert fn is not None and f"encode_{name.lower()}" in P.__all__, f"no encoder of {name}: run npm run gen:protocol"
    assert list(PARAMS[name]) == _fields(name), "the encoder's fields are the table's, in wire order"
    carried = {p for ps in PARAMS[name].values() for p in ps}
    assert set(_params(fn, "request_id")) == carried
    assert next(iter(inspect.signature(fn).parameters)) == "request_id"


@pytest.mark.parametrize("name", REQUESTS)
def test_every_request_has_a_send_method_and_a_blocking_one(name):
    method = name.lower()
    send = getattr(KvtierClient, f"send_{method}", None)
    assert send is not None, f"no send_{method}: run npm run gen:protocol"
    assert list(SEND_PARAMS[name]) == _fields(name)
    carried = {p for ps in SEND_PARAMS[name].values() for p in ps}
    assert carried <= set(_params(send, "self")) <= carried | {"timeout_ms"}
    assert callable(getattr(KvtierClient, method, None))
    if method in HAND_WRITTEN:
        assert method not in RequestMethods.__dict__ and method in KvtierClient.__dict__
    else:
        # the blocking method takes what send_ takes
        assert _params(getattr(KvtierClient, method), "self") == _params(send, "self")


def test_no_generated_method_shadows_or_is_shadowed_by_a_hand_written_one():
    generated = {n for n in RequestMethods.__dict__ if not n.startswith("__")}
    assert generated, "the mixin has methods"
    assert not generated & set(dir(ClientTransport))
    assert not generated & set(KvtierClient.__dict__)


def _kwargs(name: str, fields: dict, params: dict) -> dict | None:
    """A fixture request's fields as keyword arguments through ``params`` (field -> the
    parameters carrying it): a field with a parameter of its own, or one of its name among
    those of a hand-written helper; None when a field is shaped from others (SAVE's fence)."""
    out = {}
    for f in MESSAGES[name]["fields"]:
        if f["name"] not in fields:
            continue
        carried = params[name][f["key"]]
        shared = sum(carried[0] in ps for ps in params[name].values()) > 1
        if len(carried) == 1 and not shared:
            param = carried[0]
        elif f["key"] in carried:
            param = f["key"]
        else:
            return None
        v = fields[f["name"]]
        if f["kind"] in ("hashes", "blob", "bytes"):
            v = bytes.fromhex(v)
        out[param] = int(v) if f["kind"] == "u64" else v
    return out


_NAME = {name.lower().replace("_", "-"): name for name in MESSAGES}


def test_the_encoders_send_what_the_typescript_codec_sends():
    seen = set()
    for case in FIXTURE["requests"]:
        fields = case["fields"]
        name = _NAME[fields["type"]]
        kwargs = _kwargs(name, fields, PARAMS)
        if kwargs is None:
            continue
        frame = getattr(P, f"encode_{name.lower()}")(fields["requestId"], **kwargs)
        assert frame.hex() == case["hex"], case["name"]
        seen.add(name)
    assert seen == set(REQUESTS)


@pytest.fixture
def peer():
    """A real ROUTER socket on an ephemeral port, standing where a sidecar would: it receives
    the client's frames and answers nothing."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield router, f"tcp://127.0.0.1:{port}"
    finally:
        router.close()


def _received(router) -> bytes:
    assert router.poll(10_000), "the client sent nothing"
    return router.recv_multipart()[-1]


def test_the_send_methods_send_what_the_typescript_codec_sends(peer, client_factory):
    router, endpoint = peer
    c = client_factory(endpoint)
    seen = set()
    for case in FIXTURE["requests"]:
        fields = case["fields"]
        name = _NAME[fields["type"]]
        kwargs = _kwargs(name, fields, SEND_PARAMS)
        if kwargs is None:
            continue
        pending = getattr(c, f"send_{name.lower()}")(**kwargs)
        frame, want = _received(router), bytes.fromhex(case["hex"])
        # the same frame but the request id, which is the client's own
        assert frame[:4] + frame[8:] == want[:4] + want[8:], case["name"]
        assert int.from_bytes(frame[4:8], "little") == pending.request_id
        seen.add(name)
    # LOOKUP's config is shaped from pin/prefetch/rate, which spell the fixture's JSON otherwise
    assert seen == set(REQUESTS) - {"LOOKUP"}


def test_the_send_methods_deadlines_and_hooks(peer, client_factory):
    router, endpoint = peer
    c = client_factory(endpoint, request_timeout_ms=10_000, clock=lambda: 100.0)
    deadlines = [
        c.send_stats().deadline,
        c.send_ping(timeout_ms=250).deadline,
        c.send_lookup("look-0", bytes(32), [16], [bytes(16)], timeout_ms=500).deadline,
        c.send_load("e", "r", "l", [0], bytes(32), deadline_ms=40_000).deadline,
        c.send_load("e", "r", "l", [0], bytes(32)).deadline,  # the server's own deadline, 20 s
    ]
    assert deadlines == [110.0, 100.25, 100.5, 145.0, 125.0]
    # send_cancel drops the client's pending lookup of the id (it answers 0) before its CANCEL
    assert c.lookup("look-1", bytes(32), [16], [bytes(16)]) is None
    looking = c._lookups["look-1"]
    cancel = c.send_cancel("look-1")
    assert looking.done and looking.result() == 0 and "look-1" not in c._lookups
    assert cancel.msg_type == P.MsgType.CANCEL and not cancel.done
    # a refused argument raises from send_, before anything is sent
    for _ in range(len(deadlines) + 2):
        _received(router)
    with pytest.raises(InvalidArgumentError, match="fence"):
        c.send_save("e", "r", 0, [0], bytes(32), fence=(1,))
    with pytest.raises(InvalidArgumentError, match="deadline_ms"):
        c.send_load("e", "r", "l", [0], bytes(32), deadline_ms="soon")
    assert not router.poll(100)
