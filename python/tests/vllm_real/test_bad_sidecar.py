"""A "sidecar" that answers garbage, or kvtier's frames of another protocol version, on the
connector's endpoint: vLLM serves every request (its lookups answer 0 and it computes), and the
scheduler logs one error line, not one per lookup."""

from __future__ import annotations

import logging
import struct
import threading

import pytest
import zmq

from tests.conftest import free_port
from tests.vllm_real.harness.helpers import offered, prompt


class BadSidecar:
    """A ROUTER that answers every request with ``answer(request_frame)``."""

    def __init__(self, answer) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.proc = None  # no process: the engine fixture checks no pins on it
        self._answer = answer
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.endpoint)
        self._stop = threading.Event()
        self.requests = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(20):
                continue
            *envelope, frame = self._sock.recv_multipart()
            self.requests += 1
            self._sock.send_multipart([*envelope, self._answer(frame)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()
        self._ctx.term()


def _garbage(frame: bytes) -> bytes:
    return b"HTTP/1.1 400 Bad Request\r\n\r\n" + frame[:8]


def _other_version(frame: bytes) -> bytes:
    # kvtier's header with version 2, the request's type as a reply and its id: a newer sidecar
    rtype, rid = frame[3] | 0x80, struct.unpack_from("<I", frame, 4)[0]
    return b"kv" + bytes([2, rtype]) + struct.pack("<I", rid) + b"\x00" * 16


@pytest.mark.parametrize("answer", [_garbage, _other_version], ids=["garbage", "another-version"])
def test_vllm_serves_on_and_logs_one_line(engine, caplog, answer):
    bad = BadSidecar(answer)
    e = None
    try:
        with caplog.at_level(logging.ERROR, logger="kvtier_vllm"):
            e = engine(sidecar=bad, default_timeouts=True)
            for i in range(6):
                e.add_request(f"r{i}", prompt(90 + i, 100), max_tokens=3)
            e.run(2000)
        assert sorted(e.finished) == [f"r{i}" for i in range(6)]
        assert all(offered(e, f"r{i}") == [0] for i in range(6)), "every lookup answered 0"
        assert bad.requests >= 6, "the lookups reached the bad sidecar"
        lines = [r for r in caplog.records if r.name == "kvtier_vllm.client"]
        assert len(lines) == 1, [r.getMessage() for r in lines]
        assert "not kvtier protocol v1" in lines[0].getMessage()
    finally:
        if e is not None:
            e.close()
        bad.close()
