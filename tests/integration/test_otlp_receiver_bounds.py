"""The local OTLP receiver under many and hostile clients: the agent's bounded server
(outrider/adapters/http_server.py), with a fixed pool of workers, a budget for the request bodies of all clients, and
the request's limit enforced on the whole request.

Once it ran a thread per connection: the agent's peak RSS went from 51 MiB with one 4 MiB upload to 233 MiB with 10
and 599 MiB with 50 at once (the chart's limit is 128 MiB), a client trickling its body was never cut off (the 10 s
limit applied to each read), and each client that left mid-request printed a 19-line traceback. Memory is measured
as the agent's peak RSS in its own process; no figure here is a duration."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from outrider.adapters.http_server import Limits
from outrider.collectors import otlp_receiver
from outrider.collectors.base import CollectorContext
from outrider.collectors.otlp_receiver import MAX_BODY_BYTES, OtlpReceiverCollector
from outrider.ground.config import Config
from outrider.metrics.exposition import render
from tests.helpers import AgentProcess, free_port, rss_bytes, samples, value, wait_until

pytestmark = pytest.mark.integration


def upload_body(size: int = MAX_BODY_BYTES - (128 << 10)) -> bytes:
    """A valid OTLP request of about `size` bytes: one gauge of many points (past the series caps: parsed, then
    mostly left out)."""
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = "upload.points"
    i = 0
    while request.ByteSize() < size:
        for _ in range(500):
            point = metric.gauge.data_points.add()
            point.as_double = i
            kv = point.attributes.add()
            kv.key, kv.value.string_value = "id", f"{i:040d}"
            i += 1
    return request.SerializeToString()


def post(port: int, body: bytes, results: list[object]) -> None:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/v1/metrics", body=body, headers={"Content-Type": "application/x-protobuf"})
        response = c.getresponse()
        results.append((response.status, response.getheader("Retry-After")))
        c.close()
    except OSError as e:
        results.append(type(e).__name__)


def peak_with_uploads(n: int, body: bytes) -> tuple[int, list[object], str]:
    """The agent's peak RSS once n clients have each uploaded `body` at once; their answers; its /metrics."""
    port = free_port()
    with AgentProcess(env={"OUTRIDER_OTLP_RECEIVER_LISTEN": f"127.0.0.1:{port}", "OUTRIDER_RULE_FILES": "",
                           "OUTRIDER_COLLECTORS": "otlp_receiver,self"}) as agent:
        results: list[object] = []
        clients = [threading.Thread(target=post, args=(port, body, results)) for _ in range(n)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        taken = sum(r == (200, None) for r in results)
        page = wait_until(lambda: (lambda t: t if value(samples(t), "outrider_otlp_receiver_requests_total",
                                                        result="accepted") == taken else None)(agent.metrics()),
                          timeout_s=30, what="the uploads counted")
        return rss_bytes(agent.proc.pid, "VmHWM"), results, page


def test_fifty_uploads_at_once_cost_the_agent_about_what_one_does() -> None:
    body = upload_body()
    one, results, _ = peak_with_uploads(1, body)
    assert results == [(200, None)]
    fifty, results, page = peak_with_uploads(50, body)
    print(f"\npeak RSS: {one / 2**20:.1f} MiB after one 4 MiB upload, {fifty / 2**20:.1f} MiB after 50 at once "
          f"({fifty / (128 << 20):.2f} of the chart's 128 MiB limit)")
    assert fifty - one < 32 << 20, (one, fifty)
    # every client had an answer: taken, or told to come back (OTLP exporters retry a 503 after Retry-After)
    assert all(r in ((200, None), (503, "1")) for r in results), results
    taken = sum(r == (200, None) for r in results)
    assert taken >= 1 and taken + sum(r == (503, "1") for r in results) == 50
    parsed = samples(page)
    assert value(parsed, "outrider_otlp_receiver_requests_total", result="accepted") == taken
    assert value(parsed, "outrider_otlp_receiver_requests_total", result="busy") == 50 - taken


def test_clients_that_leave_mid_request_are_counted_not_traced() -> None:
    port = free_port()
    with AgentProcess(env={"OUTRIDER_OTLP_RECEIVER_LISTEN": f"127.0.0.1:{port}", "OUTRIDER_RULE_FILES": "",
                           "OUTRIDER_COLLECTORS": "otlp_receiver,self"}) as agent:
        for i in range(20):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                          b"Content-Length: 100000\r\n\r\n" + b"\0" * (1000 * i))
        wait_until(lambda: value(samples(agent.metrics()), "outrider_otlp_receiver_requests_total",
                                 result="aborted") == 20, timeout_s=30, what="20 early disconnects counted")
        status, _ = (lambda r: (r.status, r.read()))(_post_once(port, upload_body(64 << 10)))
        assert status == 200, "and the receiver serves on"
        output = agent.output
    assert "Traceback" not in output and "ConnectionResetError" not in output, output


