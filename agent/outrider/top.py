"""`outrider top`: a live terminal view of an agent: GPUs, the job's KPIs, the bottleneck verdict, stalls.

It reads the agent's /metrics (any agent: a sidecar, a node agent, `outrider run`), twice a refresh apart, and
draws one screen with rich, fitted to the terminal's width. `--once` draws a single screen and exits (for scripts and
tests). rich is imported here and nowhere else: the agent and the hook never load it (pyproject.toml's
import-linter contracts)."""

from __future__ import annotations

import io
import math
import shutil
import sys
import time
import urllib.request
from collections import defaultdict

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from outrider.diagnosis.bottleneck import RECOMMENDATIONS
from outrider.metrics import text_format, units
from outrider.metrics.family import HistogramValue
from outrider.metrics.quantile import histogram_quantile

Sample = tuple[str, tuple[tuple[str, str], ...]]


def parse(text: str) -> dict[Sample, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in text_format.parse(text).samples}


def fetch(url: str) -> dict[Sample, float]:
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=5) as resp:
        return parse(resp.read().decode())


def total(m: dict[Sample, float], name: str) -> float:
    return sum(v for (n, _), v in m.items() if n == name)


def by_label(m: dict[Sample, float], name: str, label: str, **match: str) -> dict[str, float]:
    out = {}
    for (n, labels), v in m.items():
        d = dict(labels)
        if n == name and all(d.get(k) == x for k, x in match.items()):
            out[d.get(label, "")] = v
    return out


def histogram(m: dict[Sample, float], name: str) -> HistogramValue | None:
    buckets: dict[float, float] = defaultdict(float)
    for (n, labels), v in m.items():
        if n == name + "_bucket":
            le = dict(labels)["le"]
            buckets[math.inf if le == "+Inf" else float(le)] += v
    if not buckets:
        return None
    bounds = sorted(b for b in buckets if b != math.inf)
    cum = [buckets[b] for b in bounds] + [buckets.get(math.inf, 0.0)]
    counts = tuple(int(c - (cum[i - 1] if i else 0)) for i, c in enumerate(cum))
    return HistogramValue(tuple(bounds), counts, total(m, name + "_sum"))


def delta_quantile(new: dict[Sample, float], old: dict[Sample, float], name: str, q: float) -> float | None:
    a, b = histogram(old, name), histogram(new, name)
    if b is None:
        return None
    if a is not None and a.bounds == b.bounds:
        b = HistogramValue(b.bounds, tuple(max(0, x - y) for x, y in zip(b.counts, a.counts)), b.sum - a.sum)
    return histogram_quantile(q, b)


def _q(new: dict[Sample, float], old: dict[Sample, float], name: str, q: float) -> str:
    v = delta_quantile(new, old, name, q)
    return "-" if v is None else units.seconds(v)


def _cut(text: str) -> Text:
    """One line, cut with an ellipsis where the terminal is too narrow."""
    return Text(text, no_wrap=True, overflow="ellipsis")


def _gpu_table(new: dict[Sample, float]) -> Table | Text:
    util = by_label(new, "outrider_gpu_utilization_ratio", "gpu", task="general")
    if not util:
        return Text("no GPU metrics (no NVML here, or the gpu collector is off)", style="dim")
    used = by_label(new, "outrider_gpu_memory_used_bytes", "gpu")
    cap = by_label(new, "outrider_gpu_memory_total_bytes", "gpu")
    temp = by_label(new, "outrider_gpu_temperature_celsius", "gpu", sensor="gpu")
    power = by_label(new, "outrider_gpu_power_watts", "gpu")
    sm = by_label(new, "outrider_gpu_sm_activity_ratio", "gpu")
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False)
    # GPU and util always show; the others give way, with an ellipsis, on a narrow terminal.
    table.add_column("GPU", no_wrap=True, min_width=3)
    table.add_column("util", justify="right", no_wrap=True, min_width=4)
    for name in ("SM", "memory", "temp", "power"):
        table.add_column(name, justify="left" if name == "memory" else "right", overflow="ellipsis")
    for g in sorted(util, key=lambda x: int(x) if x.isdigit() else 0):
        table.add_row(g, units.percent(util[g]), *map(_cut, (
            units.percent(sm[g]) if g in sm else "-",
            f"{units.bytes_iec(used.get(g, 0.0))} / {units.bytes_iec(cap.get(g, 0.0))}",
            f"{temp.get(g, 0.0):.0f} °C", f"{power.get(g, 0.0):.0f} W")))
    return table


