"""What a running `outrider agent` loads: libraries that cost memory without serving its configuration stay out.

OpenSSL (through ssl, hashlib or hmac) costs 3-4 MiB of RSS, http.client and the email package another 1-2 MiB,
psutil 1.8 MiB: an agent on its defaults (all collectors, the built-in rules, the log receiver, plain HTTP) uses
none of them. The real CLI runs in a subprocess, answers a scrape, and prints its modules; the same probe run with
TLS on shows ssl, so it can see what it looks for. (How much RSS that saves is measured in
benchmarks/agent_vs_node_exporter.py, never here.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, free_port, self_signed

# Runs the agent's CLI in the main thread (it installs signal handlers) and, beside it, waits for the first sweep
# to be served (a plain scrape with gzip, as Prometheus asks) or, with TLS, for the sampler to run; then prints the
# loaded modules and stops the agent with SIGTERM, as Kubernetes would.
PROBE = r"""
import os, signal, socket, sys, threading, time

def get(port, path):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data

def probe(port, plain):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if plain and get(port, "/readyz").startswith(b"HTTP/1.1 200") and b"200" in get(port, "/metrics")[:12]:
                break
        except OSError:
            pass
        if not plain and any(t.name == "outrider-sampler" for t in threading.enumerate()):
            break
        time.sleep(0.1)
    print("MODULES", " ".join(sorted(sys.modules)), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

port, plain = int(sys.argv[1]), sys.argv[2] == "plain"
threading.Thread(target=probe, args=(port, plain), daemon=True).start()
from outrider.commands.cli import main
sys.argv = ["outrider", "agent", "--listen", f"127.0.0.1:{port}"]
sys.exit(main())
"""

HEAVY = ("ssl", "_ssl", "hashlib", "_hashlib", "hmac", "http.client", "email", "psutil", "urllib.request")


def loaded_modules(tmp_path: Path, plain: bool, **settings: str) -> set[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "agent") + ":" + str(REPO),
           "OUTRIDER_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path), **settings}
    out = subprocess.run([sys.executable, "-c", PROBE, str(free_port()), "plain" if plain else "tls"],
                         env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stdout.splitlines() if line.startswith("MODULES ")]
    assert lines, f"the probe never saw the agent serve: {out.stderr[-2000:]}"
    return set(lines[0].split()[1:])


def test_the_default_agent_loads_no_openssl_no_http_client_no_psutil(tmp_path: Path) -> None:
    modules = loaded_modules(tmp_path, True)
    assert "outrider.rules.engine" in modules and "outrider.collectors.gpu" in modules, "the defaults ran"
    assert sorted(m for m in HEAVY if m in modules) == []


def test_tls_on_the_endpoint_loads_ssl_where_it_is_needed(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path / "tls")
    modules = loaded_modules(tmp_path, False, OUTRIDER_TLS_CERT_FILE=str(cert), OUTRIDER_TLS_KEY_FILE=str(key))
    assert "ssl" in modules


def test_alert_fingerprints_are_still_sha256_of_the_labels() -> None:
    """They are persisted (the outbox, runs.db, PagerDuty's dedup key): hashing without OpenSSL changes no digest."""
    import hashlib

    from outrider.rules.rule import fingerprint

    labels = (("alertname", "GpuMemoryNearlyFull"), ("gpu", "3"), ("note", "é\n\x00"))
    expected = hashlib.sha256("\x00".join(f"{k}\x01{v}" for k, v in labels).encode()).hexdigest()[:16]
    assert fingerprint(labels) == expected
