"""Another process holding the port where Prometheus expects the agent, serving a page of its own (any local user
can bind a free port first): a port the configuration names is the agent's or none, so every command that serves
refuses to start, saying what to do (`outrider agent`, `outrider run` before it runs anything, the standalone agent
a workload starts, whether the address comes from a flag or the environment); only the default address falls back
to a free port, and says so with the address it serves instead."""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import free_port, http_get, outrider_cmd, reap

pytestmark = pytest.mark.integration
DEFAULT_PORT = 9477
REFUSAL = "another process holds it and would answer the scrapes meant for this agent"


@contextlib.contextmanager
def squatter(port: int) -> Iterator[str]:
    """An HTTP server on 127.0.0.1:port serving a fake /metrics; yields its URL."""

    class Fake(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"fake_metric 1\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Fake)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()


def clean_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}, **extra}


@pytest.mark.parametrize("how", ["agent", "run", "standalone --listen", "standalone OUTRIDER_LISTEN"])
def test_a_configured_port_another_process_holds_is_refused(tmp_path: Path, how: str) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    ran = tmp_path / "ran"
    env = clean_env()
    args = {"agent": ["agent", "--listen", address],
            "run": ["run", "--listen", address, "--", sys.executable, "-c", f"open({str(ran)!r}, 'w')"],
            "standalone --listen": ["standalone", "--spool-dir", str(tmp_path / "spool"), "--listen", address],
            "standalone OUTRIDER_LISTEN": ["standalone", "--spool-dir", str(tmp_path / "spool")]}[how]
    if how == "standalone OUTRIDER_LISTEN":
        env["OUTRIDER_LISTEN"] = address
    with squatter(port) as url:
        r = subprocess.run(outrider_cmd(*args), env=env, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        assert http_get(url + "/metrics")[2] == b"fake_metric 1\n", "the squatter still answers: no agent took over"
    assert r.returncode == 1, r.stderr
    assert f"cannot listen on {address}: " in r.stderr and REFUSAL in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert not ran.exists(), "outrider run started nothing"


@contextlib.contextmanager
def default_port_held() -> Iterator[None]:
    """127.0.0.1:9477 held: by this test, or already by someone else (another run's agent)."""
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):  # held already, which is what the test needs
            stack.enter_context(squatter(DEFAULT_PORT))
        yield


def test_the_default_address_falls_back_to_a_free_port_and_says_where(tmp_path: Path) -> None:
    with default_port_held():
        r = subprocess.run(outrider_cmd("run", "--quiet", "--", sys.executable, "-c", "pass"),
                           env=clean_env(OUTRIDER_RUNS_DIR=str(tmp_path / "runs")), capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
        m = re.search(r"127\.0\.0\.1:9477 \(the default address\) is held by another process, which answers "
                      r"whatever scrapes it; this agent serves http://127\.0\.0\.1:(\d+)/metrics instead", r.stderr)
        assert m and int(m.group(1)) != DEFAULT_PORT, r.stderr

        spool = tmp_path / "spool"
        p = subprocess.Popen(outrider_cmd("standalone", "--spool-dir", str(spool)), env=clean_env(),
                             stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        try:
            assert p.stderr is not None
            lines = []
            for line in p.stderr:
                lines.append(line)
                if "started one" in line:
                    break
            said = "".join(lines)
            m = re.search(r"this agent serves (http://127\.0\.0\.1:\d+)/metrics instead", said)
            assert m and f"serving {m.group(1)}/metrics" in said, said
            assert http_get(m.group(1) + "/readyz", timeout_s=30)[0] in (200, 503), "the agent is there"
        finally:
            p.send_signal(signal.SIGTERM)
            reap([p], timeout_s=30)


def test_port_zero_is_asked_for_and_never_busy() -> None:
    """`listen: HOST:0` takes a free port without falling back from anything: the sure way to run many agents."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        r = subprocess.run(outrider_cmd("run", "--quiet", "--listen", "127.0.0.1:0", "--", sys.executable, "-c",
                                        "pass"), env=clean_env(), capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and "held by another process" not in r.stderr, r.stderr
