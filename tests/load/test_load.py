"""Bounded load on 127.0.0.1: /metrics with about 10,000 series under concurrent scrapers; 64 hooked processes
publishing at once; a workload that spawns thousands of processes. Figures are printed, never asserted against the
clock; what is asserted is correctness and boundedness."""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, AgentProcess, after_more, http_get, reap, rss_bytes, samples, value, wait_until

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent


def test_ten_thousand_series_under_concurrent_scrapers(tmp_path: Path) -> None:
    spool, hold = tmp_path / "spool", tmp_path / "hold"
    # the test's agent is the agent: without STANDALONE=false the publishers, started first, elect their own
    # (`outrider standalone --detach`), which outlived the test
    env = {"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.5", "OUTRIDER_STANDALONE": "false"}
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    publishers = [subprocess.Popen([sys.executable, str(HERE / "many_series.py"), str(hold), f"p{i}"],
                                   env={**base, **env}) for i in range(20)]
    try:
        with AgentProcess(env=env, interval_s=1.0) as agent:
            def loaded() -> dict | None:  # type: ignore[type-arg]
                parsed = samples(agent.metrics())
                return parsed if sum(1 for (n, _) in parsed if n.startswith("load_p")) == 10_000 else None
            parsed = wait_until(loaded, timeout_s=60, what="10,000 hook series on /metrics")
            capped = sum(1 for (n, _) in parsed if n == "requests_by_id_total")
            assert capped == 100, "a request-id label is capped at hook_max_series_per_metric in each process"
            assert value(parsed, "outrider_hook_dropped_total", reason="series_limit_per_metric", rank="") == 20 * 400
            assert value(parsed, "outrider_hook_shard_errors_total", reason="corrupt") is None, "no half-made shard"
            rss_before = rss_bytes(agent.proc.pid)
            latencies: list[float] = []
            errors = 0

            def scraper() -> None:
                nonlocal errors
                for _ in range(25):
                    t0 = time.perf_counter()
                    status, _, body = http_get(agent.url + "/metrics", {"Accept-Encoding": "gzip"}, timeout_s=30)
                    latencies.append(time.perf_counter() - t0)
                    if status != 200 or not body:
                        errors += 1

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                for f in [pool.submit(scraper) for _ in range(8)]:
                    f.result()
            rss_after = rss_bytes(agent.proc.pid)
            latencies.sort()
            print(f"\n10k series, 8 scrapers x 25: p50 {1000 * statistics.median(latencies):.1f} ms, p99 "
                  f"{1000 * latencies[int(0.99 * (len(latencies) - 1))]:.1f} ms, RSS {rss_before / 2**20:.0f} -> "
                  f"{rss_after / 2**20:.0f} MiB")
            assert errors == 0 and len(latencies) == 200
            assert rss_after < rss_before * 1.5, "serving scrapes does not grow the agent"
    finally:
        hold.write_text("x")
        reap(publishers)


