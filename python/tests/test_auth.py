"""CurveZMQ against a real sidecar process (``kvtier serve`` with a ``security`` section): the
Python client gets no service without a key or with a key off the allow-list, is served with an
allow-listed key, and is refused (ForbiddenError, nothing changed) what its role does not allow.
The connector's config keys load the keys from files.

A connection the sidecar refuses as unauthenticated (its ZAP reply lost the race for the
routing id, docs/security.md) is forced with the sidecar's test fault
KVTIER_TEST_FAIL_FIRST_HANDSHAKES: the client opens a fresh connection and sends the refused
requests again. Which requests are sent again, and the bound on fresh connections, are checked
against a scripted CurveZMQ ROUTER."""

from __future__ import annotations

import os
import struct
import tempfile
import threading
from pathlib import Path

import pytest
import zmq

from kvtier_vllm import protocol as P
from kvtier_vllm.client import MAX_AUTH_RECONNECTS, KvtierClient
from kvtier_vllm.config import KvtierConfig
from kvtier_vllm.curve import CurveKeys, load_client_keys
from kvtier_vllm.errors import ConfigError, ForbiddenError, KvtierError, UnauthenticatedError

from conftest import Sidecar

NS = bytes(range(16))
HASH = bytes(range(32))


FAULTED_HANDSHAKES = 2


def _write_pair(d: Path, name: str) -> tuple[str, str]:
    public, secret = (k.decode() for k in zmq.curve_keypair())
    key = d / f"{name}.key"
    key.write_text(secret + "\n")
    os.chmod(key, 0o600)
    (d / f"{name}.pub").write_text(public + "\n")
    return public, secret


@pytest.fixture(scope="module")
def secured():
    d = Path(tempfile.mkdtemp(prefix="kvtier-pytest-auth-"))
    pairs = {n: _write_pair(d, n) for n in ("server", "scheduler", "engine", "ops", "stranger", "engine2", "ops2")}
    server_pub = pairs["server"][0]
    config = {
        "security": {
            "serverSecretKeyFile": str(d / "server.key"),
            "clients": [
                {"name": "scheduler", "publicKey": pairs["scheduler"][0], "role": "lookup"},
                {"name": "engine", "publicKeyFile": str(d / "engine.pub"), "role": "worker"},
                {"name": "ops", "publicKeyFile": str(d / "ops.pub"), "role": "admin"},
                # keys only the reconnect test uses: their faulted handshakes are still ahead
                {"name": "engine2", "publicKey": pairs["engine2"][0], "role": "worker"},
                {"name": "ops2", "publicKey": pairs["ops2"][0], "role": "admin"},
            ],
        }
    }
    keys = {n: CurveKeys(server_pub, p, s) for n, (p, s) in pairs.items()}
    # The first handshakes of every key mint no routing id (a lost ZAP race, forced); the
    # readiness PING and every client below must get past them by reconnecting.
    s = Sidecar(
        config=config,
        curve=keys["scheduler"],
        dir=d,
        env={"KVTIER_TEST_FAIL_FIRST_HANDSHAKES": str(FAULTED_HANDSHAKES)},
    )
    try:
        yield s, keys
    finally:
        s.close()


def test_refused_without_a_key_or_with_an_unknown_one(secured):
    sidecar, keys = secured
    for curve in (None, keys["stranger"]):
        c = KvtierClient(sidecar.endpoint, request_timeout_ms=400, curve=curve)
        try:
            with pytest.raises(KvtierError) as e:
                c.ping()
            assert e.value.code == "KVT_TIMEOUT"
        finally:
            c.close()
    # The server goes on serving allow-listed clients.
    ok = KvtierClient(sidecar.endpoint, curve=keys["scheduler"])
    try:
        assert ok.ping()["protocolVersion"] == 1
    finally:
        ok.close()


def test_served_with_the_right_key_and_role_refused_the_wrong_one(secured):
    sidecar, keys = secured
    scheduler = KvtierClient(sidecar.endpoint, curve=keys["scheduler"])
    engine = KvtierClient(sidecar.endpoint, curve=keys["engine"])
    ops = KvtierClient(sidecar.endpoint, curve=keys["ops"])
    try:
        assert scheduler.stats()["epoch"] > 0  # served
        with pytest.raises(ForbiddenError, match="may not send PUT"):
            scheduler.put(NS, HASH, 16, b"x" * 64)
        with pytest.raises(ForbiddenError, match="may not send HEARTBEAT"):
            scheduler.heartbeat("w0")
        assert engine.heartbeat("w0").known is False  # served: no such engine
        with pytest.raises(ForbiddenError, match="may not send CLEAR"):
            engine.clear()
        with pytest.raises(ForbiddenError):
            engine.put(NS, HASH, 16, b"x" * 64)
        assert ops.get(NS, HASH).found is False  # the refused PUTs stored nothing
        assert ops.put(NS, HASH, 16, b"x" * 64).outcome is not None
        assert ops.get(NS, HASH).found is True
    finally:
        for c in (scheduler, engine, ops):
            c.close()


