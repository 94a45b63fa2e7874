"""CurveZMQ against a real sidecar process (``kvtier serve`` with a ``security`` section): the
Python client gets no service without a key or with a key off the allow-list, is served with an
allow-listed key, and is refused (ForbiddenError, nothing changed) what its role does not allow.
The connector's config keys load the keys from files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import zmq

from kvtier_vllm.client import KvtierClient
from kvtier_vllm.config import KvtierConfig
from kvtier_vllm.curve import CurveKeys, load_client_keys
from kvtier_vllm.errors import ConfigError, ForbiddenError, KvtierError

from conftest import Sidecar

NS = bytes(range(16))
HASH = bytes(range(32))


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
    pairs = {n: _write_pair(d, n) for n in ("server", "scheduler", "engine", "ops", "stranger")}
    server_pub = pairs["server"][0]
    config = {
        "security": {
            "serverSecretKeyFile": str(d / "server.key"),
            "clients": [
                {"name": "scheduler", "publicKey": pairs["scheduler"][0], "role": "lookup"},
                {"name": "engine", "publicKeyFile": str(d / "engine.pub"), "role": "worker"},
                {"name": "ops", "publicKeyFile": str(d / "ops.pub"), "role": "admin"},
            ],
        }
    }
    keys = {n: CurveKeys(server_pub, p, s) for n, (p, s) in pairs.items()}
    s = Sidecar(config=config, curve=keys["scheduler"], dir=d)
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
