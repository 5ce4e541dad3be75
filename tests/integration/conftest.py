"""The service world shared by the middleware and OpenTelemetry-conformance tests (started once per session).

A real agent (every collector, fake-NVML GPUs owned by pods of a fake kubelet, OTLP export to a receiver built from
opentelemetry-proto) watches two real services that its hook instruments: FastAPI under uvicorn (ASGI middleware)
and Flask under werkzeug's WSGI server (WSGI middleware). Real HTTP requests go to both; the tests read what the
agent's /metrics and its OTLP exports say about them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.kubelet import FakeKubelet, short_socket_dir
from tests.gpu.conftest import fake_nvml  # noqa: F401 - the session's fake libnvidia-ml.so.1
from tests.gpu.test_gpu_attribution import PODS, SCENARIO
from tests.helpers import REPO, AgentProcess, free_port, samples, value, wait_until
from tests.servers import HostilePeer, OtlpHttpReceiver, otlp_points

APPS = Path(__file__).with_name("apps")
FASTAPI_OK = {"route": "/items/{item_id}", "method": "GET", "scheme": "http", "status_code": "200",
              "status_class": "2xx"}
FLASK_OK = {"route": "/predict/<model>", "method": "GET", "scheme": "http", "status_code": "200",
            "status_class": "2xx"}


@dataclass
class ServiceWorld:
    agent: AgentProcess
    receiver: OtlpHttpReceiver
    fastapi_url: str
    flask_url: str

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return samples(self.agent.metrics())

    def latest_export(self) -> dict[str, list[tuple[Any, Any]]]:
        """The metrics of the last OTLP export (each export is a whole cumulative snapshot)."""
        return otlp_points(self.receiver.requests[-1:])


def request(url: str, method: str = "GET") -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, data=b"" if method == "POST" else None),
                                    timeout=10) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def services(fake_nvml: dict[str, str]) -> Iterator[ServiceWorld]:  # noqa: F811 - the fixture imported above
    with tempfile.TemporaryDirectory(prefix="outrider-services-test-") as tmp, short_socket_dir() as sock_dir:
        spool, scenario = Path(tmp) / "spool", Path(tmp) / "scenario.txt"
        scenario.write_text(SCENARIO + "gpu 0 nvlinks 1\ngpu 0 nvlink_error 0 2 5\n")
        sock = os.path.join(sock_dir, "kubelet.sock")
        base = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_"))}
        hooked = {**base, "OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2",
                  "OUTRIDER_STANDALONE": "false",
                  "PYTHONPATH": os.pathsep.join([str(REPO / "agent"), str(REPO), base.get("PYTHONPATH", "")])}
        fastapi_port, flask_port = free_port(), free_port()
        procs: list[subprocess.Popen[bytes]] = []
        with FakeKubelet(sock, PODS), OtlpHttpReceiver() as receiver:
            agent_env = {"LD_LIBRARY_PATH": os.path.dirname(fake_nvml["full"]), "FAKE_NVML_SCENARIO": str(scenario),
                         "OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_K8S_POD_RESOURCES_SOCKET": sock,
                         "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OUTRIDER_OTLP_INTERVAL_S": "0.5",
                         "OUTRIDER_PROCESS_TOP_N": "3",  # so that the rest is summed as "other"
                         "POD_NAME": "outrider-node-x1", "POD_NAMESPACE": "monitoring", "NODE_NAME": "gpu-node-1",
                         "CONTAINER_NAME": "not-from-the-downward-api"}
            with AgentProcess(env=agent_env, interval_s=0.5) as agent:
                try:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "uvicorn", "tests.integration.apps.fastapi_app:app", "--host",
                         "127.0.0.1", "--port", str(fastapi_port), "--log-level", "warning"], cwd=REPO, env=hooked))
                    procs.append(subprocess.Popen([sys.executable, str(APPS / "flask_app.py"), str(flask_port)],
                                                  cwd=REPO, env=hooked))
                    world = ServiceWorld(agent, receiver, f"http://127.0.0.1:{fastapi_port}",
                                         f"http://127.0.0.1:{flask_port}")
                    wait_until(lambda: request(world.fastapi_url + "/items/0") == 200, timeout_s=60,
                               interval_s=0.2, what="uvicorn serving the FastAPI app")
                    wait_until(lambda: request(world.flask_url + "/predict/warmup") == 200, timeout_s=60,
                               interval_s=0.2, what="the WSGI server serving the Flask app")
                    for i in (1, 2):
                        assert request(f"{world.fastapi_url}/items/{i}") == 200
                        assert request(f"{world.flask_url}/predict/m{i}") == 200
                    assert request(world.fastapi_url + "/v1/chat", "POST") == 200
                    assert request(world.fastapi_url + "/busy") == 503
                    assert request(world.fastapi_url + "/nowhere/7") == 404
                    assert request(world.fastapi_url + "/items/3", "PURGE") == 405
                    assert request(world.flask_url + "/generate", "POST") == 200
                    wait_until(lambda: value(world.metrics(), "outrider_requests_total", **FASTAPI_OK) == 3
                               and value(world.metrics(), "outrider_requests_total", **FLASK_OK) == 3,
                               timeout_s=60, what="both services' requests on the agent's /metrics")
                    seen = len(receiver.requests)
                    wait_until(lambda: len(receiver.requests) > seen + 1 and "http.server.request.duration" in
                               world.latest_export(), timeout_s=60, what="an OTLP export after the requests")
                    yield world
                finally:
                    for proc in procs:
                        _stop(proc)


@pytest.fixture
def peer(request: pytest.FixtureRequest) -> Iterator[HostilePeer]:
    p = HostilePeer(request.param)
    try:
        yield p
    finally:
        p.close()
