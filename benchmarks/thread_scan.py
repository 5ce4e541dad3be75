"""The per-flush thread accounting (hook/threads.py) of a process with many threads: CPU time of the flushing
thread per read, now and as it was (the module at a git revision, --baseline), taking turns read by read.

Two workloads at each thread count: idle threads (blocked, as a thread-per-request server's pool between
requests), and busy ones (every thread runs between two reads, so every thread is due a look). After the run it
checks that nothing was lost: at a read that lists the tasks, the roles' CPU adds up to the process's CPU clock.

Not a test: it prints figures (and writes them as JSON with --json).

    python benchmarks/thread_scan.py [--threads 500 2000] [--reads 20] [--baseline 70e45bd] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "agent"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import save_json
from outrider.hook import threads as current
from outrider.hook.runtime import Hook
from outrider.hook.settings import HookSettings

ROOT = Path(__file__).resolve().parent.parent


def baseline_module(rev: str) -> types.ModuleType | None:
    """hook/threads.py as it was at rev, loaded as a module of its own; None outside a git checkout."""
    try:
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:agent/outrider/hook/threads.py"],
                                check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = types.ModuleType(f"threads_at_{rev}")
    exec(compile(source, f"{rev}:threads.py", "exec"), module.__dict__)
    return module


class Pool:
    """n threads blocked on a condition; `run()` wakes them all to do a little work, and waits until they have."""

    def __init__(self, n: int) -> None:
        self.cond = threading.Condition()
        self.generation = 0
        self.done = 0
        self.stop = False
        self.threads = [threading.Thread(target=self._work, name=f"worker-{i}", daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _work(self) -> None:
        seen = 0
        while True:
            with self.cond:
                while self.generation == seen and not self.stop:
                    self.cond.wait()
                if self.stop:
                    return
                seen = self.generation
            sum(range(200))  # a request's worth of work
            with self.cond:
                self.done += 1
                self.cond.notify_all()

    def run(self) -> None:
        with self.cond:
            self.done = 0
            self.generation += 1
            self.cond.notify_all()
            while self.done < len(self.threads):
                self.cond.wait()

    def close(self) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        for t in self.threads:
            t.join()


def cpu_ms(sampler: Any) -> float:
    t = time.thread_time_ns()
    sampler.read()
    return (time.thread_time_ns() - t) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[500, 2000])
    ap.add_argument("--reads", type=int, default=20, help="reads per variant and workload")
    ap.add_argument("--baseline", default="70e45bd", help="git revision of the accounting to compare with")
    ap.add_argument("--json")
    args = ap.parse_args()
    old = baseline_module(args.baseline)
    hook = Hook(HookSettings(spool_dir=tempfile.mkdtemp(prefix="outrider-bench-"), standalone=False))
    main_tid = threading.get_native_id()
    figures: dict[str, Any] = {"baseline": args.baseline if old else None, "looks_per_flush": current.LOOKS_PER_FLUSH}
    print(f"CPU ms of the flushing thread per read, median of {args.reads} (IQR); baseline {args.baseline}"
          if old else "CPU ms per read (no git checkout: no baseline)")
    for n in args.threads:
        pool = Pool(n)
        try:
            samplers = {"now": current.ThreadCpuAccounting(hook, lambda: main_tid)}
            if old is not None:
                samplers["baseline"] = old.ThreadCpuAccounting(hook, lambda: main_tid)
            for s in samplers.values():
                s.read()  # first read: every thread is new
            for workload in ("idle", "busy"):
                seen: dict[str, list[float]] = {name: [] for name in samplers}
                for _ in range(args.reads):
                    for name, s in samplers.items():  # both read the same threads, in turn
                        if workload == "busy":
                            pool.run()
                        seen[name].append(cpu_ms(s))
                row = {}
                for name, values in seen.items():
                    q = statistics.quantiles(values, n=4)
                    row[name] = {"median_ms": statistics.median(values), "q1_ms": q[0], "q3_ms": q[2]}
                figures[f"{n}_{workload}"] = row
                text = "  ".join(f"{name} {v['median_ms']:.2f} ({v['q1_ms']:.2f}-{v['q3_ms']:.2f})"
                                 for name, v in row.items())
                ratio = (f"  ratio {row['now']['median_ms'] / row['baseline']['median_ms']:.3f}"
                         if "baseline" in row else "")
                print(f"{n:>5} threads, {workload}: {text}{ratio}")
            s = samplers["now"]
            while True:  # to a read that lists the tasks: where the ended threads' CPU is given out
                before = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
                s.read()
                after = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
                if s._listed == s.flushes:
                    break
            total = sum(v for role, v in s.cpu.items() if role != "data_workers")
            figures[f"{n}_adds_up"] = {"process_cpu_s_before_read": before, "roles_cpu_s": total,
                                       "process_cpu_s_after_read": after}
            print(f"{n:>5} threads: the roles' CPU {total:.4f} s, the process's CPU clock {before:.4f} s before "
                  f"the read and {after:.4f} s after it")
        finally:
            pool.close()
    save_json(args.json, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
