"""`outrider demo`: a bundled synthetic workload run under `outrider run` on the embedded defaults, with a live
line of what the agent sees and the end-of-run summary. Needs nothing but Outrider itself."""

from __future__ import annotations

import sys
import tempfile
import time

from outrider.config import Config
from outrider.metrics.family import Family


def _values(fams: list[Family]) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(f.defn.name, labels): value for f in fams for labels, value in f.samples if isinstance(value, float)}


class LiveLine:
    """Turns consecutive sweeps into one line of rates: what a person watching the job wants to see."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self._prev: tuple[float, dict[tuple[str, tuple[str, ...]], float]] | None = None
        self._started = time.monotonic()

    def __call__(self, fams: list[Family]) -> None:
        now, vals = time.monotonic(), _values(fams)
        if self._prev is not None and now - self._prev[0] < self.every_s:
            return
        prev, self._prev = self._prev, (now, vals)
        if prev is None:
            return
        dt = now - prev[0]

        def rate(name: str, labels: tuple[str, ...]) -> float:
            return max(0.0, vals.get((name, labels), 0.0) - prev[1].get((name, labels), 0.0)) / dt

        cpu = rate("outrider_watched_cpu_seconds_total", ("user",)) + rate(
            "outrider_watched_cpu_seconds_total", ("system",))
        print(f"  t={now - self._started:5.1f}s  processes {vals.get(('outrider_watched_processes', ()), 0):.0f}"
              f"  cpu {cpu:4.2f} cores"
              f"  rss {vals.get(('outrider_watched_memory_rss_bytes', ()), 0) / 2**20:6.1f} MiB"
              f"  writes {rate('outrider_watched_io_bytes_total', ('write',)) / 2**20:5.2f} MiB/s"
              f"  host cpu {100 * vals.get(('outrider_host_cpu_utilization_ratio', ()), 0):3.0f}%"
              f"  host mem avail {vals.get(('outrider_host_memory_available_bytes', ()), 0) / 2**30:5.1f} GiB",
              file=sys.stderr)


def run_demo(duration_s: float = 12.0) -> int:
    from outrider.runner import run

    with tempfile.TemporaryDirectory(prefix="outrider-demo-") as ckpt:
        config = Config(interval_s=1.0, listen="127.0.0.1:0", filesystems=("/", ckpt))
        cmd = [sys.executable, "-m", "outrider.demo.workload", "--duration", str(duration_s),
               "--checkpoint-dir", ckpt]
        print(f"outrider demo: a synthetic training job (2 data-loader workers, checkpoints to {ckpt}) for "
              f"{duration_s:g} s, under `outrider run`, sweeping every second:", file=sys.stderr)
        seen: list[Family] = []
        code, summary = run(cmd, config, on_exit=seen.extend, listeners=[LiveLine()])
    vals = _values(seen)
    procs = sorted({labels[:2] for (name, labels) in vals if name == "outrider_process_memory_rss_bytes"})
    print("\nlast sweep before the job ended, per process (top N):", file=sys.stderr)
    for pid, pname in procs:
        rss = vals.get(("outrider_process_memory_rss_bytes", (pid, pname)), 0)
        cpu = sum(vals.get(("outrider_process_cpu_seconds_total", (pid, pname, m)), 0) for m in ("user", "system"))
        print(f"  pid {pid:>7}  {pname:<16} cpu {cpu:7.2f} s  rss {rss / 2**20:7.1f} MiB", file=sys.stderr)
    if summary is not None:
        print(f"\nThe agent served {summary.metrics_url} while the job ran; `outrider agent` serves the same "
              f"continuously.", file=sys.stderr)
    return code
