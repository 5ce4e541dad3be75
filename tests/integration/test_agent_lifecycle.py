"""The agent process: endpoints, content negotiation, clean stop on SIGTERM/SIGINT, clear start-up errors."""

from __future__ import annotations

import gzip
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from tests.helpers import AgentProcess, free_port, http_get, outrider_cmd, samples, wait_until

pytestmark = pytest.mark.integration


def test_endpoints_and_content_negotiation() -> None:
    with AgentProcess() as agent:
        status, headers, body = http_get(agent.url + "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert ("outrider_agent_info", (("version", "0.1.0"),)) in samples(body.decode())
        prom_accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        status, headers, body = http_get(agent.url + "/metrics", {"Accept": prom_accept})
        assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        names = {f.name for f in parse_openmetrics(body.decode())}
        assert "outrider_host_cpu_seconds" in names
        status, headers, body = http_get(agent.url + "/metrics", {"Accept-Encoding": "gzip"})
        assert headers["Content-Encoding"] == "gzip"
        assert b"outrider_host_load1" in gzip.decompress(body)
        assert http_get(agent.url + "/healthz")[0] == 200
        assert http_get(agent.url + "/readyz")[0] == 200
        assert http_get(agent.url + "/nope")[0] == 404
        # the scrapes above are counted on the next sweep
        wait_until(lambda: (samples(agent.metrics()).get(("outrider_agent_scrapes_total", ())) or 0) >= 3,
                   timeout_s=30, what="the scrapes counted")


SHUTDOWN_TIMEOUT_S = 1.0
EXIT_MARGIN_S = 4.0  # the interpreter's own exit after the bounded stop: joins no thread, flushes the log


@pytest.mark.parametrize("otlp", ["none", "a receiver that never answers"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stops_cleanly_on_signal_within_the_bound(sig: signal.Signals, otlp: str) -> None:
    """shutdown_timeout_s bounds the stop, even when the final OTLP export meets a receiver that takes the
    connection and never answers (its own timeout, 120 s, would hold the stop that long unbounded)."""
    env = {"OUTRIDER_SHUTDOWN_TIMEOUT_S": str(SHUTDOWN_TIMEOUT_S)}
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(16)  # never accepted: connections complete in the backlog, no byte ever comes back
        if otlp != "none":
            env.update(OUTRIDER_OTLP_ENDPOINT=f"http://127.0.0.1:{blackhole.getsockname()[1]}",
                       OUTRIDER_OTLP_TIMEOUT_S="120", OUTRIDER_OTLP_INTERVAL_S="0.5")
        agent = AgentProcess(env=env)
        started = time.monotonic()
        code = agent.stop(sig, timeout_s=150)
        elapsed = time.monotonic() - started
    assert code == 0, agent.output
    assert elapsed < SHUTDOWN_TIMEOUT_S + EXIT_MARGIN_S, f"stopped after {elapsed:.1f} s\n{agent.output}"
    assert "Traceback" not in agent.output


def test_a_busy_port_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run(outrider_cmd("agent", "--listen", f"127.0.0.1:{port}"), capture_output=True, text=True,
                           timeout=30)
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr


def test_an_unknown_otlp_protocol_is_a_configuration_error() -> None:
    r = subprocess.run(outrider_cmd("agent", "--otlp-protocol", "carrier-pigeon"), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "flag --otlp-protocol" in r.stderr


HIDE_GRPC_EXPORTER = """
import importlib.abc, sys

class HideGrpcExporter(importlib.abc.MetaPathFinder):
    \"\"\"An environment without the 'grpc' extra: h2, the gRPC client's HTTP/2, cannot be imported.\"\"\"
    def find_spec(self, name, path=None, target=None):
        if (name + ".").startswith("h2."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, HideGrpcExporter())
"""


def test_grpc_without_its_extra_is_one_clear_configuration_error(tmp_path: Path) -> None:
    """The real thing: the gRPC exporter's HTTP/2 absent from the environment (hidden by an import hook that
    sitecustomize installs before the agent starts), OTLP over gRPC asked for."""
    (tmp_path / "sitecustomize.py").write_text(HIDE_GRPC_EXPORTER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    hidden = subprocess.run([sys.executable, "-c", "import h2"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert hidden.returncode == 1 and "ModuleNotFoundError" in hidden.stderr, "the hook hides the exporter"
    r = subprocess.run(outrider_cmd("agent", "--listen", f"127.0.0.1:{free_port()}", "--otlp-protocol", "grpc",
                                    "--otlp-endpoint", "http://127.0.0.1:4317"),
                       env={**env, "OUTRIDER_STATE_DIR": str(tmp_path / "state")}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("outrider: configuration error: otlp_protocol 'grpc' needs the gRPC exporter: "
                               "pip install 'outrider[grpc]'"), lines[0]


HIDE_RICH = HIDE_GRPC_EXPORTER.replace('startswith("h2.")', 'startswith("rich.")').replace("h2, the gRPC client's "
                                                                                           "HTTP/2", "rich")


def test_top_without_its_extra_names_the_extra(tmp_path: Path) -> None:
    """rich is the 'top' extra (the agent's image leaves it out): `outrider top` without it says what to install."""
    (tmp_path / "sitecustomize.py").write_text(HIDE_RICH)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    r = subprocess.run(outrider_cmd("top", "--once", "--url", f"http://127.0.0.1:{free_port()}"), env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "pip install 'outrider[top]'" in r.stderr


def test_metrics_once_prints_one_sweep() -> None:
    r = subprocess.run(outrider_cmd("metrics", "--once", "--pid", str(1)), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    parsed = samples(r.stdout)
    assert parsed[("outrider_collector_success", (("collector", "host"),))] == 1
    assert ("outrider_host_cpu_utilization_ratio", ()) in parsed, "primed by a first sweep"


def test_demo_runs_the_synthetic_workload_and_reports(tmp_path: object) -> None:
    r = subprocess.run([sys.executable, "-m", "outrider", "demo", "--duration", "12"], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    # the workload slows down on purpose: the agent's own evaluator fires the demo alert, then resolves it
    fired = r.stderr.find("alert DemoStepTimeRegression FIRING {instance=demo, job=outrider, severity=warning}")
    resolved = r.stderr.find("alert DemoStepTimeRegression RESOLVED")
    assert 0 <= fired < resolved, r.stderr
    assert re.search(r"DemoStepTimeRegression \(warning\)\s+(pending\s+at\s+[\d:]+,\s+)?fired\s+at\s+[\d:]+,"
                     r"\s+resolved\s+at\s+[\d:]+\s+after\s+[\d.]+\s+s:\s+"
                     r"Training\s+steps\s+on\s+demo\s+take\s+[\d.]+ms", r.stderr), r.stderr
    assert "exited with code 0" in r.stderr
    assert "cores" in r.stderr and "peak RSS" in r.stderr
    duration = r"([\d.]+ (?:µs|ms|s))"
    training = re.search(rf"training\s+([\d,]+) steps, [\d.,]+ steps/s, step time p50 {duration}, p99 {duration}, "
                         rf"([\d,]+) samples/s",
                         r.stderr)
    assert training, r.stderr
    steps, p50, p99 = int(training.group(1).replace(",", "")), _seconds(training.group(2)), _seconds(training.group(3))
    assert steps > 5 and 0 < p50 <= p99
    assert re.search(rf"data-loader wait p50 {duration}, [\d.]+% of the loop waiting for data", r.stderr), r.stderr
    inference = re.search(rf"inference\s+([\d,]+) requests on /predict/\{{model\}}, latency p50 {duration}, "
                          rf"p90 {duration}, p99 {duration}; ([\d,]+) errors", r.stderr)
    assert inference, r.stderr
    assert re.search(r"\nverdict: \w+", r.stderr) and "report: " in r.stderr, r.stderr
    assert int(inference.group(1).replace(",", "")) > 10
    assert _seconds(inference.group(2)) <= _seconds(inference.group(4))


def _seconds(text: str) -> float:
    """A duration as the summary prints it (12.3 ms) in seconds."""
    number, unit = text.split()
    return float(number) * {"µs": 1e-6, "ms": 1e-3, "s": 1.0}[unit]
