"""The real agent loading the fake libnvidia-ml.so.1 by soname (LD_LIBRARY_PATH, as it finds the driver's), scraped
by the real Prometheus."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.gpu.conftest import Scenario
from tests.gpu.test_gpu_collector import FULL
from tests.helpers import AgentProcess
from tests.servers import PrometheusServer

pytestmark = pytest.mark.integration


def test_prometheus_sees_gpu_series_from_the_agent(fake_nvml: dict[str, str], scenario: Scenario,
                                                   tmp_path: Path) -> None:
    scenario.write(FULL + "gpu 0 proc 4242 1073741824 50\n")
    env = {"LD_LIBRARY_PATH": os.path.dirname(fake_nvml["full"]), "FAKE_NVML_SCENARIO": str(scenario.path)}
    with AgentProcess("--no-collector.process", env=env) as agent, \
            PrometheusServer(tmp_path / "prom", [f"127.0.0.1:{agent.port}"]) as prom:
        util = prom.wait_for('outrider_gpu_utilization_ratio{task="general"}')
        assert {r["metric"]["gpu"]: float(r["value"][1]) for r in util} == {"0": 0.87, "1": 0.0}
        used = prom.wait_for("sum(outrider_gpu_memory_used_bytes) / sum(outrider_gpu_memory_total_bytes)")
        assert float(used[0]["value"][1]) == pytest.approx(42949672960 / (2 * 85899345920))
        assert prom.wait_for('outrider_gpu_clock_event_active{reason="hw_power_brake_slowdown"} == 1')
        assert prom.wait_for('outrider_gpu_process_memory_bytes{pid="4242"}')
        assert prom.wait_for('outrider_collector_success{collector="gpu"} == 1')


def test_agent_without_nvml_runs_on_and_says_why(tmp_path: Path) -> None:
    env = {"LD_LIBRARY_PATH": str(tmp_path)}  # nothing there: no driver on this node
    with AgentProcess(env=env) as agent:
        text = agent.metrics()
        assert "outrider_gpu_nvml_up 0" in text
        assert 'outrider_collector_success{collector="host"} 1' in text
    assert agent.output.count("GPU metrics unavailable") == 1
