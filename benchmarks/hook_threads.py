"""A thread-per-request service under the hook: 1 M requests, each on its own short thread (as socketserver's
ThreadingMixIn or werkzeug's threaded server run them), or on its own greenlet with --gevent.

Each request records its duration and count (outrider.record_request: 20 routes x 2 status codes, 80 series).
The hook flushes once a second, as its publisher does (here on the driving thread, so that every flush is timed
and the interval is the same under gevent). Reported: the process's RSS over the run after a warm-up (the first
10 % of requests; flat means within 16 MiB), each flush's duration (max, p99, median; and in CPU time of the
flushing thread, which leaves out the time this shared machine's other jobs take), the thread cells the hook holds
at the end, and whether every request was counted once.

Not a test: it prints figures (and writes them as JSON with --json).

    python benchmarks/hook_threads.py [--requests 1000000] [--concurrency 16] [--gevent] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")
ROUTES = 20


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[1]) * PAGE


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--concurrency", type=int, default=16, help="threads (greenlets) alive at once")
    ap.add_argument("--gevent", action="store_true", help="greenlets (gevent, monkey-patched) instead of threads")
    ap.add_argument("--quick", action="store_true", help="50,000 requests: checks that it runs")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.quick:
        args.requests = 50_000
    if args.gevent:
        from gevent import monkey

        monkey.patch_all()  # before outrider is imported: its threading.local is then gevent's, per greenlet
    os.environ.setdefault("OUTRIDER_SPOOL_DIR", tempfile.mkdtemp(prefix="outrider-bench-"))
    os.environ["OUTRIDER_STANDALONE"] = "false"
    os.environ["OUTRIDER_FLUSH_INTERVAL_S"] = "3600"  # the publisher thread idles; flushes are driven (and timed) here
    figures = run(args)
    print(f"{figures['requests']:,} requests on {figures['requests']:,} short "
          f"{'greenlets' if args.gevent else 'threads'} ({args.concurrency} at once), "
          f"{figures['requests_per_s']:,.0f} a second")
    print(f"RSS after warm-up: {figures['rss_warm_mib']:.1f} MiB, at most {figures['rss_max_mib']:.1f} MiB: "
          f"grew {figures['rss_growth_mib']:.1f} MiB (flat: within 16 MiB)")
    print(f"flush: max {figures['flush_max_ms']:.2f} ms, p99 {figures['flush_p99_ms']:.2f} ms, median "
          f"{figures['flush_median_ms']:.2f} ms over {figures['flushes']} flushes (target: at most 5 ms); in CPU "
          f"time of the flushing thread max {figures['flush_cpu_max_ms']:.2f} ms, median "
          f"{figures['flush_cpu_median_ms']:.2f} ms")
    print(f"thread cells held at the end: {figures['cells_held']}; every request counted once: "
          f"{figures['exact']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)
    return 0 if figures["exact"] else 1


def run(args: argparse.Namespace) -> dict[str, Any]:
    import outrider
    from outrider.hook import api

    outrider.instrument()
    hook = api.S.hook
    n, conc = args.requests, args.concurrency

    def request(i: int) -> None:
        outrider.record_request(0.001 * (i % 50), route=f"/api/r{i % ROUTES}", status=500 if i % 10 == 0 else 200,
                                method="GET")

    if args.gevent:
        import gevent

        def start(i: int) -> Any:
            return gevent.spawn(request, i)
    else:
        import threading

        def start(i: int) -> Any:
            t = threading.Thread(target=request, args=(i,))
            t.start()
            return t

    warm = n // 10
    flushes: list[float] = []
    flush_cpu: list[float] = []  # the flushing thread's CPU time: what the flush itself costs, neighbours aside
    rss: list[int] = []
    alive: list[Any] = []
    t0 = time.perf_counter()
    next_flush = t0 + 1.0
    for i in range(n):
        alive.append(start(i))
        if len(alive) >= conc:
            for t in alive:
                t.join()
            alive.clear()
        now = time.perf_counter()
        if now >= next_flush:
            f0, c0 = time.perf_counter(), time.thread_time()
            hook.flush()
            f1, c1 = time.perf_counter(), time.thread_time()
            next_flush = f1 + 1.0
            if i >= warm:
                flushes.append(f1 - f0)
                flush_cpu.append(c1 - c0)
                rss.append(rss_bytes())
    for t in alive:
        t.join()
    elapsed = time.perf_counter() - t0
    hook.flush()
    if not rss:
        rss.append(rss_bytes())
    counted = 0.0
    held = 0
    for key, s in list(hook.registry._series.items()):
        held += s.cell_lists()
        if key[0] == "outrider_requests_total":
            counted += s.total()[0]
    ms = sorted(f * 1000 for f in flushes) or [0.0]
    cpu_ms = sorted(f * 1000 for f in flush_cpu) or [0.0]
    mib = 1024 * 1024
    return {"requests": n, "concurrency": conc, "gevent": bool(args.gevent), "seconds": elapsed,
            "requests_per_s": n / elapsed, "rss_warm_mib": rss[0] / mib, "rss_max_mib": max(rss) / mib,
            "rss_growth_mib": (max(rss) - rss[0]) / mib, "flushes": len(flushes), "flush_max_ms": ms[-1],
            "flush_p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))], "flush_median_ms": statistics.median(ms),
            "flush_cpu_max_ms": cpu_ms[-1], "flush_cpu_median_ms": statistics.median(cpu_ms),
            "cells_held": held, "counted": counted, "exact": counted == n, "python": sys.version.split()[0]}


if __name__ == "__main__":
    raise SystemExit(main())
