"""`outrider demo`: a bundled synthetic workload (a PyTorch training job with data-loader workers, then an inference
service under load) instrumented with the hook and run under `outrider run` on the embedded defaults. It prints a
live line of what the agent sees, the end-of-run summary, and the job's KPIs as the agent computed them. Part of
the way through training the workload slows its steps down on purpose: the agent's embedded evaluator fires an
alert (demo/rules.yaml) and resolves it once the steps are fast again, and the demo shows both."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from outrider.config import Config
from outrider.metrics.family import Family, merged_histogram
from outrider.metrics.quantile import histogram_quantile

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


class LiveLine:
    """Turns consecutive sweeps into one line of rates: what a person watching the job wants to see."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self._prev: tuple[float, dict[Key, float]] | None = None
        self._started = time.monotonic()

    def __call__(self, fams: list[Family]) -> None:
        now, vals = time.monotonic(), _values(fams)
        if self._prev is not None and now - self._prev[0] < self.every_s:
            return
        prev, self._prev = self._prev, (now, vals)
        if prev is None:
            return
        dt = now - prev[0]

        def rate(name: str) -> float:
            return max(0.0, _sum_where(vals, name) - _sum_where(prev[1], name)) / dt

        cpu = rate("outrider_watched_cpu_seconds_total")
        print(f"  t={now - self._started:5.1f}s  procs {_sum_where(vals, 'outrider_watched_processes'):.0f}"
              f"  cpu {cpu:4.2f} cores  rss {_sum_where(vals, 'outrider_watched_memory_rss_bytes') / 2**20:5.0f} MiB"
              f"  steps/s {rate('outrider_train_steps_total'):6.1f}  samples/s {rate('outrider_samples_total'):8.0f}"
              f"  req/s {rate('outrider_requests_total'):6.1f}"
              f"  host cpu {100 * _sum_where(vals, 'outrider_host_cpu_utilization_ratio'):3.0f}%", file=sys.stderr)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f} ms"


def kpi_report(fams: list[Family]) -> str:
    vals = _values(fams)
    lines = ["", "what the agent measured (from the hook):"]
    step = merged_histogram(fams, "outrider_train_step_duration_seconds")
    wait = merged_histogram(fams, "outrider_train_data_wait_seconds")
    if step is not None and step.count:
        samples = _sum_where(vals, "outrider_samples_total")
        lines.append(f"  training   {_sum_where(vals, 'outrider_train_steps_total'):.0f} steps, step time p50 "
                     f"{_ms(histogram_quantile(0.5, step))}, p99 {_ms(histogram_quantile(0.99, step))}, "
                     f"{samples / (step.sum + (wait.sum if wait else 0)):.0f} samples/s")
        if wait is not None and wait.count:
            frac = wait.sum / (wait.sum + step.sum)
            lines.append(f"             data-loader wait p50 {_ms(histogram_quantile(0.5, wait))}, "
                         f"{100 * frac:.0f}% of the loop waiting for data")
    req = merged_histogram(fams, "outrider_request_duration_seconds")
    if req is not None and req.count:
        errors = _sum_where(vals, "outrider_requests_total", status_class="4xx") + _sum_where(
            vals, "outrider_requests_total", status_class="5xx")
        lines.append(f"  inference  {req.count} requests on /predict/{{model}}, latency p50 "
                     f"{_ms(histogram_quantile(0.5, req))}, p90 {_ms(histogram_quantile(0.9, req))}, "
                     f"p99 {_ms(histogram_quantile(0.99, req))}; {errors:.0f} errors")
    return "\n".join(lines)


def run_demo(duration_s: float = 12.0) -> int:
    from outrider.runner import run

    train_s = max(1.0, duration_s * 2 / 3)
    serve_s = max(1.0, duration_s - train_s)
    with tempfile.TemporaryDirectory(prefix="outrider-demo-") as ckpt, \
            tempfile.TemporaryDirectory(prefix="outrider-demo-state-") as state:
        config = Config(interval_s=0.5, listen="127.0.0.1:0", filesystems=("/", ckpt), flush_interval_s=0.25,
                        rule_files=(str(Path(__file__).with_name("rules.yaml")),), rule_interval_s=0.5,
                        state_dir=state, alert_instance="demo")
        logging.getLogger("outrider.alerts").setLevel(logging.INFO)  # show the alert's transitions as they happen
        cmd = [sys.executable, "-m", "outrider.demo.workload", "--train-seconds", str(train_s),
               "--serve-seconds", str(serve_s), "--checkpoint-dir", ckpt]
        print(f"outrider demo: a synthetic training job ({train_s:g} s, 2 data-loader workers, checkpoints to "
              f"{ckpt}), then an inference service under load ({serve_s:g} s), instrumented with the hook, "
              f"under `outrider run`:", file=sys.stderr)
        seen: list[Family] = []
        code, summary = run(cmd, config, on_exit=seen.extend, listeners=[LiveLine()])
        alerts = alert_timeline(state)
    print(kpi_report(seen), file=sys.stderr)
    print(alerts, file=sys.stderr)
    if summary is not None and summary.run_id:
        print(verdict_and_report(summary.run_id, config), file=sys.stderr)
    if summary is not None:
        print(f"\nThe agent served {summary.metrics_url} while the job ran; `outrider agent` serves the same "
              f"continuously.", file=sys.stderr)
    return code


def alert_timeline(state_dir: str) -> str:
    """The alerts the agent's embedded evaluator raised during the run, from its saved state."""
    try:
        with open(os.path.join(state_dir, "alerts.json"), encoding="utf-8") as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return "\nalerts: none recorded"
    lines = ["", "alerts the agent raised itself (embedded rule evaluation, no Prometheus):"]
    for key, alerts in sorted(state.get("rules", {}).items()):
        for a in alerts:
            name = key.split("/", 1)[1]
            fired = time.strftime("%H:%M:%S", time.localtime(a["fired_at"] / 1000)) if a["fired_at"] else "-"
            resolved = time.strftime("%H:%M:%S", time.localtime(a["resolved_at"] / 1000)) if a["resolved_at"] else "-"
            lines.append(f"  {name}: fired {fired}, resolved {resolved} ({a['state']}); "
                         f"{a['annotations'].get('summary', '')}")
    if len(lines) == 2:
        lines.append("  none")
    return "\n".join(lines)


def verdict_and_report(run_id: str, config: Config) -> str:
    """The run's dominant bottleneck verdict and its advice, and the HTML report written for it."""
    from outrider.runs.report import dominant_verdict, render
    from outrider.runs.store import RunStore

    store = RunStore(config.runs_dir or None)
    try:
        rec = store.load(run_id)
        verdict = dominant_verdict(rec)
        reports = store.directory / "reports"
        reports.mkdir(exist_ok=True)
        path = reports / f"outrider-report-{run_id}.html"
        path.write_text(render(rec), encoding="utf-8")
    finally:
        store.close()
    from outrider.diagnosis.bottleneck import RECOMMENDATIONS

    return (f"\nverdict: {verdict or 'none'}: {RECOMMENDATIONS.get(verdict or '', '')}\n"
            f"report:  {path} (outrider report {run_id}; outrider compare {run_id} ANOTHER_RUN)")
