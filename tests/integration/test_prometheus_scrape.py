"""The real Prometheus server scrapes the real `outrider agent`; promtool checks the exposition."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import need_binary
from tests.helpers import AgentProcess, http_get, samples, sleeper, wait_until
from tests.servers import PrometheusServer

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
            # The scrape was clean: every sample of the last scrape was ingested (Prometheus counts what it parsed
            # in scrape_samples_scraped and appends, in the same transaction, only what it accepts: a duplicate
            # series, an out-of-order or out-of-bounds sample is parsed but not stored)...
            assert prom.wait_for('scrape_samples_scraped{job="outrider"} > 50')
            ingested = 'count({job="outrider", __name__!~"up|scrape_.+"})'
            assert prom.wait_for(f'{ingested} == scalar(scrape_samples_scraped{{job="outrider"}}) and '
                                 f'{ingested} == scalar(scrape_samples_post_metric_relabeling{{job="outrider"}})')
            # ... Prometheus's own counters of rejected samples say so too ...
            own = samples(http_get(prom.url + "/metrics")[2].decode())
            for rejected in ("duplicate_timestamp", "out_of_order", "out_of_bounds"):
                assert own[(f"prometheus_target_scrapes_sample_{rejected}_total", ())] == 0, rejected
            assert own[("prometheus_target_scrapes_exceeded_sample_limit_total", ())] == 0
            # ... and it holds every metric the agent exposes, by name.
            def names_match() -> bool:
                stored = {r["metric"]["__name__"] for r in prom.query(
                    'group by (__name__) ({job="outrider", __name__!~"up|scrape_.+"})')}
                return stored == {name for name, _ in samples(agent.metrics())}
            wait_until(names_match, timeout_s=30, what="the names Prometheus stored to be those the agent exposes")
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


def test_hostile_shards_never_take_the_target_down(tmp_path: Path) -> None:
    """A workload's shard with names Prometheus refuses (a space, a dash, __name__, le on a histogram) or counts
    it cannot take (NaN, infinity) once made a real Prometheus mark the whole target down, losing every host and GPU
    series with it. Now each bad series is dropped alone and counted; the target stays up."""
    import json
    import os

    from outrider.shared import spool

    sp = tmp_path / "spool"
    sp.mkdir(mode=0o700)
    entries = [["ok_total", "counter", {"k": "v"}, 0, []],
               ["bad name_total", "counter", {}, 1, []],
               ["bad-name_total", "counter", {}, 2, []],
               ["__name__", "counter", {}, 3, []],
               ["h_seconds", "histogram", {"le": "0.5"}, 4, [1.0]],
               ["nan_seconds", "histogram", {}, 7, [1.0]],
               ["inf_total", "counter", {}, 10, []]]
    values = [3.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.5, float("nan"), 0.0, 1.0, float("inf")]
    w = spool.ShardWriter(str(sp), os.getpid(), 1)  # this test's pid: a live process the agent can see
    w.write(json.dumps({"meta": {"rank": "0"}, "series": entries}).encode(), values, flags=0, pid=os.getpid(),
            stalls=0, start_ns=1, heartbeat_ns=1, last_step_ns=0, steps=0, stalled_since_ns=0)
    with AgentProcess(env={"OUTRIDER_SPOOL_DIR": str(sp)}) as agent, \
            PrometheusServer(tmp_path / "prom", [f"127.0.0.1:{agent.port}"]) as prom:
        assert prom.wait_for('up{job="outrider"} == 1')
        assert prom.wait_for('ok_total{k="v",rank="0"} == 3')
        assert prom.wait_for("outrider_host_memory_limit_bytes")
        errors = prom.wait_for('outrider_hook_shard_errors_total{reason="invalid_series"}')
        assert float(errors[0]["value"][1]) >= 6, "each bad series counted"
        assert prom.query('up{job="outrider"} == 0') == []