def test_sixty_four_hooked_processes_at_once(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    env = {"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2", "OUTRIDER_STANDALONE": "false"}
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    with AgentProcess(env={**env}, interval_s=0.5) as agent:
        procs = [subprocess.Popen([sys.executable, str(REPO / "tests" / "hook" / "workload.py"), "--steps", "30",
                                   "--step-sleep", "0.01"], env={**base, **env}) for _ in range(64)]
        try:
            for p in procs:
                assert p.wait(timeout=120) == 0
        finally:
            reap(procs, timeout_s=0)
        wait_until(lambda: value(samples(agent.metrics()), "outrider_train_steps_total", rank="") == 64 * 30,
                   timeout_s=60, what="64 x 30 steps, each counted once")
        parsed = samples(agent.metrics())
        assert value(parsed, "outrider_samples_total", rank="") == 64 * 30 * 4
        wait_until(lambda: not list(spool.glob("*.shard")), timeout_s=30, what="all 64 shards cleaned up")


def test_a_workload_spawning_thousands_of_processes_stays_bounded(tmp_path: Path) -> None:
    script = tmp_path / "spawner.py"
    script.write_text(
        "import subprocess, sys\n"
        "procs = []\n"
        "for i in range(2000):\n"
        "    procs.append(subprocess.Popen(['sleep', '0.5']))  # bursts that outlast sweeps on a slow machine\n"
        "    if len(procs) >= 200:\n"
        "        [p.wait() for p in procs]; procs = []\n"
        "[p.wait() for p in procs]\n")
    from tests.helpers import free_port

    port = free_port()
    run = subprocess.Popen([sys.executable, "-m", "outrider", "run", "--listen", f"127.0.0.1:{port}", "--interval",
                            "0.2", "--quiet", "--summary-json", str(tmp_path / "s.json"), "--", sys.executable,
                            str(script)], stderr=subprocess.PIPE, text=True)
    series: list[int] = []
    try:
        while run.poll() is None:  # sampled while it runs, as a scraper would
            try:
                parsed = samples(http_get(f"http://127.0.0.1:{port}/metrics", timeout_s=5)[2].decode())
            except OSError:
                time.sleep(0.1)
                continue
            series.append(sum(1 for (n, _) in parsed if n == "outrider_process_memory_rss_bytes"))
            time.sleep(0.1)
        _, err = run.communicate(timeout=60)
    finally:
        reap([run], timeout_s=0)
    assert run.returncode == 0, err
    assert series and max(series) <= 11, "per-process series stay at top N (10) plus other"
    import json

    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["max_processes"] >= 20, "the bursts were seen"


def multiproc_file(path: Path, series: int, size: int) -> None:
    """A prometheus_client multiprocess file of one counter with `series` label values (about 220 bytes an entry),
    sparse up to `size` bytes, as a worker's file grows by doubling."""
    pad = b"p" * 124
    with path.open("wb") as fh:
        fh.write(b"\0" * 8)
        for i in range(series):
            key = b'["requests", "requests_total", {"path": "/api/%s/%08d"}, "Requests."]' % (pad, i)
            fh.write(len(key).to_bytes(4, "little") + key + b"\0" * (8 - (len(key) + 4) % 8)
                     + struct.pack("<dd", 1.0, 0.0))
        used = fh.tell()
        fh.truncate(size)
        fh.seek(0)
        fh.write(used.to_bytes(4, "little"))


def test_a_64_mib_multiprocess_file_of_300000_series_leaves_the_agent_within_its_memory_limit(tmp_path: Path) -> None:
    """The agent's peak RSS reading a service's prometheus_client file of 300,000 label values (64 MiB), beside the
    same agent reading a file of 100: the caps apply as the file is read, so no more than they allow is ever held
    (the whole file and every series were held before: a peak of 186 MiB from 23 MiB; the chart's limit is
    128 MiB)."""
    peaks = {}
    for series, size in ((100, 1 << 16), (300_000, 64 << 20)):
        directory = tmp_path / str(series)
        directory.mkdir()
        multiproc_file(directory / "counter_1.db", series, size)
        env = {"PROMETHEUS_MULTIPROC_DIR": str(directory), "OUTRIDER_COLLECTORS": "prometheus_multiproc,self",
               "OUTRIDER_RULE_FILES": ""}
        with AgentProcess(env=env, interval_s=0.5) as agent:
            parsed = samples(after_more(agent, "outrider_agent_sweeps_total", 3, timeout_s=120))
            assert sum(1 for (n, _) in parsed if n == "requests_total") == 100, "hook_max_series_per_metric kept"
            assert value(parsed, "outrider_collector_success", collector="prometheus_multiproc") == 1
            peaks[series] = rss_bytes(agent.proc.pid, "VmHWM")
    print(f"\npeak RSS: {peaks[100] / 2**20:.1f} MiB with 100 series, {peaks[300_000] / 2**20:.1f} MiB with "
          f"300,000 in 64 MiB ({peaks[300_000] / (128 << 20):.2f} of the chart's 128 MiB limit)")
    assert peaks[300_000] - peaks[100] < 16 << 20, peaks
