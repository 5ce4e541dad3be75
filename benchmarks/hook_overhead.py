"""The hook's cost, side by side in one run with prometheus_client and the OpenTelemetry SDK.

1. observe() in a hot loop: Outrider's histogram, prometheus_client Histogram.observe, OpenTelemetry SDK
   Histogram.record (without and with attributes), in CPU time of the measuring thread, best of interleaved rounds.
2. Two threads recording into one histogram at once: lost updates and throughput against one thread.
3. (The per-step cost inside a real CPU PyTorch training loop is benchmarks/step_cpu.py's, in thread CPU time.)
4. Data wait with zero configuration: the patched DataLoader iterator's __next__ (instrument() alone) against the
   explicit outrider.dataloader() wrapper, per batch: in a hot loop over a trivial iterator (the instrumentation
   alone), and on a real single-process DataLoader, both less the same loop uninstrumented, interleaved.
5. The rest of zero configuration: the step path and its operation counter read (once a flush), a blocking
   collective through the timing wrapper (gloo, one rank), and the per-thread CPU read (once a flush, off the
   hot path) as a share of one core at the default 1 s flush.

Not a test: it prints figures (and writes them as JSON with --json).

    python benchmarks/hook_overhead.py [--n 1000000] [--hog] [--json out.json]

With --hog a second process keeps a core busy for the whole run (a neighbour sharing the machine, as on a node
where the data loader's workers or another job run beside the trainer).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OUTRIDER_SPOOL_DIR", tempfile.mkdtemp(prefix="outrider-bench-"))
os.environ.setdefault("OUTRIDER_STANDALONE", "false")

import outrider  # after the spool is chosen

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import beside_hog, save_json, with_hog_and_json

VALUE = 0.0123


def per_call_ns(fn: Callable[[float], Any], n: int) -> float:
    """n calls' CPU time of this thread less the empty loop's, per call: the steady (hot) cost of one call. CPU time
    of the measuring thread, not wall time: on a shared machine, time the neighbours take is not the call's."""
    t = time.thread_time_ns()
    for _ in range(n):
        fn(VALUE)
    mid = time.thread_time_ns()
    for _ in range(n):
        pass
    return ((mid - t) - (time.thread_time_ns() - mid)) / n


def per_call_spread_ns(fn: Callable[[float], Any], values: list[float]) -> float:
    """per_call_ns over varied values (a log-normal spread of latencies, as a service's are), the same loop over the
    values less: the cost where the histogram's buckets (and the sketch's) change from one value to the next."""
    t = time.thread_time_ns()
    for v in values:
        fn(v)
    mid = time.thread_time_ns()
    for _ in values:
        pass
    return ((mid - t) - (time.thread_time_ns() - mid)) / len(values)


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


def interleaved(variants: dict[str, Callable[[], float]], rounds: int = 15) -> dict[str, float]:
    """Best over rounds of each variant's ns per item (the steady cost, as per_call_ns), the variants taking turns
    so that a busy spell of the machine hits all of them alike."""
    seen: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            seen[name].append(fn())
    return {name: min(v) for name, v in seen.items()}


