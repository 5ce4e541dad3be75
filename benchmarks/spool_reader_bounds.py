"""What the reader's bounds cost a sweep: the hook collector over N real shards, (a) with every shard's descriptor
kept (the reader before its bound) against 256 kept (what a soft limit of 1,024 allows: the rest opened and closed
each sweep) and the default here (a quarter of the soft limit, at most 1,024), and (b) with thousands of planted
files beside them against none (refused files are not opened again while unchanged).

Not a test: it prints figures, as ratios within one run. Shards are written with the real writer (sparse files in
a temporary directory), their heartbeats fresh, so every process reads as running.

    python benchmarks/spool_reader_bounds.py                 # 1,100 shards, 2,450 planted files, 20 sweeps
    python benchmarks/spool_reader_bounds.py --shards 300 --sweeps 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "agent"))

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.ground.config import Config
from outrider.shared import spool


def write_shards(directory: Path, n: int) -> list[spool.ShardWriter]:
    writers = []
    body = json.dumps({"meta": {"rank": "0"}, "series": [
        ["outrider_train_steps_total", "counter", {}, 0, []],
        ["outrider_train_step_duration_seconds", "histogram", {}, 1, [0.01, 0.1, 1.0]],
    ]}).encode()
    now = time.time_ns()
    for i in range(n):
        w = spool.ShardWriter(str(directory), os.getpid(), now + i)
        w.write(body, [10.0, 1.0, 2.0, 3.0, 4.0, 0.5], flags=0, pid=os.getpid(), stalls=0, start_ns=now + i,
                heartbeat_ns=now, last_step_ns=now, steps=10, stalled_since_ns=0)
        w.close()
        writers.append(w)
    return writers


def plant(directory: Path, n: int) -> None:
    for i in range(n):
        path = directory / f"outrider-{10_000_000 + i}-{i}.shard"
        kind = i % 4
        if kind == 0:
            path.write_bytes(os.urandom(4096))
        elif kind == 1:
            path.symlink_to("/etc/hostname")
        elif kind == 2:
            os.mkfifo(path)
        else:
            path.write_bytes(spool.MAGIC)


def collector(directory: Path, max_open: int | None) -> HookCollector:
    # A flush interval of an hour: the shards' heartbeats never go stale while this runs.
    c = HookCollector(CollectorContext(Config(spool_dir=str(directory), flush_interval_s=3600.0),
                                       hold_spool_lock=False))
    if max_open is not None:
        c.reader.close()
        c.reader = spool.ShardReader(c.spool, c._trusted, max_open=max_open)
    c.collect()  # the first sweep parses every directory and refuses every planted file once
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=1100)
    ap.add_argument("--planted", type=int, default=2450)
    ap.add_argument("--sweeps", type=int, default=20)
    args = ap.parse_args()
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.shards + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, need), hard))
    with tempfile.TemporaryDirectory(prefix="outrider-reader-bench-") as tmp:
        clean, junk = Path(tmp) / "clean", Path(tmp) / "junk"
        clean.mkdir()
        junk.mkdir()
        write_shards(clean, args.shards)
        write_shards(junk, args.shards)
        plant(junk, args.planted)
        cases = {"all": collector(clean, args.shards + 1), "256": collector(clean, 256),
                 "default": collector(clean, None), "junk": collector(junk, None)}
        times: dict[str, list[float]] = {k: [] for k in cases}
        order = list(cases)
        for i in range(args.sweeps):  # round by round, the order rotated: the machine's load falls on all alike
            for k in order[i % len(order):] + order[:i % len(order)]:
                t0 = time.perf_counter()
                cases[k].collect()
                times[k].append(time.perf_counter() - t0)
        ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
        kept = {k: c.reader.open_count for k, c in cases.items()}
        for c in cases.values():
            c.close()
    print(f"{args.shards} shards, median of {args.sweeps} sweeps (the hook collector's collect()), rounds alternated:")
    print(f"  every descriptor kept ({kept['all']} open): {ms['all']:.1f} ms")
    print(f"  256 kept (a soft limit of 1,024; {args.shards - kept['256']} opened each sweep): {ms['256']:.1f} ms "
          f"-> ratio {ms['256'] / ms['all']:.2f}")
    print(f"  the default here ({kept['default']} kept, {args.shards - kept['default']} opened each sweep): "
          f"{ms['default']:.1f} ms -> ratio {ms['default'] / ms['all']:.2f}")
    print(f"  the same + {args.planted} planted files ({kept['junk']} open): {ms['junk']:.1f} ms -> ratio "
          f"{ms['junk'] / ms['default']:.2f} against none")


if __name__ == "__main__":
    main()