def _post_once(port: int, body: bytes) -> http.client.HTTPResponse:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/metrics", body=body, headers={"Content-Type": "application/x-protobuf"})
    return c.getresponse()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiverCollector]:
    """The receiver in this process, its request limit 1 s (10 s in the agent) so a test waits less for it."""
    limits = otlp_receiver.RECEIVER_LIMITS
    monkeypatch.setattr(otlp_receiver, "RECEIVER_LIMITS", Limits(**{**limits.__dict__, "header_timeout_s": 1.0}))
    collector = OtlpReceiverCollector(CollectorContext(Config(otlp_receiver_listen=f"127.0.0.1:{free_port()}")))
    try:
        yield collector
    finally:
        collector.close()


def test_a_client_trickling_its_body_is_cut_off_at_the_requests_limit_not_each_reads(
        receiver: OtlpReceiverCollector) -> None:
    """A byte every 0.2 s: each read waits far less than the limit (which is all the limit bound before), the
    whole request far more."""
    assert receiver.address is not None
    with socket.create_connection(receiver.address) as s:
        s.sendall(b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        sent = 0
        s.settimeout(0.2)
        while sent < 1000:
            try:
                s.sendall(b"\0")
            except OSError:  # reset: cut off
                break
            sent += 1
            try:
                if s.recv(1) == b"":
                    break  # closed by the receiver
            except TimeoutError:
                continue
            except OSError:
                break
            time.sleep(0.2)
    assert sent < 1000, "cut off before its body was whole"
    fam = {labels: v for labels, v in
           samples(render(receiver.collect()).decode()).items() if labels[0] == "outrider_otlp_receiver_requests_total"}
    assert fam[("outrider_otlp_receiver_requests_total", (("result", "timed_out"),))] == 1


def test_an_oversized_or_unsized_body_is_refused_before_it_is_read(receiver: OtlpReceiverCollector) -> None:
    assert receiver.address is not None
    port = receiver.address[1]
    for head, status in ((f"Content-Length: {MAX_BODY_BYTES + 1}", 413), ("Transfer-Encoding: chunked", 411)):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(f"POST /v1/metrics HTTP/1.1\r\nHost: x\r\n{head}\r\n\r\n".encode())
            assert s.recv(100).startswith(f"HTTP/1.1 {status} ".encode()), head
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/v1/metrics")
    response = c.getresponse()
    assert (response.status, response.getheader("Allow")) == (405, "POST")
    parsed = samples(render(receiver.collect()).decode())
    assert value(parsed, "outrider_otlp_receiver_requests_total", result="too_large") == 1
    assert value(parsed, "outrider_otlp_receiver_requests_total", result="bad_request") == 1


def test_the_receivers_server_is_the_bounded_one(tmp_path: Path) -> None:
    """No thread per connection: 40 idle connections leave the agent's thread count where it was."""
    port = free_port()
    with AgentProcess(env={"OUTRIDER_OTLP_RECEIVER_LISTEN": f"127.0.0.1:{port}", "OUTRIDER_RULE_FILES": "",
                           "OUTRIDER_COLLECTORS": "otlp_receiver,self"}) as agent:
        threads = len(list(Path(f"/proc/{agent.proc.pid}/task").iterdir()))
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
        try:
            for s in held:
                s.sendall(b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
            assert _post_once(port, upload_body(1 << 10)).status == 200
            assert len(list(Path(f"/proc/{agent.proc.pid}/task").iterdir())) == threads
        finally:
            for s in held:
                s.close()
