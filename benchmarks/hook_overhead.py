"""The hook's cost, side by side in one run with prometheus_client and the OpenTelemetry SDK.

1. observe() in a hot loop: Outrider's histogram, prometheus_client Histogram.observe, OpenTelemetry SDK
   Histogram.record (without and with attributes).
2. Two threads recording into one histogram at once: lost updates and throughput against one thread.
3. The per-step cost of all of Outrider's instrumentation inside a real CPU PyTorch training loop, timed in the
   loop around each instrumentation call (end-to-end step-time differences are inside this machine's noise).

Not a test: it prints figures (and writes them as JSON with --json).

    python benchmarks/hook_overhead.py [--n 1000000] [--steps 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OUTRIDER_SPOOL_DIR", tempfile.mkdtemp(prefix="outrider-bench-"))
os.environ.setdefault("OUTRIDER_STANDALONE", "false")

import outrider  # after the spool is chosen

VALUE = 0.0123


def per_call_ns(fn: Callable[[float], Any], n: int, repeats: int = 5) -> float:
    """Best of `repeats` runs of n calls, less the empty loop: the steady (hot) cost of one call."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter_ns()
        for _ in range(n):
            fn(VALUE)
        best = min(best, time.perf_counter_ns() - t)
    empty = float("inf")
    for _ in range(repeats):
        t = time.perf_counter_ns()
        for _ in range(n):
            pass
        empty = min(empty, time.perf_counter_ns() - t)
    return (best - empty) / n


