"""CPU per scrape and per exported sample of `outrider agent` on a fleet node's size, side by side in one run with
node_exporter's per-sample figure (its comparable collectors, as benchmarks/agent_vs_node_exporter.py runs it).

The node is benchmarks/fleet_sizing.py's: `outrider agent` on the defaults (every collector; `rule_files` empty, as
node_exporter evaluates none), 8 H100-like GPUs from the fake libnvidia-ml (tests/fakes/fake_nvml.c) whose readings
drift every interval, and benchmarks/fleet_workload.py's workload: 4 training ranks (processes, each on a GPU)
and an inference server with two routes, publishing through the hook into the node's spool. Both exporters are
scraped one after the other every interval over kept-alive connections asking for gzip, the agent as Prometheus
asks (OpenMetrics); the agent sweeps at the scrape interval, so it pays one sweep per scrape, as node_exporter
does. CPU is utime + stime (clock ticks: the agent runs a collector that may block on a thread of its own each
sweep, whose CPU a live threads' sum would miss), over the whole run and window by window (the noise).

Not a test: it prints figures (and writes them as JSON with --json).

    python benchmarks/fleet_node_cost.py [--seconds 120] [--windows 6] [--interval 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "agent"))

from tests.fakes.build import build  # noqa: E402
from tests.helpers import cpu_seconds  # noqa: E402

from benchmarks.agent_vs_node_exporter import Scraper, node_exporter_command, wait_ready  # noqa: E402
from benchmarks.fleet_sizing import (  # noqa: E402
    PROMETHEUS_ACCEPT,
    Processes,
    agent_ready,
    base_env,
    fetch,
    free_port,
    start_node,
    wait_until,
    write_scenario,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="length of the measured window")
    ap.add_argument("--windows", type=int, default=6, help="sub-windows the ratio is also given for (noise)")
    ap.add_argument("--interval", type=float, default=1.0, help="scrape and sweep interval, seconds")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--step-s", type=float, default=0.5, help="training step time of the workload")
    ap.add_argument("--request-s", type=float, default=0.1, help="seconds between inference requests")
    ap.add_argument("--flush-interval", type=float, default=1.0, help="the hook's shard updates (its default)")
    ap.add_argument("--json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="outrider-fleet-node-"))
    procs = Processes()
    node = None
    try:
        rng = random.Random(29)
        lib = build(work / "nvml")["full"]
        node = start_node(0, args, work, lib, procs, rng)
        ne_port = free_port()
        ne = procs.start(node_exporter_command(ne_port), base_env(work), work / "node_exporter.log")
        wait_until(lambda: agent_ready(node), 120, "the agent")
        wait_ready(f"http://127.0.0.1:{ne_port}/metrics")
        time.sleep(2 * args.interval + 2 * args.flush_interval + 1)  # every shard published and read
        figures = measure(args, node, ne, ne_port, rng)
        figures["collector_ms_last_sweep"] = collector_durations(node)
    finally:
        if node is not None:
            (node.dir / "hold").touch()
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    report(figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


def measure(args: argparse.Namespace, node: Any, ne: Any, ne_port: int, rng: random.Random) -> dict[str, Any]:
    agent = node.agent
    port = node.target.rsplit(":", 1)[1]
    scrape = {"outrider": Scraper(int(port), accept=PROMETHEUS_ACCEPT), "node_exporter": Scraper(ne_port)}
    pids = {"outrider": agent.pid, "node_exporter": ne.pid}
    for s in scrape.values():
        s()
    totals = {k: {"cpu": 0.0, "samples": 0} for k in pids}
    windows: list[dict[str, Any]] = []
    scrapes, next_at = 0, time.monotonic()
    for _ in range(args.windows):
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        got = dict.fromkeys(pids, 0)
        n = 0
        end = time.monotonic() + args.seconds / args.windows
        while time.monotonic() < end:
            write_scenario(node, args.gpus, rng)  # the GPUs' readings drift every interval
            for k, s in scrape.items():
                got[k] += s()
            n += 1
            next_at += args.interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in pids.items()}
        per_sample = {k: 1e6 * cpu[k] / got[k] for k in pids}
        windows.append({"scrapes": n, "cpu_ms_per_scrape": {k: 1e3 * cpu[k] / n for k in pids},
                        "cpu_us_per_sample": per_sample,
                        "ratio": per_sample["outrider"] / per_sample["node_exporter"]})
        for k in pids:
            totals[k]["cpu"] += cpu[k]
            totals[k]["samples"] += got[k]
        scrapes += n
    per_sample = {k: 1e6 * totals[k]["cpu"] / totals[k]["samples"] for k in pids}
    ratios = sorted(w["ratio"] for w in windows)
    return {
        "interval_s": args.interval, "scrapes": scrapes, "gpus": args.gpus, "ranks": args.ranks,
        "samples_per_scrape": {k: totals[k]["samples"] / scrapes for k in pids},
        "cpu_ms_per_scrape": {k: 1e3 * totals[k]["cpu"] / scrapes for k in pids},
        "cpu_us_per_sample": per_sample,
        "cpu_per_sample_ratio_outrider_over_node_exporter": per_sample["outrider"] / per_sample["node_exporter"],
        "ratio_by_window": {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]},
        "windows": windows,
    }


def collector_durations(node: Any) -> dict[str, float]:
    """Where a sweep's time goes: each collector's duration in the latest sweep (the agent's own
    outrider_collector_duration_seconds, wall time), in ms."""
    out = {}
    for line in fetch(node, accept="text/plain")[2].splitlines():
        if line.startswith("outrider_collector_duration_seconds{"):
            name = line.split('collector="', 1)[1].split('"', 1)[0]
            out[name] = 1e3 * float(line.rsplit(" ", 1)[1])
    return out


def report(f: dict[str, Any]) -> None:
    spp, cps, cus = f["samples_per_scrape"], f["cpu_ms_per_scrape"], f["cpu_us_per_sample"]
    print(f"a fleet node: {f['gpus']} fake GPUs, {f['ranks']} hooked ranks and an inference server; {f['scrapes']} "
          f"scrapes every {f['interval_s']:g} s of each, kept-alive, gzip")
    print(f"{'':34}{'node_exporter':>15}{'outrider':>12}{'ratio':>8}")
    print(f"{'samples per scrape':34}{spp['node_exporter']:>15.0f}{spp['outrider']:>12.0f}")
    print(f"{'CPU ms per scrape (agent: +sweep)':34}{cps['node_exporter']:>15.2f}{cps['outrider']:>12.2f}"
          f"{cps['outrider'] / cps['node_exporter']:>8.2f}")
    r = f["ratio_by_window"]
    print(f"{'CPU us per exported sample':34}{cus['node_exporter']:>15.2f}{cus['outrider']:>12.2f}"
          f"{f['cpu_per_sample_ratio_outrider_over_node_exporter']:>8.2f}  (by window: median {r['median']:.2f}, "
          f"{r['min']:.2f}-{r['max']:.2f})")
    print("the agent's collectors in its last sweep (wall ms): " + ", ".join(
        f"{k} {v:.2f}" for k, v in sorted(f["collector_ms_last_sweep"].items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    raise SystemExit(main())
