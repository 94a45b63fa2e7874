"""Python lookup benchmark (npm run bench:python; KVTIER_BENCH_QUICK=1 for a short run).

1. Round trip, one request in flight, 16/128/512-chunk lookups (all CPU hits) through
   ``KvtierClient.lookup()`` (send, then poll the socket until answered) against a kvtier sidecar
   in another process, compared with a raw pyzmq DEALER sending the same bytes to a pyzmq ROUTER
   echo in another process, measured in the same run (target: lookup p50 <= 1.5x echo p50).
   A third column isolates the client: the same ``lookup()`` against a pyzmq ROUTER in another
   process that answers each LOOKUP with a ready-made LOOKUP_RESULT (no sidecar work); a fourth
   isolates the sidecar: the raw DEALER sending ready-made LOOKUP frames to it (no client).
   The four measures of one size take turns, ``BLOCK`` samples each, so that machine noise
   (other processes on a small machine) falls on all of them alike instead of on one block.
2. Scheduler step: the cost of asking about 1,000 pending lookups once each (one
   ``lookup()`` call per request, as a scheduler does every step; target < 1 ms), and the same
   with one explicit ``poll()`` first.

Prints tables and writes bench/results/python-lookup.json.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import zmq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "python"))

from kvtier_vllm import protocol as P  # noqa: E402
from kvtier_vllm.client import KvtierClient  # noqa: E402

QUICK = os.environ.get("KVTIER_BENCH_QUICK") == "1"
SIZES = [16, 128, 512]
RTT_SAMPLES = 500 if QUICK else 5000
WARMUP = 200
BLOCK = 100  # samples per turn; the measures of one size take turns (see interleaved())
STEP_LOOKUPS = 1000
STEP_SAMPLES = 50 if QUICK else 300
NS = bytes.fromhex("b0" * 16)


# ---------------------------------------------------------------------------------------------
# child processes


def echo_child(mode: str) -> None:
    """A ROUTER that echoes every message (mode "echo") or answers every LOOKUP with a
    LOOKUP_RESULT of all hits (mode "reply")."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(f"ready tcp://127.0.0.1:{port}", flush=True)
    while True:
        ident, msg = sock.recv_multipart()
        if mode == "echo":
            sock.send_multipart([ident, msg])
            continue
        rid = struct.unpack_from("<I", msg, 4)[0]
        n_id = struct.unpack_from("<H", msg, 8)[0]
        lid = msg[10 : 10 + n_id]
        off = 10 + n_id
        ns_count = msg[off]
        off += 1 + 16 * ns_count
        chunks = struct.unpack_from("<I", msg, off)[0]
        rep = (
            P.encode_header(P.MsgType.LOOKUP_RESULT, rid)
            + struct.pack("<H", len(lid))
            + lid
            + struct.pack("<BIIIB", 0, 1, 256 * chunks, chunks, 1)
            + struct.pack("<H", 3)
            + b"cpu"
            + struct.pack("<I", 256 * chunks)
        )
        sock.send_multipart([ident, rep])


