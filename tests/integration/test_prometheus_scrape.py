"""The real Prometheus server scrapes the real `outrider agent`; promtool checks the exposition."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import need_binary
from tests.helpers import AgentProcess, sleeper
from tests.integration.servers import PrometheusServer

pytestmark = pytest.mark.integration


def test_prometheus_scrapes_host_process_and_self_series(tmp_path: Path) -> None:
    work = sleeper(120)
    try:
        with AgentProcess("--pid", str(work.pid)) as agent, \
                PrometheusServer(tmp_path / "prom", [f"127.0.0.1:{agent.port}"]) as prom:
            up = prom.wait_for('up{job="outrider"} == 1')
            assert up[0]["metric"]["instance"] == f"127.0.0.1:{agent.port}"
            mem = prom.wait_for("outrider_host_memory_limit_bytes")
            meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
            assert float(mem[0]["value"][1]) == int(meminfo["MemTotal"].split()[0]) * 1024
            rss = prom.wait_for(f'outrider_process_memory_rss_bytes{{pid="{work.pid}"}}')
            assert rss[0]["metric"]["name"].startswith("python")
            assert float(rss[0]["value"][1]) > 1_000_000
            procs = prom.wait_for("outrider_watched_processes")
            assert float(procs[0]["value"][1]) == 1, "watching one sleeping process"
            assert prom.wait_for('outrider_collector_success{collector="host"} == 1')
            assert prom.wait_for('outrider_collector_success{collector="process"} == 1')
            # counters are usable with rate(): at least two samples of a moving counter
            assert prom.wait_for("rate(outrider_host_cpu_seconds_total[10s]) > 0", timeout_s=90)
            # the scrape itself was clean: no series dropped or rejected by Prometheus
            assert prom.wait_for('scrape_samples_scraped{job="outrider"} > 50')
    finally:
        work.kill()
        work.wait()


def test_promtool_accepts_the_exposition() -> None:
    promtool = need_binary("promtool")
    with AgentProcess() as agent:
        text = agent.metrics()
    assert "outrider_host_cpu_seconds_total" in text
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
