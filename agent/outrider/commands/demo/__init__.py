"""`outrider demo`: a bundled synthetic workload (a PyTorch training job with data-loader workers, then an inference
service under load) instrumented with the hook and run under `outrider run` on the embedded defaults. It prints a
live line of what the agent sees, then the summary every `outrider run` ends with (what the run cost, what the
agent measured, the alerts it raised, the verdict), and writes the run's HTML report. Part of the way through
training the workload slows its steps down on purpose: the agent's embedded evaluator fires an alert
(demo/rules.yaml) and resolves it once the steps are fast again, and the demo shows both."""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

from outrider.ground.config import Config, load
from outrider.metrics import units
from outrider.metrics.family import Family
from outrider.metrics.rate import CounterHistory, family_samples

Key = tuple[str, tuple[str, ...]]


def _values(fams: list[Family]) -> dict[Key, float]:
    return {(f.defn.name, labels): value for f in fams for labels, value in f.samples if isinstance(value, float)}


def _sum_where(vals: dict[Key, float], name: str, **match: str) -> float:
    """Sum of a metric's samples whose labels include `match` (label positions from the metric definition)."""
    from outrider.metrics.catalog import CATALOG

    names = CATALOG[name].label_names
    total = 0.0
    for (n, labels), v in vals.items():
        if n == name and all(labels[names.index(k)] == want for k, want in match.items()):
            total += v
    return total


RATED = ("outrider_watched_cpu_seconds_total", "outrider_train_steps_total", "outrider_samples_total",
         "outrider_requests_total")


class LiveLine:
    """Turns the sweeps into one line of rates every every_s: what a person watching the job wants to see. Rates
    from the counters between two sweeps' publications (metrics/rate.py), as `outrider top` and the record take
    them."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self._counters = CounterHistory({name: (name, {}) for name in RATED})
        self._shown = self._started = time.monotonic()

    def __call__(self, fams: list[Family]) -> None:
        now, vals = time.monotonic(), _values(fams)
        self._counters.add(now, family_samples(fams, self._counters.metrics))
        if now - self._shown < self.every_s:
            return
        self._shown = now

        def rate(name: str, what: str) -> str:
            value = self._counters.rate(name)
            if value is None and not self._counters.total(name):
                value = 0.0  # never moved: nothing to measure
            return f"… {what}/s" if value is None else units.rate(value, what)

        cpu = self._counters.rate("outrider_watched_cpu_seconds_total")
        print(f"  {units.run_time(now - self._started)}  procs {_sum_where(vals, 'outrider_watched_processes'):.0f}"
              f"  cpu {units.cores(cpu) if cpu is not None else '…'}"
              f"  rss {units.bytes_iec(_sum_where(vals, 'outrider_watched_memory_rss_bytes'))}"
              f"  {rate('outrider_train_steps_total', 'steps')}"
              f"  {rate('outrider_samples_total', 'samples')}"
              f"  {rate('outrider_requests_total', 'req')}"
              f"  host cpu {units.percent(_sum_where(vals, 'outrider_host_cpu_utilization_ratio'))}",
              file=sys.stderr)


def run_demo(duration_s: float = 12.0) -> int:
    from outrider.commands.runner import run

    train_s = max(1.0, duration_s * 2 / 3)
    serve_s = max(1.0, duration_s - train_s)
    with tempfile.TemporaryDirectory(prefix="outrider-demo-") as ckpt, \
            tempfile.TemporaryDirectory(prefix="outrider-demo-state-") as state:
        # a diagnosis window of a few seconds: the demo's phases (training, its slowdown, serving) last seconds,
        # and a window spanning two of them would judge the service by the loop's steps still in it
        config = Config(interval_s=0.5, listen="127.0.0.1:0", filesystems=("/", ckpt), flush_interval_s=0.25,
                        rule_files=(str(Path(__file__).with_name("rules.yaml")),), rule_interval_s=0.5,
                        state_dir=state, alert_instance="demo", runs_dir=load().config.runs_dir,
                        diagnosis_window_s=2.0)
        logging.getLogger("outrider.alerts").setLevel(logging.INFO)  # show the alert's transitions as they happen
        cmd = [sys.executable, "-m", "outrider.commands.demo.workload", "--train-seconds", str(train_s),
               "--serve-seconds", str(serve_s), "--checkpoint-dir", ckpt]
        print(f"outrider demo: a synthetic training job ({train_s:g} s, 2 data-loader workers, checkpoints to "
              f"{ckpt}), then an inference service under load ({serve_s:g} s), instrumented with the hook, "
              f"under `outrider run`:", file=sys.stderr)
        # The summary run() prints ends with what the agent measured, the alerts it raised and the verdict.
        code, summary = run(cmd, config, listeners=[LiveLine()])
    if summary is not None and summary.run_id:
        print(write_report(summary.run_id, config), file=sys.stderr)
    if summary is not None:
        print(f"\nThe agent served {summary.metrics_url} while the job ran; `outrider agent` serves the same "
              f"continuously.", file=sys.stderr)
    return code


def write_report(run_id: str, config: Config) -> str:
    """The run's HTML report, next to its record; where it is, and how to get it again or compare."""
    from outrider.runs.report import render
    from outrider.runs.store import RunStore

    store = RunStore(config.runs_dir or None)
    try:
        rec = store.load(run_id)
        reports = store.directory / "reports"
        reports.mkdir(exist_ok=True)
        path = reports / f"outrider-report-{run_id}.html"
        path.write_text(render(rec), encoding="utf-8")
    finally:
        store.close()
    return f"\nreport: {path} (outrider report {run_id}; outrider compare {run_id} ANOTHER_RUN)"