def spawn_child(args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    line = p.stdout.readline().strip()
    if not line.startswith("ready "):
        p.kill()
        raise RuntimeError(f"{args} did not start: {line!r}")
    return p, line[6:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sidecar(tmp: Path) -> tuple[subprocess.Popen, str]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    cfg = {
        "listen": endpoint,
        "metrics": None,
        "logLevel": "warn",
        "tiers": [{"name": "cpu", "type": "local-cpu", "capacityBytes": 256 * 1024 * 1024}],
        # Answered lookups keep their pins until the registry evicts them: 4,096 pinned 512-chunk
        # lookups need more than the default 64 MiB lookup budget, which would refuse them.
        "storage": {"maxLookupBytes": 1024**3},
    }
    path = tmp / "kvtier.json"
    path.write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTIER_")}
    if not (ROOT / "dist" / "src" / "cli" / "main.js").exists():
        env["KVTIER_FROM_SOURCE"] = "1"
    p = subprocess.Popen(
        ["node", str(ROOT / "bin" / "kvtier.js"), "serve", "--config", str(path)],
        cwd=str(ROOT),
        env=env,
        stdin=subprocess.DEVNULL,
    )
    c = KvtierClient(endpoint, request_timeout_ms=500)
    deadline = time.monotonic() + 60
    try:
        while True:
            if p.poll() is not None:
                raise RuntimeError(f"kvtier serve exited with {p.returncode}")
            try:
                c.ping()
                return p, endpoint
            except Exception:
                if time.monotonic() > deadline:
                    p.kill()
                    raise
    finally:
        c.close()


# ---------------------------------------------------------------------------------------------
# measurements


def percentile(sorted_us: list[float], p: float) -> float:
    i = min(len(sorted_us) - 1, max(0, -(-p * len(sorted_us) // 100) - 1))
    return sorted_us[int(i)]


class EchoRtt:
    """Raw limit: a pyzmq DEALER sending ``msg`` to the echo ROUTER, blocking until it is back."""

    def __init__(self, endpoint: str, msg: bytes) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.msg = msg

    def take(self, n: int, out: list[float]) -> None:
        sock, msg = self.sock, self.msg
        for _ in range(n):
            t0 = time.perf_counter_ns()
            sock.send(msg)
            sock.recv()
            out.append((time.perf_counter_ns() - t0) / 1000)

    def close(self) -> None:
        self.sock.close(0)


class RawLookupRtt(EchoRtt):
    """Info: the same DEALER sending ready-made LOOKUP frames (a new lookup id each, encoded
    before the clock starts) to the sidecar: its round trip without the Python client."""

    def __init__(self, endpoint: str, hashes: bytes, counts: list[int], tag: str) -> None:
        super().__init__(endpoint, b"")
        self.hashes, self.counts, self.tag, self.i = hashes, counts, tag, 0
        self.expected = sum(counts)

    def take(self, n: int, out: list[float]) -> None:
        sock = self.sock
        for _ in range(n):
            self.i += 1
            msg = P.encode_lookup(self.i, f"{self.tag}-{self.i}", [NS], self.hashes, self.counts)
            t0 = time.perf_counter_ns()
            sock.send(msg)
            rep = sock.recv()
            out.append((time.perf_counter_ns() - t0) / 1000)
        _, rid, res = P.decode_reply(rep)
        if rid != self.i or getattr(res, "hit_tokens", None) != self.expected:
            raise RuntimeError(f"raw lookup answered {res!r}, expected {self.expected} hit tokens")


class LookupRtt:
    """``KvtierClient.lookup()`` (send, then poll the socket until answered), a new id each."""

    def __init__(self, client: KvtierClient, hashes: bytes, counts: list[int], tag: str) -> None:
        self.client, self.hashes, self.counts, self.tag, self.i = client, hashes, counts, tag, 0
        self.expected = sum(counts)

    def take(self, n: int, out: list[float]) -> None:
        client, hashes, counts = self.client, self.hashes, self.counts
        for _ in range(n):
            self.i += 1
            lid = f"{self.tag}-{self.i}"
            t0 = time.perf_counter_ns()
            a = client.lookup(lid, hashes, counts, [NS])
            while a is None:
                client.poll(1000)
                a = client.lookup(lid, hashes, counts, [NS])
            dt = (time.perf_counter_ns() - t0) / 1000
            if a != self.expected:
                raise RuntimeError(f"lookup answered {a}, expected {self.expected} ({client.last_lookup_error})")
            out.append(dt)

    def close(self) -> None:
        pass


def interleaved(measures: list, n: int) -> list[list[float]]:
    """``n`` sorted samples of each measure, taken in turns of ``BLOCK`` after a warm-up of each,
    so that a burst of machine noise lands on all of them alike rather than on one."""
    outs: list[list[float]] = [[] for _ in measures]
    for m in measures:
        m.take(WARMUP, [])
    for start in range(0, n, BLOCK):
        for m, out in zip(measures, outs):
            m.take(min(BLOCK, n - start), out)
    return [sorted(o) for o in outs]


def step_cost(endpoint: str) -> dict:
    """1,000 lookups pending on a server that never answers; time one round over them."""
    client = KvtierClient(endpoint, lookup_timeout_ms=3_600_000)
    hashes = os.urandom(16 * 32)
    counts = [256] * 16
    ids = [f"pending-{i}" for i in range(STEP_LOOKUPS)]
    try:
        for lid in ids:
            assert client.lookup(lid, hashes, counts, [NS]) is None
        only_lookups, with_poll = [], []
        for _ in range(STEP_SAMPLES):
            t0 = time.perf_counter_ns()
            for lid in ids:
                client.lookup(lid, hashes, counts, [NS])
            only_lookups.append((time.perf_counter_ns() - t0) / 1000)
            t0 = time.perf_counter_ns()
            client.poll()
            for lid in ids:
                client.lookup(lid, hashes, counts, [NS])
            with_poll.append((time.perf_counter_ns() - t0) / 1000)
        assert client.pending_requests == STEP_LOOKUPS
    finally:
        client.close()
    only_lookups.sort()
    with_poll.sort()
    return {
        "pendingLookups": STEP_LOOKUPS,
        "samples": STEP_SAMPLES,
        "stepP50Us": percentile(only_lookups, 50),
        "stepP99Us": percentile(only_lookups, 99),
        "stepWithPollP50Us": percentile(with_poll, 50),
        "stepWithPollP99Us": percentile(with_poll, 99),
        "perLookupNs": percentile(only_lookups, 50) * 1000 / STEP_LOOKUPS,
    }


def table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="kvtier-pybench-"))
    me = [sys.executable, str(Path(__file__).resolve())]
    children: list[subprocess.Popen] = []
    results = []
    try:
        sidecar, kv_endpoint = start_sidecar(tmp)
        children.append(sidecar)
        echo, echo_endpoint = spawn_child(me + ["--child", "echo"])
        children.append(echo)
        reply, reply_endpoint = spawn_child(me + ["--child", "reply"])
        children.append(reply)
        client = KvtierClient(kv_endpoint, lookup_timeout_ms=30_000)
        shaped = KvtierClient(reply_endpoint, lookup_timeout_ms=30_000)
        payload = os.urandom(1024)
        prompts = {}
        for n in SIZES:
            hashes = os.urandom(32 * n)
            pend = [client.send_put(NS, hashes[32 * i : 32 * i + 32], 256, payload) for i in range(n)]
            for p in pend:
                if p.wait().outcome == "dropped":
                    raise RuntimeError("bench setup: put dropped")
            prompts[n] = (hashes, [256] * n)
        for n in SIZES:
            hashes, counts = prompts[n]
            msg = P.encode_lookup(1, "bench-000000", [NS], hashes, counts)
            measures = [
                EchoRtt(echo_endpoint, msg),
                LookupRtt(client, hashes, counts, f"bench{n}"),
                LookupRtt(shaped, hashes, counts, f"shaped{n}"),
                RawLookupRtt(kv_endpoint, hashes, counts, f"raw{n}"),
            ]
            try:
                raw, kv, own, side = interleaved(measures, RTT_SAMPLES)
            finally:
                for m in measures:
                    m.close()
            results.append(
                {
                    "kind": "rtt",
                    "chunks": n,
                    "messageBytes": len(msg),
                    "lookupP50Us": percentile(kv, 50),
                    "lookupP99Us": percentile(kv, 99),
                    "echoP50Us": percentile(raw, 50),
                    "echoP99Us": percentile(raw, 99),
                    "p50Ratio": percentile(kv, 50) / percentile(raw, 50),
                    "clientOnlyP50Us": percentile(own, 50),
                    "clientOnlyP99Us": percentile(own, 99),
                    "clientOnlyP50Ratio": percentile(own, 50) / percentile(raw, 50),
                    "rawLookupP50Us": percentile(side, 50),
                    "rawLookupP50Ratio": percentile(side, 50) / percentile(raw, 50),
                }
            )
        client.close()
        shaped.close()
        # a ROUTER that never reads: every lookup stays pending
        silent = zmq.Context.instance().socket(zmq.ROUTER)
        silent.setsockopt(zmq.LINGER, 0)
        port = silent.bind_to_random_port("tcp://127.0.0.1")
        step = step_cost(f"tcp://127.0.0.1:{port}")
        silent.close(0)
        results.append({"kind": "step", **step})
    finally:
        for c in children:
            if c.poll() is None:
                c.send_signal(signal.SIGTERM)
        for c in children:
            try:
                c.wait(15)
            except subprocess.TimeoutExpired:
                c.kill()

    rtt = [r for r in results if r["kind"] == "rtt"]
    print("\nPython lookup round trip, one request in flight (µs)")
    table(
        ["chunks", "msg bytes", "lookup p50", "lookup p99", "echo p50", "echo p99", "p50 ratio", "target", "client-only p50", "ratio", "sidecar-only p50", "ratio"],
        [
            [
                str(r["chunks"]), str(r["messageBytes"]), f"{r['lookupP50Us']:.0f}", f"{r['lookupP99Us']:.0f}",
                f"{r['echoP50Us']:.0f}", f"{r['echoP99Us']:.0f}", f"{r['p50Ratio']:.2f}", "<= 1.50",
                f"{r['clientOnlyP50Us']:.0f}", f"{r['clientOnlyP50Ratio']:.2f}",
                f"{r['rawLookupP50Us']:.0f}", f"{r['rawLookupP50Ratio']:.2f}",
            ]
            for r in rtt
        ],
    )
    print("  (client-only: the same lookup() against a ROUTER answering with a ready-made reply;")
    print("   sidecar-only: ready-made LOOKUP frames sent to the sidecar by a bare DEALER, no client;")
    print(f"   the four measures of a size take turns, {BLOCK} samples at a time)")
    print(f"\nScheduler step: {STEP_LOOKUPS} pending lookups asked about once each (µs)")
    table(
        ["step p50", "step p99", "with poll() p50", "with poll() p99", "per lookup (ns)", "target"],
        [[f"{step['stepP50Us']:.0f}", f"{step['stepP99Us']:.0f}", f"{step['stepWithPollP50Us']:.0f}", f"{step['stepWithPollP99Us']:.0f}", f"{step['perLookupNs']:.0f}", "< 1000"]],
    )
    out = {
        "bench": "python-lookup",
        "date": datetime.now(timezone.utc).isoformat(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "pyzmq": zmq.__version__,
            "libzmq": zmq.zmq_version(),
            "platform": platform.platform(),
        },
        "quick": QUICK,
        "samples": {"rtt": RTT_SAMPLES, "step": STEP_SAMPLES},
        "results": results,
    }
    dest = ROOT / "bench" / "results" / "python-lookup.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_dest = dest.with_suffix(".json.tmp")
    tmp_dest.write_text(json.dumps(out, indent=2) + "\n")
    tmp_dest.replace(dest)
    print("\nwrote bench/results/python-lookup.json")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        try:
            echo_child(sys.argv[2])
        except KeyboardInterrupt:
            pass
        sys.exit(0)
    sys.exit(main())