def test_connector_config_loads_the_keys(secured, tmp_path):
    sidecar, keys = secured
    key_file = sidecar.dir / "engine.key"
    cfg = KvtierConfig.from_extra(
        {"server_public_key": str(sidecar.dir / "server.pub"), "client_secret_key_file": str(key_file)}
    )
    loaded = load_client_keys(cfg.server_public_key, cfg.client_secret_key_file)
    assert loaded == keys["engine"]
    assert keys["engine"].secret_key not in repr(loaded)
    assert load_client_keys(keys["server"].public_key, str(key_file)) == loaded
    with pytest.raises(ConfigError, match="go together"):
        KvtierConfig.from_extra({"server_public_key": keys["server"].public_key})
    loose = tmp_path / "loose.key"
    loose.write_text(keys["engine"].secret_key)
    os.chmod(loose, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_client_keys(keys["server"].public_key, str(loose))


def test_refused_connections_are_replaced_and_the_refused_requests_sent_again(secured):
    """A key's first handshakes mint nothing: requests in flight on those connections are
    refused, sent again on fresh ones, and served once each."""
    sidecar, keys = secured
    engine = KvtierClient(sidecar.endpoint, curve=keys["engine2"])
    ops = KvtierClient(sidecar.endpoint, curve=keys["ops2"])
    try:
        pings = [engine.send_ping() for _ in range(4)]
        beat = engine.send_heartbeat("w-reconnect")  # what the worker's heartbeat thread sends
        assert [p.wait()["protocolVersion"] for p in pings] == [1, 1, 1, 1]
        assert beat.wait().known is False  # served: no such engine
        assert engine.auth_reconnects == FAULTED_HANDSHAKES
        # The admin key too; its PUT is stored once (a second PUT finds it).
        h = bytes(range(1, 33))
        assert ops.put(NS, h, 16, b"y" * 64).outcome == "stored"
        assert ops.auth_reconnects == FAULTED_HANDSHAKES
        assert ops.put(NS, h, 16, b"y" * 64).outcome == "exists"
        assert ops.get(NS, h).payload == b"y" * 64
        assert ops.auth_reconnects == FAULTED_HANDSHAKES, "no reconnect once served"
    finally:
        engine.close()
        ops.close()


class _ScriptedCurveRouter:
    """A CurveZMQ ROUTER (no ZAP handler: every key is let in) answering PINGs from a thread;
    ``refuse(connection, request_id)`` says which get KVT_UNAUTHENTICATED. Connections are
    numbered in the order their first request came."""

    def __init__(self, refuse, curve: bool = True) -> None:
        self.refuse = refuse
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.server_public, secret = zmq.curve_keypair()
        if curve:
            self.sock.curve_server = True
            self.sock.curve_secretkey = secret
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.seen: list[tuple[int, int]] = []
        self._ids: dict[bytes, int] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            if not self.sock.poll(20):
                continue
            ident, frame = self.sock.recv_multipart()
            conn = self._ids.setdefault(ident, len(self._ids))
            rid = struct.unpack_from("<I", frame, 4)[0]
            self.seen.append((conn, rid))
            if self.refuse(conn, rid):
                code, msg = b"KVT_UNAUTHENTICATED", b"no identity"
                rep = P.encode_header(0xFF, rid) + struct.pack("<H", len(code)) + code + struct.pack("<H", len(msg)) + msg
            else:
                info = b'{"connection":%d}' % conn
                rep = P.encode_header(0x84, rid) + struct.pack("<I", len(info)) + info
            self.sock.send_multipart([ident, rep])

    def client_keys(self) -> CurveKeys:
        public, secret = (k.decode() for k in zmq.curve_keypair())
        return CurveKeys(self.server_public.decode(), public, secret)

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def scripted_router():
    made = []

    def make(refuse, curve: bool = True) -> _ScriptedCurveRouter:
        r = _ScriptedCurveRouter(refuse, curve)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def test_only_the_refused_requests_are_sent_again(scripted_router):
    # The first connection refuses odd request ids and serves even ones.
    r = scripted_router(lambda conn, rid: conn == 0 and rid % 2 == 1)
    c = KvtierClient(r.endpoint, curve=r.client_keys(), request_timeout_ms=10_000)
    try:
        pings = [c.send_ping() for _ in range(4)]
        answers = [p.wait()["connection"] for p in pings]
        assert answers == [1, 0, 1, 0]
        times = {rid: sum(1 for _, x in r.seen if x == rid) for rid in (1, 2, 3, 4)}
        assert times == {1: 2, 2: 1, 3: 2, 4: 1}
        assert c.auth_reconnects == 1
        assert c.pending_requests == 0
    finally:
        c.close()


def test_refusal_surfaced_after_bounded_reconnects_then_tried_again(scripted_router):
    r = scripted_router(lambda conn, rid: conn <= MAX_AUTH_RECONNECTS + 1)
    c = KvtierClient(r.endpoint, curve=r.client_keys(), request_timeout_ms=10_000)
    try:
        with pytest.raises(UnauthenticatedError):
            c.ping()
        assert c.auth_reconnects == MAX_AUTH_RECONNECTS
        assert [conn for conn, _ in r.seen] == list(range(MAX_AUTH_RECONNECTS + 1))
        # The next request starts over: refused once more, then served on a fresh connection.
        assert c.ping()["connection"] == MAX_AUTH_RECONNECTS + 2
        assert c.auth_reconnects == MAX_AUTH_RECONNECTS + 2
    finally:
        c.close()


def test_without_keys_the_refusal_is_surfaced_at_once(scripted_router):
    r = scripted_router(lambda conn, rid: True, curve=False)
    c = KvtierClient(r.endpoint, request_timeout_ms=10_000)
    try:
        with pytest.raises(UnauthenticatedError):
            c.ping()
        assert c.auth_reconnects == 0
        assert len(r.seen) == 1
    finally:
        c.close()
