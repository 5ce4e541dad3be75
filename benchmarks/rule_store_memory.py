"""Memory and CPU of the agent's embedded rule evaluation with the default catalog on an 8-GPU training node.

Not a test: it prints figures. The series are what a real sweep of the host, process, GPU (fake libnvidia-ml,
8 H100-like GPUs) and self collectors gives, plus hook series for 8 training ranks (one per GPU) and 4 inference
routes; values move every interval. The engine is fed one sweep per rule interval for longer than the longest
window any rule reads (a day of baselines plus 15 minutes of simulated time), evaluating the whole catalog each
time, so the store reaches its steady-state size. Reported: series and samples held, bytes (the store's own count
and tracemalloc's), the budget formula, and CPU per evaluation over 200 more evaluations (without tracemalloc).

    python benchmarks/rule_store_memory.py [--gpus 8] [--interval 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_sweep import fake_nvml


def hook_families(step: int, ranks: int, routes: int) -> list:
    from outrider.metrics.catalog import definitions
    from outrider.metrics.family import Family, HistogramValue

    bounds = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
    out = []
    for d in definitions("hook"):
        names = d.label_names
        if "pid" in names or d.name.startswith("outrider_hook_"):
            continue
        fam = Family(d)
        keys = [("route", f"/v1/route{i}") for i in range(routes)] if "route" in names else [
            ("rank", str(r)) for r in range(ranks)]
        for key, value in keys:
            labels = []
            for n in names:
                labels.append({"rank": value if key == "rank" else "0", "route": value if key == "route" else "",
                               "device": "0", "kind": "reserved", "status_class": "2xx", "name": "ttft",
                               "phase": "queue"}.get(n, "x"))
            if d.type == "histogram":
                counts = tuple(step * (i + 1) for i in range(len(bounds) + 1))
                fam.add(HistogramValue(bounds, counts, 0.1 * step), *labels)
            else:
                fam.add(float(step * 10 if d.type == "counter" else 1e9 + step), *labels)
        out.append(fam)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval", type=float, default=15.0, help="rule interval, seconds")
    ap.add_argument("--routes", type=int, default=4)
    args = ap.parse_args()
    lib = fake_nvml(args.gpus)

    from outrider.ground.config import Config
    from outrider.rules.engine import RuleEngine
    from outrider.wiring.alerting import rule_groups
    from outrider.wiring.sampler import Sampler

    config = Config(nvml_library=lib, collectors=("host", "process", "gpu", "self"), rule_interval_s=args.interval)
    sampler = Sampler(config)
    sampler.sweep()
    node = sampler.sweep()
    sampler.stop()
    clock = [1_700_000_000_000]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    engine = RuleEngine(rule_groups(config), args.interval, clock=lambda: clock[0])
    retention = max(engine.retention_ms.values())
    steps = int((retention + 15 * 60_000) / (args.interval * 1000))
    for step in range(steps):
        clock[0] += int(args.interval * 1000)
        engine.on_sweep(node + hook_families(step, args.gpus, args.routes))
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    # CPU at steady state, measured without tracemalloc: tracing every allocation would multiply it
    eval_cpu = []
    for step in range(steps, steps + 200):
        clock[0] += int(args.interval * 1000)
        fams = node + hook_families(step, args.gpus, args.routes)
        t0 = time.process_time()
        engine.on_sweep(fams)
        eval_cpu.append(time.process_time() - t0)
    store = engine.store
    node_series = sum(len(f.samples) for f in node)
    by_window: dict[int, int] = {}
    for name in store.names():
        by_window[engine.retention_ms[name]] = by_window.get(engine.retention_ms[name], 0) + sum(
            1 for _ in store.candidates(name))
    budget = sum(n * (w / (args.interval * 1000) + 1) * 16 for w, n in by_window.items())
    print(f"default catalog ({sum(len(g.rules) for g in engine.groups)} rules), {args.gpus} GPUs, {args.gpus} "
          f"training ranks, {args.routes} routes; {node_series} node samples per sweep; {steps} evaluations "
          f"({steps * args.interval / 3600:.2f} h simulated at {args.interval:g} s)")
    print(f"store: {store.series_count()} series, {store.sample_count()} samples, "
          f"{store.memory_bytes() / 2**20:.2f} MiB by its own count; whole engine {traced / 2**20:.2f} MiB "
          f"(tracemalloc); budget formula sum(series x (window / interval + 1) x 16 B) = "
          f"{budget / 2**20:.2f} MiB of samples")
    for w, n in sorted(by_window.items(), reverse=True):
        print(f"  window {w / 60_000:7.1f} min: {n:4d} series")
    cpu = sorted(eval_cpu[-200:])
    print(f"CPU per ingest + evaluation at steady state: median {statistics.median(cpu) * 1000:.1f} ms, "
          f"p99 {cpu[int(len(cpu) * 0.99) - 1] * 1000:.1f} ms (once per {args.interval:g} s: "
          f"{statistics.mean(cpu) / args.interval * 100:.2f}% of one core)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