def data_wait(n: int) -> dict[str, float]:
    """ns per batch added by the automatic path (patched __next__) and by the explicit wrapper."""
    import torch

    from outrider.hook import api
    from outrider.hook.torch_data import DataLoaderTimer

    class Trivial:  # the iterator protocol and nothing else: what the instrumentation alone costs
        def __init__(self) -> None:
            self.i = 0

        def __next__(self) -> int:
            self.i += 1
            return self.i

    trivial_module = type("M", (), {"_BaseDataLoaderIter": Trivial, "_MultiProcessingDataLoaderIter":
                                    type("Multi", (), {"__init__": lambda self: None}),
                                    "BatchSampler": type("BatchSampler", (), {})})
    patch = DataLoaderTimer(api.S.waits, trivial_module)
    timed_next = Trivial.__next__
    patch.detach()  # Trivial keeps its own __next__; timed_next is the patched one, around it

    class Patched(Trivial):
        __next__ = timed_next

    def per_item(fn: Callable[[], Any], k: int) -> float:
        # this thread's CPU time, not wall time: on a shared machine, time the neighbours take is not ours
        t = time.thread_time_ns()
        for _ in range(k):
            fn()
        return (time.thread_time_ns() - t) / k

    # each as a `for` loop would call it: the iterator's bound __next__ (the wrapper's is its generator's)
    hot = interleaved({"plain": lambda: per_item(Trivial().__next__, n),
                       "automatic": lambda: per_item(Patched().__next__, n),
                       "wrapper": lambda: per_item(iter(outrider.dataloader(_Endless())).__next__, n)})
    loader = torch.utils.data.DataLoader(range(10**9), batch_size=None)
    dl_module = torch.utils.data.dataloader
    if api.S.torch is not None and api.S.torch.data is not None:
        api.S.torch.data.detach()  # instrument()'s own: each mode below patches (or not) for itself
    real_n = max(2000, n // 50)

    def real(mode: str) -> float:
        timer = DataLoaderTimer(api.S.waits, dl_module) if mode == "automatic" else None
        try:
            it = iter(outrider.dataloader(loader) if mode == "wrapper" else loader)
            next(it)
            return per_item(it.__next__, real_n)
        finally:
            if timer is not None:
                timer.detach()

    on_loader = interleaved({m: (lambda m=m: real(m)) for m in ("plain", "automatic", "wrapper")}, rounds=25)
    return {"hot_automatic_ns": hot["automatic"] - hot["plain"],
            "hot_wrapper_ns": hot["wrapper"] - hot["plain"],
            "dataloader_plain_ns": on_loader["plain"],
            "dataloader_automatic_ns": on_loader["automatic"] - on_loader["plain"],
            "dataloader_wrapper_ns": on_loader["wrapper"] - on_loader["plain"]}


class _Endless:
    def __iter__(self) -> _Endless:
        return self

    def __next__(self) -> int:
        return 1


def rest_of_zero_config(n: int) -> dict[str, float]:
    """The step path with and without the operation counter; a blocking collective through the wrapper; the
    per-thread CPU read."""
    import torch
    import torch.distributed as dist

    from outrider.hook import api
    from outrider.hook.threads import ThreadCpuAccounting
    from outrider.hook.torch_distributed import CollectiveTimer

    seq = torch._C._autograd._get_sequence_nr
    listeners, api.S.steps.listeners[:] = list(api.S.steps.listeners), []

    def step_path(ask: bool) -> float:
        """ns per step end; ask: every one reads the operation counter (as the first after a flush does)."""
        t = time.thread_time_ns()
        for _ in range(n):
            api.S.steps.want_ops = ask
            api._step_done()
        return (time.thread_time_ns() - t) / n

    api.S.steps.ops_reader = seq
    steps = interleaved({"bare": lambda: step_path(False), "ops": lambda: step_path(True)}, rounds=7)
    api.S.steps.listeners[:] = listeners
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        t1 = torch.ones(1)
        original = dist.all_reduce
        timer = CollectiveTimer(api.S.loop, torch, api.S.hook.drop)
        timed = dist.all_reduce
        timer.detach()
        k = max(500, n // 200)

        def calls(fn: Callable[..., Any]) -> float:
            t = time.thread_time_ns()
            for _ in range(k):
                fn(t1)
            return (time.thread_time_ns() - t) / k

        coll = interleaved({"plain": lambda: calls(original), "timed": lambda: calls(timed)}, rounds=9)
        api.S.loop.collectives.clear()
    finally:
        dist.destroy_process_group()
    api.S.hook.progress.steps = max(api.S.hook.progress.steps, 1)
    sampler = ThreadCpuAccounting(api.S.hook, lambda: 0)
    reads = []
    for _ in range(50):
        t = time.perf_counter_ns()
        sampler.sample()
        reads.append(time.perf_counter_ns() - t)
    read_us = statistics.median(reads) / 1000
    return {"step_path_ns": steps["bare"], "ops_counter_ns": steps["ops"] - steps["bare"],
            "collective_plain_us": coll["plain"] / 1000, "collective_wrapper_ns": coll["timed"] - coll["plain"],
            "thread_read_us": read_us, "thread_read_core_share": read_us / 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    args = with_hog_and_json(ap).parse_args()
    return beside_hog(args.hog, lambda: run(args))


def run(args: argparse.Namespace) -> int:
    import prometheus_client

    outrider.instrument()
    ours = outrider.histogram("bench_seconds")
    prom = prometheus_client.Histogram("bench_seconds", "bench", registry=prometheus_client.CollectorRegistry())
    otel, otel_attr, reader = otel_histograms()
    attrs = {"route": "/v1/chat", "status_class": "2xx"}

    import random

    rng = random.Random(7)
    spread = [rng.lognormvariate(-4.0, 1.0) for _ in range(args.n // 10)]  # median 18 ms, p99 ~190 ms
    # best of interleaved rounds, so that a busy spell of the machine hits all four alike
    varied = interleaved({
        "outrider": lambda: per_call_spread_ns(ours.observe, spread),
        "prometheus_client": lambda: per_call_spread_ns(prom.observe, spread[: args.n // 50]),
        "otel_sdk": lambda: per_call_spread_ns(otel.record, spread[: args.n // 200]),
    }, rounds=7)
    hot = interleaved({
        "outrider": lambda: per_call_ns(ours.observe, args.n // 10),
        "prometheus_client": lambda: per_call_ns(prom.observe, args.n // 50),
        "otel_sdk": lambda: per_call_ns(otel.record, args.n // 200),
        "otel_sdk_attributes": lambda: per_call_ns(lambda v: otel_attr.record(v, attrs), args.n // 200),
    }, rounds=11)
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
    waits = data_wait(args.n // 4)
    rest = rest_of_zero_config(args.n // 4)
    figures = {"cpu_hog_beside": bool(args.hog), "observe_ns": hot, "observe_varied_ns": varied,
               "speedup": {"vs_prometheus_client": hot["prometheus_client"] / hot["outrider"],
                           "vs_otel_sdk": hot["otel_sdk"] / hot["outrider"],
                           "vs_otel_sdk_attributes": hot["otel_sdk_attributes"] / hot["outrider"]},
               "two_threads_throughput_ratio": {"outrider": ratio_ours, "prometheus_client": ratio_prom,
                                                "otel_sdk": ratio_otel},
               "two_threads_lost_updates": {"outrider": lost_ours, "otel_sdk": lost_otel},
               "data_wait": waits, "zero_config": rest}
    if args.hog:
        print("with another process keeping a core busy beside it")
    print(f"{'observe, hot loop':40}{'ns/call':>10}{'outrider is':>14}")
    for name in ("outrider", "prometheus_client", "otel_sdk", "otel_sdk_attributes"):
        x = hot[name] / hot["outrider"]
        print(f"{name:40}{hot[name]:>10.0f}{'' if name == 'outrider' else f'{x:.1f}x faster':>14}")
    print(f"{'observe, hot loop, varied values':40}{'ns/call':>10}")
    for name in ("outrider", "prometheus_client", "otel_sdk"):
        x = varied[name] / varied["outrider"]
        print(f"{name:40}{varied[name]:>10.0f}{'' if name == 'outrider' else f'{x:.1f}x faster':>14}")
    print(f"two threads at once, throughput vs one thread: outrider {ratio_ours:.2f}, prometheus_client "
          f"{ratio_prom:.2f}, otel_sdk {ratio_otel:.2f}; lost updates: outrider {lost_ours:.0f}, "
          f"otel_sdk {lost_otel:.0f}")
    print(f"data wait per batch, zero configuration (patched DataLoader __next__) vs the explicit wrapper: hot loop "
          f"{waits['hot_automatic_ns']:.0f} ns vs {waits['hot_wrapper_ns']:.0f} ns; on a real single-process "
          f"DataLoader ({waits['dataloader_plain_ns'] / 1000:.1f} us a batch uninstrumented) "
          f"+{waits['dataloader_automatic_ns']:.0f} ns vs +{waits['dataloader_wrapper_ns']:.0f} ns")
    print(f"step path {rest['step_path_ns']:.0f} ns, + an operation counter read (once a flush) "
          f"{rest['ops_counter_ns']:.0f} ns; blocking "
          f"collective (gloo, 1 rank, {rest['collective_plain_us']:.1f} us) + {rest['collective_wrapper_ns']:.0f} ns "
          f"timed; per-thread CPU read {rest['thread_read_us']:.0f} us a flush "
          f"({rest['thread_read_core_share']:.3%} of a core at 1 s)")
    save_json(args.json, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
