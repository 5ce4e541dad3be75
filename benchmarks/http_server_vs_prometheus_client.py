"""Outrider's endpoint server against prometheus_client's `start_http_server`, side by side in one run: 50
concurrent scrapes (p50/p99, plain and TLS), sequential scrapes from one client (kept alive where the server keeps
connections), and scrapes while 100 idle or half-sent connections are held.

Not a test: it prints figures (and writes them as JSON with --json). Each server runs in its own process and
serves the same pre-rendered exposition (prometheus_client's encoder is replaced by one returning the same bytes),
so what is compared is the HTTP layer alone. The client is curl (one process per batch; `--parallel` for the
concurrent scrapes), measurements alternate between the servers round by round, so machine noise hits both alike:
compare the ratios.

    python benchmarks/http_server_vs_prometheus_client.py [--rounds 20] [--samples 1000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers import cpu_seconds, free_port, self_signed

SERVERS = ("outrider", "prometheus_client")


def payload(samples: int) -> bytes:
    lines = ["# HELP bench_value A synthetic gauge.", "# TYPE bench_value gauge"]
    lines += [f'bench_value{{gpu="{i % 8}",series="{i}",job="train",instance="node-1:9477"}} {i * 1.5}'
              for i in range(samples)]
    return ("\n".join(lines) + "\n").encode()


def serve(kind: str, port: int, samples: int, cert: str, key: str) -> None:
    """The server process: serve until SIGTERM."""
    body = payload(samples)
    tls = (cert, key) if cert else None
    if kind == "outrider":
        from outrider.exporters.prometheus import Endpoints, MetricsServer, alerts_api_json

        # rendered: as the agent serves a sweep rendered ahead (a kept-alive scrape answered by the loop thread)
        server = MetricsServer(Endpoints(lambda om, gz: body, lambda: alerts_api_json([]), lambda: True,
                                         lambda: True, rendered=lambda om, gz: body), "127.0.0.1", port, tls)
        server.start()
    else:
        import prometheus_client
        import prometheus_client.exposition as exposition

        def choose_encoder(accept: str | None) -> tuple[object, str]:
            return (lambda registry: body), exposition.CONTENT_TYPE_LATEST

        exposition.choose_encoder = choose_encoder  # type: ignore[assignment]
        kw = {"certfile": cert, "keyfile": key} if tls else {}
        prometheus_client.start_http_server(port, addr="127.0.0.1", **kw)  # type: ignore[arg-type]
    print("ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("Threads:"))


class Server:
    def __init__(self, kind: str, samples: int, cert: str = "", key: str = "") -> None:
        self.kind, self.port = kind, free_port()
        self.scheme = "https" if cert else "http"
        self.url = f"{self.scheme}://127.0.0.1:{self.port}/metrics"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "agent")}
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--port", str(self.port),
                                      "--samples", str(samples), "--cert", cert, "--key", key],
                                     stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready", kind

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def curl(urls: list[str], cafile: str, parallel: bool, max_time_s: float = 20.0) -> list[tuple[float, int, int]]:
    """(seconds, HTTP status, new connections) per transfer; status 0 where the transfer failed."""
    cmd = ["curl", "-s", "--max-time", str(max_time_s),
           "-w", "%{time_total} %{http_code} %{num_connects}\\n"]
    if parallel:
        cmd += ["--parallel", "--parallel-immediate", "--parallel-max", str(len(urls))]
    if cafile:
        cmd += ["--cacert", cafile]
    for url in urls:
        cmd += [url, "-o", "/dev/null"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    rows = []
    for line in out.splitlines():
        t, code, connects = line.split()
        rows.append((float(t), int(code), int(connects)))
    return rows


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(rows: list[tuple[float, int, int]]) -> dict[str, float]:
    ok = [t for t, code, _ in rows if code == 200]
    return {"p50_ms": pct(ok, 0.5) * 1000, "p99_ms": pct(ok, 0.99) * 1000, "max_ms": max(ok, default=0) * 1000,
            "mean_ms": statistics.fmean(ok) * 1000 if ok else float("nan"), "failed": len(rows) - len(ok),
            "connects": sum(c for _, _, c in rows), "n": len(rows)}


def concurrent(servers: dict[str, Server], cafile: str, rounds: int) -> dict[str, dict[str, float]]:
    rows: dict[str, list[tuple[float, int, int]]] = {k: [] for k in servers}
    cpu: dict[str, float] = {k: 0.0 for k in servers}
    for _ in range(rounds):
        for kind, s in servers.items():
            c0 = cpu_seconds(s.proc.pid)
            rows[kind] += curl([s.url] * 50, cafile, parallel=True)
            cpu[kind] += cpu_seconds(s.proc.pid) - c0
    out = {k: summary(v) for k, v in rows.items()}
    for k in out:
        out[k]["server_cpu_ms_per_scrape"] = cpu[k] * 1000 / max(1, len(rows[k]))
    return out


def sequential(servers: dict[str, Server], cafile: str, rounds: int) -> dict[str, dict[str, float]]:
    """One client scraping back to back over a kept-alive connection (a new one where the server closes)."""
    rows: dict[str, list[tuple[float, int, int]]] = {k: [] for k in servers}
    for _ in range(rounds):
        for kind, s in servers.items():
            rows[kind] += curl([s.url] * 25, cafile, parallel=False)[1:]  # the first pays the connect
    return {k: summary(v) for k, v in rows.items()}


def held(servers: dict[str, Server], cafile: str, n: int = 100) -> dict[str, dict[str, float]]:
    """Scrapes while n connections are held: half idle (not even a TLS handshake), half with half a request."""
    out = {}
    for kind, s in servers.items():
        socks = []
        for _ in range(n):  # non-blocking: a server whose backlog is full leaves the SYN unanswered
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", s.port))
            socks.append(sock)
        connected: list[socket.socket] = []
        deadline = time.monotonic() + 10.0  # room for SYN retransmits (1 s, 3 s, 7 s) past a full backlog
        while len(connected) < n and time.monotonic() < deadline:
            pending = [x for x in socks if x not in connected]
            _, writable, _ = select.select([], pending, [], max(0.0, deadline - time.monotonic()))
            connected += [x for x in writable if x.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0]
        for i, sock in enumerate(connected):
            if i % 2 and s.scheme == "http":
                sock.send(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAcc")
        time.sleep(0.5)  # let the server take them
        rows = []
        for _ in range(10):
            rows += curl([s.url], cafile, parallel=False, max_time_s=5.0)
        out[kind] = {**summary(rows), "server_threads": threads(s.proc.pid), "held": len(connected)}
        for sock in socks:
            sock.close()
        time.sleep(0.5)
    return out


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b and a == a and b == b else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--samples", type=int, default=1000, help="series in the exposition")
    parser.add_argument("--json", help="write the figures here as JSON")
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cert", default="", help=argparse.SUPPRESS)
    parser.add_argument("--key", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.samples, args.cert, args.key)
        return 0
    import prometheus_client  # noqa: F401 - fail early if it is missing

    results: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    print(f"payload: {len(payload(args.samples))} bytes ({args.samples} series); {os.cpu_count()} CPUs; "
          f"{sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = self_signed(Path(tmp))
        cert, key = str(cert_path), str(key_path)
        for scheme in ("http", "https"):
            kw = {"cert": cert, "key": key} if scheme == "https" else {}
            cafile = cert if scheme == "https" else ""
            servers = {k: Server(k, args.samples, **kw) for k in SERVERS}
            try:
                results[scheme] = {
                    "50 concurrent scrapes": concurrent(servers, cafile, args.rounds),
                    "sequential scrapes, one client": sequential(servers, cafile, args.rounds),
                    "a scrape while 100 connections are held": held(servers, cafile),
                }
            finally:
                for s in servers.values():
                    s.stop()
    for scheme, tests in results.items():
        print(f"\n== {scheme} ==")
        print(f"{'':44} {'outrider':>26} {'prometheus_client':>26} {'ratio':>7}")
        for test, by in tests.items():
            o, p = by["outrider"], by["prometheus_client"]
            print(f"{test}")
            for m in ("p50_ms", "p99_ms", "max_ms", "failed", "connects", "server_cpu_ms_per_scrape",
                      "server_threads", "held"):
                if m in o:
                    print(f"  {m:42} {o[m]:>26.3f} {p[m]:>26.3f} {ratio(o[m], p[m]):>7}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
