"""The endpoint's server against hostile and slow peers, over real sockets on 127.0.0.1: idle and half-open
connections (plain and TLS) hold no thread and block nobody, deadlines close them, the connection table and the
worker pool are bounded, the listen backlog is deep, and a kept-alive response is one TCP segment; with every
behaviour of /metrics, the alerts API, the probes, basic auth and TLS kept.

The server serves fake `Endpoints` (fixed bodies): what is under test is the HTTP layer, not the sweep."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from outrider.adapters.http_server import HttpServer, Limits, Request, Response
from outrider.exporters.prometheus import Endpoints, MetricsServer, alerts_api_json
from outrider.metrics.exposition import PROTOBUF_CONTENT_TYPE, Format
from tests.helpers import http_get, self_signed, wait_until

pytestmark = pytest.mark.integration
BODY = b"# HELP up_test A test gauge.\n# TYPE up_test gauge\nup_test 1\n"
PROTOBUF_BODY = b"\x0b\x0a\x07up_test\x18\x01"  # a MetricFamily: its length, name and type
# what Prometheus 2.42 sends with --enable-feature=native-histograms (captured from the real server)
NATIVE_ACCEPT = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
                 "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,"
                 "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PASSWORD = "s3rver-pw-Zk2"
CLIENT_TIMEOUT_S = 10.0  # a hang bound: a server that blocks makes the client time out, never a speed test


def endpoints(ready: bool = True) -> Endpoints:
    def exposition(fmt: Format, use_gzip: bool) -> bytes:
        body = {"openmetrics": BODY + b"# EOF\n", "protobuf": PROTOBUF_BODY}.get(fmt, BODY)
        return gzip.compress(body) if use_gzip else body

    # rendered: the bodies are fixed, so always ready: kept-alive scrapes are answered by the server's loop thread
    return Endpoints(exposition, lambda: alerts_api_json([]), lambda: True, lambda: ready, rendered=exposition)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[MetricsServer]:
    kw = getattr(request, "param", {})
    s = MetricsServer(endpoints(), "127.0.0.1", 0, **kw)
    s.start()
    yield s
    s.stop()


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[str, str]:
    cert, key = self_signed(tmp_path)
    return str(cert), str(key)


def get(server: MetricsServer, path: str = "/metrics", headers: dict[str, str] | None = None,
        context: ssl.SSLContext | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    host, port = server.address
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection(host, port, timeout=CLIENT_TIMEOUT_S, context=context) if context
        else http.client.HTTPConnection(host, port, timeout=CLIENT_TIMEOUT_S))
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def half_sent(server: MetricsServer, n: int, tls: ssl.SSLContext | None = None) -> list[socket.socket]:
    """n connections that send the start of a request and then nothing."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(server.address, timeout=CLIENT_TIMEOUT_S)
        if tls is not None:
            s = tls.wrap_socket(s, server_hostname="127.0.0.1")
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: te")
        socks.append(s)
    return socks


