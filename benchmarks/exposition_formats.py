"""What the protobuf exposition (native histograms) costs to render against the text format, for the agent's
10,000-series load (tests/load: a workload's 200 counters x 50 label sets through the hook, with rank and job),
plus recorded distributions (request latencies as sketches, as the hook records them) and their size.

Not a test: it prints figures, as ratios within one run. Three renders per format, each the best of --repeat:
  cold   a fresh renderer and empty label caches (the first scrape after start)
  moved  every value changed since the last sweep (counters that all moved: no family kept), label caches warm
  kept   nothing changed (every family's rendering kept)
and the page's size, plain and gzipped (zlib level 1, as the agent compresses it).

    python benchmarks/exposition_formats.py
    python benchmarks/exposition_formats.py --histograms 500 --repeat 20 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import sys
import time
import zlib
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "agent"))

from benchmarks.common import save_json
from outrider.metrics import exposition, protobuf_exposition
from outrider.metrics.catalog import CUSTOM_HELP, custom_definition
from outrider.metrics.exposition import KeepingRenderer, Renderer
from outrider.metrics.family import Family, HistogramValue
from outrider.metrics.protobuf_exposition import ProtobufRenderer
from outrider.shared.sketch import Sketch

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def sweep(step: int, histograms: int) -> list[Family]:
    """The load's families at sweep `step` (every counter moved by step)."""
    fams = []
    for p in range(20):
        for m in range(10):
            defn = custom_definition(f"load_p{p}_{m}_total", "counter", ("shard", "rank", "training_job"), "hook",
                                     CUSTOM_HELP)
            fam = Family(defn)
            for i in range(50):
                fam.add(float(i + 1 + step), str(i), "0", "llama-pretrain")
            fams.append(fam)
    if histograms:
        rng = random.Random(step)
        latency = Family("outrider_request_duration_seconds")
        for n in range(histograms):
            values = [rng.lognormvariate(math.log(0.05), 1.0) for _ in range(200)]
            counts = [0] * (len(BOUNDS) + 1)
            for v in values:
                counts[bisect_left(BOUNDS, v)] += 1
            latency.add(HistogramValue(BOUNDS, tuple(counts), sum(values), Sketch.of_values(values)),
                        f"/route{n}", "POST", "http", "200", "2xx", "0", "serve")
        fams.append(latency)
    return fams


def best(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(make: Callable[[], KeepingRenderer[str] | KeepingRenderer[bytes]], sweeps: list[list[Family]],
            repeat: int) -> dict[str, float]:
    def cold() -> None:
        exposition._PREFIXES.clear()
        protobuf_exposition._PREFIXES.clear()
        make().render(sweeps[0])

    renderer = make()
    renderer.render(sweeps[0])
    turn = [0]

    def moved() -> None:
        turn[0] += 1
        renderer.render(sweeps[turn[0] % len(sweeps)])

    page = make().render(sweeps[0])
    kept_renderer = make()
    kept_renderer.render(sweeps[0])
    return {"cold_ms": 1000 * best(repeat, cold), "moved_ms": 1000 * best(repeat, moved),
            "kept_ms": 1000 * best(repeat, lambda: kept_renderer.render(sweeps[0])),
            "bytes": len(page), "gzip_bytes": len(zlib.compress(page, 1, 31))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--histograms", type=int, default=100, help="sketched request-latency series beside the load")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    figures = {}
    for label, histograms in (("10,000 counters", 0), (f"10,000 counters + {args.histograms} sketched histograms",
                                                       args.histograms)):
        sweeps = [sweep(step, histograms) for step in range(3)]
        series = sum(len(f.samples) for f in sweeps[0])
        text = measure(lambda: Renderer(openmetrics=False), sweeps, args.repeat)
        proto = measure(ProtobufRenderer, sweeps, args.repeat)
        figures[label] = {"series": series, "text": text, "protobuf": proto}
        print(f"{label} ({series} series)")
        for key, what in (("cold_ms", "render, cold"), ("moved_ms", "render, every value moved"),
                          ("kept_ms", "render, nothing changed"), ("bytes", "page bytes"),
                          ("gzip_bytes", "page bytes gzipped")):
            unit = " ms" if key.endswith("_ms") else ""
            print(f"  {what:28} text {text[key]:10.2f}{unit}  protobuf {proto[key]:10.2f}{unit}  "
                  f"protobuf/text {proto[key] / text[key]:.2f}")
    save_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