def two_threads(fn: Callable[[float], Any], n: int) -> tuple[float, float]:
    """(throughput of two threads over one thread, total calls made) for fn called n times per thread."""
    t = time.perf_counter()
    for _ in range(n):
        fn(VALUE)
    one = n / (time.perf_counter() - t)
    barrier = threading.Barrier(2)

    def work() -> None:
        barrier.wait()
        for _ in range(n):
            fn(VALUE)

    threads = [threading.Thread(target=work) for _ in range(2)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    both = 2 * n / (time.perf_counter() - t)
    return both / one, 2 * n


def otel_histograms() -> tuple[Any, Any, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("bench")
    return meter.create_histogram("otel_seconds"), meter.create_histogram("otel_attr_seconds"), reader


def otel_count(reader: Any, name: str) -> int:
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    return sum(p.count for p in m.data.data_points)
    return 0


def torch_loop(steps: int) -> dict[str, float]:
    """A real CPU training loop; each instrumentation call is timed where it runs, in the loop.

    Two modes alternate step by step: explicit (`with outrider.step(...)`) and automatic (the optimizer post hook
    counts the step; here it is called by hand right after opt.step(), where torch would call it, so it can be
    timed). From each timing the cost of an empty timer pair at the same place in the loop is subtracted: right
    after a torch step even reading the clock is several times slower than in a hot loop.
    """
    import torch

    from outrider.hook import api
    from outrider.hook.torch_integration import TorchIntegration

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(steps)]
    integ = TorchIntegration(api.S.hook, api.S, torch)
    integ.handle.remove()  # called by hand below, at the place torch calls it
    timer = time.perf_counter_ns
    wrapper, explicit, auto, empty_after_step, step_ns = [], [], [], [], []
    loader = iter(outrider.dataloader(batches))

    def train(x: Any, y: Any) -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for i in range(steps):
        a = timer()
        x, y = next(loader)  # the wrapper's work: the list itself costs next to nothing
        b = timer()
        wrapper.append(b - a)
        mode = i % 3
        if mode == 0:  # explicit step timing
            s0 = timer()
            ctx = outrider.step(samples=64)
            ctx.__enter__()
            s1 = timer()
            train(x, y)
            s2 = timer()
            ctx.__exit__(None, None, None)
            s3 = timer()
            explicit.append((s1 - s0) + (s3 - s2))
            step_ns.append(s3 - s0)
        elif mode == 1:  # automatic: the optimizer post hook
            api.S.explicit = False
            train(x, y)
            h0 = timer()
            integ.on_optimizer_step(opt, (), {})
            h1 = timer()
            auto.append(h1 - h0)
            api.S.explicit = True
        else:  # the same place in the loop, nothing instrumented: what an empty timer pair costs there
            train(x, y)
            e0 = timer()
            e1 = timer()
            empty_after_step.append(e1 - e0)
    med = statistics.median
    empty = med(empty_after_step)
    w, e, h = med(wrapper) - empty, med(explicit) - 2 * empty, med(auto) - empty
    return {"step_ms_median": med(step_ns) / 1e6, "empty_timer_pair_ns": empty, "data_wait_wrapper_ns": w,
            "step_timer_ns": e, "optimizer_hook_ns": h, "per_step_explicit_ns": w + e, "per_step_auto_ns": w + h}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--json")
    args = ap.parse_args()
    import prometheus_client

    outrider.instrument()
    ours = outrider.histogram("bench_seconds")
    prom = prometheus_client.Histogram("bench_seconds", "bench", registry=prometheus_client.CollectorRegistry())
    otel, otel_attr, reader = otel_histograms()
    attrs = {"route": "/v1/chat", "status_class": "2xx"}

    hot = {
        "outrider": per_call_ns(ours.observe, args.n),
        "prometheus_client": per_call_ns(prom.observe, args.n // 5),
        "otel_sdk": per_call_ns(otel.record, args.n // 20),
        "otel_sdk_attributes": per_call_ns(lambda v: otel_attr.record(v, attrs), args.n // 20),
    }
    threads_n = args.n // 4
    before = sum(ours.total()[:-1])
    ratio_ours, made = two_threads(ours.observe, threads_n)
    lost_ours = (before + made + threads_n) - sum(ours.total()[:-1])  # + the single-thread warm-up run
    prom_before = prom._sum.get()
    ratio_prom, _ = two_threads(prom.observe, threads_n // 5)
    otel_before = otel_count(reader, "otel_seconds")
    ratio_otel, made_otel = two_threads(otel.record, threads_n // 20)
    lost_otel = (otel_before + made_otel + threads_n // 20) - otel_count(reader, "otel_seconds")
    del prom_before
    loop = torch_loop(args.steps)
    figures = {"observe_ns": hot,
               "speedup": {"vs_prometheus_client": hot["prometheus_client"] / hot["outrider"],
                           "vs_otel_sdk": hot["otel_sdk"] / hot["outrider"],
                           "vs_otel_sdk_attributes": hot["otel_sdk_attributes"] / hot["outrider"]},
               "two_threads_throughput_ratio": {"outrider": ratio_ours, "prometheus_client": ratio_prom,
                                                "otel_sdk": ratio_otel},
               "two_threads_lost_updates": {"outrider": lost_ours, "otel_sdk": lost_otel},
               "torch_loop": loop}
    print(f"{'observe, hot loop':40}{'ns/call':>10}{'outrider is':>14}")
    for name in ("outrider", "prometheus_client", "otel_sdk", "otel_sdk_attributes"):
        x = hot[name] / hot["outrider"]
        print(f"{name:40}{hot[name]:>10.0f}{'' if name == 'outrider' else f'{x:.1f}x faster':>14}")
    print(f"two threads at once, throughput vs one thread: outrider {ratio_ours:.2f}, prometheus_client "
          f"{ratio_prom:.2f}, otel_sdk {ratio_otel:.2f}; lost updates: outrider {lost_ours:.0f}, "
          f"otel_sdk {lost_otel:.0f}")
    print(f"real CPU torch loop ({args.steps} steps, median step {loop['step_ms_median']:.2f} ms), in-loop medians "
          f"less an empty timer pair there ({loop['empty_timer_pair_ns']:.0f} ns): data-wait wrapper "
          f"{loop['data_wait_wrapper_ns']:.0f} ns, step timer {loop['step_timer_ns']:.0f} ns, optimizer-hook path "
          f"{loop['optimizer_hook_ns']:.0f} ns")
    print(f"all per-step instrumentation: {loop['per_step_explicit_ns'] / 1000:.2f} us with outrider.step(), "
          f"{loop['per_step_auto_ns'] / 1000:.2f} us counted by the optimizer hook")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