def server_side_connections(server: MetricsServer | HttpServer) -> int:
    port = server.address[1]
    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server closes; a server that never does makes recv time out (TimeoutError)."""
    try:
        return sock.recv(1) == b""
    except (ssl.SSLEOFError, ConnectionResetError):
        return True  # closed without a TLS close_notify: a close all the same


def closed_counts(server: MetricsServer) -> dict[str, float]:
    """outrider_agent_connections_closed_total by reason, as the self collector exports it."""
    family = next(f for f in server.families() if f.defn.name == "outrider_agent_connections_closed_total")
    return {labels[0]: v for labels, v in family.samples}


def client_tls(cert: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cert)


# --- the regressions -------------------------------------------------------------------------------------------------

def test_an_idle_tcp_connection_to_the_tls_port_blocks_nobody(tls_files: tuple[str, str]) -> None:
    """It used to: the handshake ran in the accept loop without a timeout, so one silent socket stopped the server."""
    s = MetricsServer(endpoints(), "127.0.0.1", 0, tls=tls_files)
    s.start()
    idle = socket.create_connection(s.address)  # no ClientHello, ever
    try:
        assert get(s, "/healthz", context=client_tls(tls_files[0]))[0] == 200
        assert get(s, "/metrics", context=client_tls(tls_files[0]))[2] == BODY
    finally:
        idle.close()
        s.stop()


@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "tls"])
def test_a_hundred_half_sent_requests_hold_no_thread_and_block_nobody(use_tls: bool,
                                                                      tls_files: tuple[str, str]) -> None:
    """It used to hold a thread per connection for as long as the peer liked (100 half-sent requests: 100
    threads)."""
    limits = Limits(workers=4)
    s = MetricsServer(endpoints(), "127.0.0.1", 0, tls=tls_files if use_tls else None, limits=limits)
    s.start()
    context = client_tls(tls_files[0]) if use_tls else None
    before = set(threading.enumerate())  # the server's loop and workers among them (and other tests' leftovers)
    socks = half_sent(s, 100, context)
    try:
        assert get(s, context=context)[2] == BODY
        assert set(threading.enumerate()) - before == set(), "the pool and the loop exist already: none per connection"
    finally:
        for sock in socks:
            sock.close()
        s.stop()


@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "tls"])
def test_a_half_sent_request_and_a_silent_connection_are_closed_at_the_header_deadline(
        use_tls: bool, tls_files: tuple[str, str]) -> None:
    s = MetricsServer(endpoints(), "127.0.0.1", 0, tls=tls_files if use_tls else None,
                      limits=Limits(header_timeout_s=0.3))
    s.start()
    context = client_tls(tls_files[0]) if use_tls else None
    silent = socket.create_connection(s.address, timeout=CLIENT_TIMEOUT_S)  # not even a TLS handshake
    half = half_sent(s, 1, context)[0]
    try:
        assert closed_by_server(silent), "closed by the server, not left to the client's timeout"
        assert closed_by_server(half)
        assert get(s, context=context)[0] == 200
        assert closed_counts(s) == {"evicted": 0, "timed_out": 2}  # counted for the operator
    finally:
        silent.close()
        half.close()
        s.stop()


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() -> None:
    s = MetricsServer(endpoints(), "127.0.0.1", 0, limits=Limits(idle_timeout_s=0.3))
    s.start()
    conn = http.client.HTTPConnection(*s.address, timeout=CLIENT_TIMEOUT_S)
    try:
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        assert r.read() == BODY and r.getheader("Connection") is None  # kept alive...
        assert conn.sock is not None and closed_by_server(conn.sock)  # ...until it idles past the timeout
    finally:
        conn.close()
        s.stop()


# --- kept-alive scrapes answered by the loop thread ---------------------------------------------------------------

class Stuck:
    """An HTTP server (the class under the endpoint) whose handler blocks on /stuck until released; the loop's quick
    handler answers /metrics from a fixed body, as a sweep rendered ahead."""

    def __init__(self, limits: Limits, body: bytes = BODY) -> None:
        self.release = threading.Event()
        self.body = body
        self.http = HttpServer("127.0.0.1", 0, self.handle, limits=limits, quick=self.quick)
        self.http.start()

    def handle(self, request: Request) -> Response:
        if request.path == "/stuck":
            self.release.wait(CLIENT_TIMEOUT_S)
        return Response(200, self.body)

    def quick(self, request: Request) -> Response | None:
        return Response(200, self.body) if request.path == "/metrics" else None

    def kept_alive(self) -> http.client.HTTPConnection:
        """A connection that had its first answer (from a worker, as every new connection has)."""
        conn = http.client.HTTPConnection(*self.http.address, timeout=CLIENT_TIMEOUT_S)
        conn.request("GET", "/metrics")
        assert conn.getresponse().read() == self.body
        return conn

    def close(self) -> None:
        self.release.set()
        self.http.stop()


def test_with_every_worker_stuck_a_kept_alive_scrape_is_answered_by_the_loop_thread() -> None:
    server = Stuck(Limits(workers=2))
    conn = server.kept_alive()
    stuck = [server.kept_alive() for _ in range(2)]
    try:
        for c in stuck:  # both workers now wait in the handler
            c.request("GET", "/stuck")
        for _ in range(3):
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            r = conn.getresponse()
            assert r.status == 200 and r.read() == BODY and r.getheader("Connection") is None
        assert server.http.answered_on_loop >= 3
        server.release.set()
        for c in stuck:
            assert c.getresponse().read() == BODY, "the workers' requests answered once released"
    finally:
        for c in [conn, *stuck]:
            c.close()
        server.close()


def voluntary_switches(thread: threading.Thread) -> int:
    with open(f"/proc/self/task/{thread.native_id}/status") as fh:
        return int(fh.read().split("voluntary_ctxt_switches:")[1].split()[0])


def settled_switches(thread: threading.Thread) -> int:
    """The thread's count once it has gone back to sleep after an answer: unchanged over 0.4 s (on a loaded
    machine the loop can still be on its way back to its selector, waiting for the GIL, when the client has read
    the answer). A loop that wakes every second still shows a wake-up in the 2.5 s that follow."""
    deadline = time.monotonic() + 10.0
    count = voluntary_switches(thread)
    while time.monotonic() < deadline:
        time.sleep(0.4)
        now = voluntary_switches(thread)
        if now == count:
            return count
        count = now
    raise AssertionError("the loop thread kept waking for 10 s after an answer")


def test_an_idle_server_loop_sleeps_until_its_next_deadline() -> None:
    """A kept-alive connection between two scrapes (Prometheus's, every 15 s or more): the loop thread sleeps
    until the connection's idle deadline or a byte arrives; it used to wake every second for nothing."""
    server = Stuck(Limits(idle_timeout_s=3600))
    conn = server.kept_alive()
    try:
        conn.request("GET", "/metrics")
        assert conn.getresponse().read() == BODY
        loop = server.http._threads[0]
        before = settled_switches(loop)
        time.sleep(2.5)
        assert voluntary_switches(loop) == before, "no wake-up while nothing happens"
        conn.request("GET", "/metrics")
        assert conn.getresponse().read() == BODY
    finally:
        conn.close()
        server.close()


def test_the_loop_thread_closes_a_half_sent_later_request_at_its_header_deadline() -> None:
    """After a scrape, the next request head arrives in part and stops: closed header_timeout_s after its first
    byte, not at the idle deadline (an hour here, longer than the client waits)."""
    server = Stuck(Limits(header_timeout_s=0.3, idle_timeout_s=3600))
    conn = server.kept_alive()
    try:
        conn.request("GET", "/metrics")
        assert conn.getresponse().read() == BODY
        assert conn.sock is not None
        conn.sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAcc")
        assert closed_by_server(conn.sock)
        assert server.http.timed_out == 1
    finally:
        conn.close()
        server.close()


def test_the_loop_thread_closes_a_connection_that_does_not_read_its_response_at_the_write_deadline() -> None:
    """A client asks for an exposition larger than the sockets' buffers and reads nothing: the loop writes what
    fits, waits at most write_timeout_s (idle_timeout_s is an hour), then closes the connection."""
    body = os.urandom(8 << 20)
    server = Stuck(Limits(write_timeout_s=0.3, idle_timeout_s=3600), body)
    conn = server.kept_alive()
    try:
        assert conn.sock is not None
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        on_loop = server.http.answered_on_loop
        conn.sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        for _ in range(int(CLIENT_TIMEOUT_S / 0.05)):  # a hang bound: the server's own counter says when
            if server.http.timed_out:
                break
            time.sleep(0.05)
        assert server.http.timed_out == 1 and server.http.answered_on_loop == on_loop + 1
        assert server_side_connections(server.http) == 0, "the server's end is closed"
    finally:
        conn.close()
        server.close()


def test_connections_beyond_the_table_never_hold_more_sockets_and_a_scrape_still_gets_through() -> None:
    limits = Limits(workers=2, max_connections=8)
    s = MetricsServer(endpoints(), "127.0.0.1", 0, limits=limits)
    s.start()
    socks = half_sent(s, 50)
    try:
        assert get(s)[2] == BODY  # the oldest waiting connections are closed to make room
        assert server_side_connections(s) <= limits.max_connections
        assert closed_counts(s)["evicted"] >= 50 + 1 - limits.max_connections
    finally:
        for sock in socks:
            sock.close()
        s.stop()


# The server in a process of its own, whose descriptors the test can use up: `fill` opens /dev/null until EMFILE,
# `free` closes them again, `stats` prints its accept errors and what it logged.
OUT_OF_DESCRIPTORS = """
import json, logging, os, resource, sys, time
from outrider.adapters.http_server import HttpServer, Response
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
logged = []
class Keep(logging.Handler):
    def emit(self, record):
        logged.append(record.getMessage())
logging.getLogger("outrider").addHandler(Keep())
logging.getLogger("outrider").setLevel(logging.INFO)
server = HttpServer("127.0.0.1", 0, lambda request: Response(200, b"ok\\n"))
server.start()
print(server.address[1], flush=True)
held = []
for line in sys.stdin:
    if line.strip() == "fill":
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
    elif line.strip() == "free":
        for fd in held:
            os.close(fd)
        held = []
    errors = dict(getattr(server, "accept_errors", {}))
    print(json.dumps({"errors": errors, "logged": logged, "at": time.monotonic()}), flush=True)
"""


def test_out_of_descriptors_the_server_pauses_accepting_without_spinning_then_serves_the_waiting_client(
        tmp_path: Path) -> None:
    """The agent's accept loop once spun on EMFILE (the listener stays readable) and logged about 40,000 lines a
    second, with /metrics unreachable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", OUT_OF_DESCRIPTORS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
    assert p.stdin is not None and p.stdout is not None
    answers: list[int] = []
    try:
        port = int(p.stdout.readline())

        def say(command: str) -> dict:  # type: ignore[type-arg]
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write(command + "\n")
            p.stdin.flush()
            return json.loads(p.stdout.readline())

        first = say("fill")
        assert first["errors"] == {}
        client = threading.Thread(target=lambda: answers.append(http_get(f"http://127.0.0.1:{port}/metrics",
                                                                          timeout_s=60)[0]), daemon=True)
        client.start()  # waits in the listen backlog while the server has no descriptor to accept it with
        def failing() -> dict | None:  # type: ignore[type-arg]
            stats = say("stats")
            tried = stats["errors"].get("emfile", 0) >= 5 or len(stats["logged"]) >= 5
            return stats if tried else None
        stats = wait_until(failing, timeout_s=30, interval_s=0.05, what="five failed accepts")
        failures = stats["errors"].get("emfile", 0)
        # Pauses of 50 ms doubling up to 1 s: at most 20 tries a second (a spinning loop makes thousands; a loaded
        # machine only makes fewer).
        assert failures <= 20 * (stats["at"] - first["at"]) + 1, failures
        said = [m for m in stats["logged"] if "cannot accept" in m]
        assert len(said) == 1 and "Too many open files" in said[0], stats["logged"]
        assert say("free")["errors"]["emfile"] >= failures
        client.join(timeout=60)
        assert answers == [200], "the waiting client is served once descriptors are back"
        assert any("accepts connections again" in m for m in say("stats")["logged"])
    finally:
        p.kill()
        p.wait()


def test_the_listen_backlog_is_at_least_128(server: MetricsServer) -> None:
    """It was 5: 50 concurrent scrapes overflowed it and waited for SYN retransmits (p99 1.3 s)."""
    port = server.address[1]
    listening = [c for c in psutil.Process().net_connections(kind="tcp")
                 if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN]
    assert len(listening) == 1
    with socket.fromfd(listening[0].fd, socket.AF_INET, socket.SOCK_STREAM) as sock:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    max_backlog = struct.unpack_from("I", info, 28)[0]  # tcp_info.tcpi_sacked: sk_max_ack_backlog when listening
    assert max_backlog >= 128


def test_a_kept_alive_response_arrives_in_one_tcp_segment(server: MetricsServer) -> None:
    """Headers and body written separately made a kept-alive scrape wait on Nagle against the client's delayed ACK
    (about 40 ms, against 0.6 ms on a new connection): each response must be one write, hence one segment here
    (loopback's MSS is far above the response's size)."""
    sock = socket.create_connection(server.address, timeout=CLIENT_TIMEOUT_S)

    def data_segments_in() -> int:  # tcp_info.tcpi_data_segs_in (Linux 4.6+)
        return int(struct.unpack_from("I", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 160), 152)[0])

    try:
        reader = sock.makefile("rb")
        counts = []
        for _ in range(5):
            before = data_segments_in()
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            head = []
            while (line := reader.readline()) not in (b"\r\n", b""):
                head.append(line.decode("latin-1").strip())
            assert head[0] == "HTTP/1.1 200 OK" and "Connection: close" not in head
            length = next(int(h.split(":")[1]) for h in head if h.lower().startswith("content-length:"))
            assert reader.read(length) == BODY
            counts.append(data_segments_in() - before)
        assert counts == [1] * 5
    finally:
        sock.close()


@pytest.mark.parametrize(("raw", "status"), ids=["garbage", "http-0.9", "http-2.0", "no-colon", "folded", "40k-header",
                                                  "40k-unfinished", "post-body", "latin-1-header"], argvalues=[
    (b"garbage\r\n\r\n", 400),
    (b"GET /metrics\r\n\r\n", 400),  # HTTP/0.9
    (b"GET /metrics HTTP/2.0\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\n folded: header\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 40_000 + b"\r\n\r\n", 431),
    (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 40_000, 431),  # too long before it even ends
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", 405),
    (b"GET /metrics HTTP/1.1\r\nHost: \xff\xfe\r\n\r\n", 200),  # header bytes are latin-1, never a crash
])
def test_a_malformed_request_is_answered_and_closed_and_the_server_serves_on(server: MetricsServer, raw: bytes,
                                                                              status: int) -> None:
    sock = socket.create_connection(server.address, timeout=CLIENT_TIMEOUT_S)
    try:
        sock.sendall(raw)
        reader = sock.makefile("rb")
        assert reader.readline().split(b" ", 2)[1] == str(status).encode()
        if status != 200:
            assert reader.read().endswith(b"\n") and closed_by_server(sock)
    finally:
        sock.close()
    assert get(server)[2] == BODY


# --- what the server kept --------------------------------------------------------------------------------------------

def test_metrics_formats_gzip_head_probes_and_alerts() -> None:
    s = MetricsServer(endpoints(ready=False), "127.0.0.1", 0)
    s.start()
    try:
        status, headers, body = get(s)
        assert (status, body) == (200, BODY) and headers["content-type"].startswith("text/plain; version=0.0.4")
        status, headers, body = get(s, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert headers["content-type"].startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
        status, headers, body = get(s, headers={"Accept": NATIVE_ACCEPT})
        assert headers["content-type"] == PROTOBUF_CONTENT_TYPE and body == PROTOBUF_BODY
        status, headers, body = get(s, headers={"Accept-Encoding": "gzip"})
        assert headers["content-encoding"] == "gzip" and gzip.decompress(body) == BODY
        status, headers, body = get(s, method="HEAD")
        assert status == 200 and body == b"" and headers["content-length"] == str(len(BODY))
        assert get(s, "/healthz")[0] == 200 and get(s, "/readyz")[0] == 503
        status, headers, body = get(s, "/api/v1/alerts")
        assert status == 200 and body == b'{"status": "success", "data": {"alerts": []}}'
        assert get(s, "/nope")[0] == 404 and get(s, "/metrics", method="POST")[0] == 405
        assert s.scrapes == 5  # the server counts its own /metrics answers (GET and HEAD)
    finally:
        s.stop()


def test_a_server_told_not_to_serve_protobuf_answers_a_native_histogram_scraper_with_openmetrics() -> None:
    s = MetricsServer(endpoints(), "127.0.0.1", 0, protobuf=False)
    s.start()
    try:
        status, headers, body = get(s, headers={"Accept": NATIVE_ACCEPT})
        assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
        assert body == BODY + b"# EOF\n"
    finally:
        s.stop()


@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "tls"])
def test_a_large_exposition_arrives_whole_on_a_kept_alive_connection(use_tls: bool,
                                                                     tls_files: tuple[str, str]) -> None:
    big = b"".join(b'big_series{n="%d"} %d\n' % (i, i) for i in range(120_000))  # ~3 MB: many writes
    s = MetricsServer(Endpoints(lambda om, gz: big, lambda: b"{}", lambda: True, lambda: True,
                                rendered=lambda om, gz: big), "127.0.0.1", 0, tls=tls_files if use_tls else None)
    s.start()
    host, port = s.address
    conn = (http.client.HTTPSConnection(host, port, timeout=CLIENT_TIMEOUT_S, context=client_tls(tls_files[0]))
            if use_tls else http.client.HTTPConnection(host, port, timeout=CLIENT_TIMEOUT_S))
    try:
        for _ in range(3):
            conn.request("GET", "/metrics")
            assert conn.getresponse().read() == big
    finally:
        conn.close()
        s.stop()


def test_basic_auth_guards_metrics_and_alerts_only_and_tls_below_1_2_is_refused(tls_files: tuple[str, str]) -> None:
    s = MetricsServer(endpoints(), "127.0.0.1", 0, tls=tls_files, basic_auth=("prometheus", PASSWORD))
    s.start()
    ctx = client_tls(tls_files[0])
    good = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()}
    bad = {"Authorization": "Basic " + base64.b64encode(b"prometheus:nope").decode()}
    try:
        assert s.url.startswith("https://")
        assert get(s, context=ctx)[0] == 401 and get(s, context=ctx, headers=bad)[0] == 401
        assert get(s, "/api/v1/alerts", context=ctx)[0] == 401
        assert get(s, context=ctx, headers=good)[2] == BODY
        assert get(s, "/healthz", context=ctx)[0] == 200 and get(s, "/readyz", context=ctx)[0] == 200
        old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        old.check_hostname, old.verify_mode = False, ssl.CERT_NONE
        old.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this client offer TLS 1.1 where OpenSSL still can
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            old.minimum_version, old.maximum_version = ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(s, context=old)
    finally:
        s.stop()


def test_ipv6_and_port_zero() -> None:
    try:
        s = MetricsServer(endpoints(), "::1", 0)
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    s.start()
    try:
        assert s.address[1] > 0 and s.url == f"http://[::1]:{s.address[1]}"
        conn = http.client.HTTPConnection("::1", s.address[1], timeout=CLIENT_TIMEOUT_S)
        conn.request("GET", "/metrics")
        assert conn.getresponse().read() == BODY
        conn.close()
    finally:
        s.stop()


def test_the_exporter_imports_neither_the_sampler_nor_the_rule_engine() -> None:
    code = ("import sys, outrider.exporters.prometheus; "
            "print(sorted(m for m in sys.modules if m in ('outrider.wiring.sampler', 'outrider.rules.engine')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ}).stdout.strip()
    assert out == "[]"