def frame(new: dict[Sample, float], old: dict[Sample, float], dt: float, url: str) -> Group:
    """One screen: GPUs, the job's KPIs, the verdict and the alerts, as rich renderables that fit any width
    (columns shrink and cut with an ellipsis; only the advice wraps)."""
    def rate(name: str) -> float:
        return max(0.0, total(new, name) - total(old, name)) / dt if dt > 0 else 0.0

    rows = Table.grid(padding=(0, 2))
    rows.add_column(style="bold", no_wrap=True, min_width=9)
    rows.add_column()
    if rate("outrider_train_steps_total") or total(new, "outrider_train_steps_total"):
        step = "outrider_train_step_duration_seconds"
        rows.add_row("training", _cut(f"{units.rate(rate('outrider_train_steps_total'), 'steps')}  "
                                     f"{units.rate(rate('outrider_samples_total'), 'samples')}  "
                                     f"{units.rate(rate('outrider_tokens_total'), 'tokens')}"))
        rows.add_row("", _cut(f"step time p50 {_q(new, old, step, 0.5)}  p99 {_q(new, old, step, 0.99)}"))
    if rate("outrider_requests_total") or total(new, "outrider_requests_total"):
        req = "outrider_request_duration_seconds"
        rows.add_row("inference", _cut(f"{units.rate(rate('outrider_requests_total'), 'req')}  latency p50 "
                                      f"{_q(new, old, req, 0.5)}  p90 {_q(new, old, req, 0.9)}  "
                                      f"p99 {_q(new, old, req, 0.99)}"))
    rows.add_row("host", _cut(f"cpu {units.percent(total(new, 'outrider_host_cpu_utilization_ratio'))}  job rss "
                             f"{units.bytes_iec(total(new, 'outrider_watched_memory_rss_bytes'))}  memory available "
                             f"{units.bytes_iec(total(new, 'outrider_host_memory_available_bytes'))}"))
    classes = by_label(new, "outrider_bottleneck", "class")
    verdict = [c for c, v in classes.items() if v == 1]
    if classes and not verdict:  # a window without the evidence its rule needs (diagnosis/bottleneck.NOT_JUDGED)
        rows.add_row("verdict", Text("not judged: this window lacks the measurements its rule needs", no_wrap=True,
                                     overflow="ellipsis"))
    if verdict:
        rows.add_row("verdict", Text(verdict[0], style="bold", no_wrap=True, overflow="ellipsis"))
        rows.add_row("", Text(RECOMMENDATIONS.get(verdict[0], "")))  # the advice wraps: it is read, not scanned
    stalled = [r or "-" for r, v in by_label(new, "outrider_hook_stalled", "rank").items() if v]
    # severity "none" is the Watchdog, a heartbeat for a dead man's switch that always fires: not news
    firing = sorted({dict(labels).get("alertname", "") for (n, labels), v in new.items()
                     if n == "outrider_alerts" and v and dict(labels).get("alertstate") == "firing"
                     and dict(labels).get("severity") != "none"})  # heartbeats (the Watchdog) are no news
    alerts = Text(", ".join(firing) if firing else "none firing", style="bold red" if firing else "", no_wrap=True,
                  overflow="ellipsis")
    if stalled:
        alerts.append(f"   STALLED ranks: {', '.join(stalled)}", style="bold red")
    rows.add_row("alerts", alerts)
    header = Text(f"outrider top  {url}  {time.strftime('%H:%M:%S')}", style="bold", no_wrap=True,
                  overflow="ellipsis")
    return Group(header, Text(""), _gpu_table(new), Text(""), rows)


def render_text(screen: Group, width: int) -> str:
    """A screen as plain text `width` columns wide (for --once, pipes and tests)."""
    console = Console(width=width, file=io.StringIO(), color_system=None, force_terminal=False, highlight=False)
    with console.capture() as capture:
        console.print(screen)
    return capture.get()


def run_top(url: str, interval_s: float = 2.0, once: bool = False) -> int:
    """Draw a screen every interval_s. Live mode redraws in place on the terminal's alternate screen (no clear,
    so no flicker) and re-reads the terminal's width on every screen; --once prints one screen and exits."""
    try:
        old, t_old = fetch(url), time.monotonic()
    except OSError as e:
        print(f"outrider top: cannot read {url}/metrics: {e}", file=sys.stderr)
        return 1
    try:
        if once:
            time.sleep(interval_s)
            new = fetch(url)
            sys.stdout.write(render_text(frame(new, old, time.monotonic() - t_old, url),
                                         shutil.get_terminal_size().columns))
            return 0
        console = Console(highlight=False)
        with Live(console=console, screen=True, auto_refresh=False, redirect_stderr=False) as live:
            while True:
                time.sleep(interval_s)
                new, t_new = fetch(url), time.monotonic()
                live.update(frame(new, old, t_new - t_old, url), refresh=True)
                old, t_old = new, t_new
    except KeyboardInterrupt:
        return 0
    except OSError as e:
        print(f"outrider top: lost {url}: {e}", file=sys.stderr)
        return 1
