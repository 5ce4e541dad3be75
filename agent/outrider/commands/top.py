"""`outrider top`: a live terminal view of an agent: GPUs, the job's KPIs, the bottleneck verdict, stalls.

It reads the agent's /metrics (any agent: a sidecar, a node agent, `outrider run`) and draws a screen every refresh
with rich, fitted to the terminal's width. Rates (steps/s, samples/s, tokens/s, requests/s), the share of the loop
waiting for data and the step and latency percentiles are over one window, which the screen states: from the hook's
publications seen at one sweep of the agent to those seen at the next, timed by the publishers' own clock (the
heartbeats the agent serves; metrics/rate.py), never by when top read /metrics: /metrics changes once a sweep
(every 5 s by default), so two reads 2 s apart see either no change (0 steps/s for a running job) or a whole
sweep's (2.5x the truth). A job that stops reads 0 from the first window after it stopped. /metrics is read every
half second; until two sweeps have been seen a rate is not known yet ("…"). `--once` reads until then (two reads
a sweep apart, at most ONCE_LIMIT_S) and draws a single screen (for scripts and tests). rich is imported here and
nowhere else: the agent and the hook never load it (pyproject.toml's import-linter contracts).

/metrics is asked for as Prometheus asks for it with native histograms on: the protobuf exposition first
(metrics/protobuf_format.py reads it), so the step and latency percentiles come from the recorded sketches, within
1.08% of the workload's own clock, their growth over a window the sketches' difference. An agent that answers with
a text format (an older one, or native_histograms: false) is read as before, from its classic buckets (coarser: 10 ms
and 20 ms steps fall in one bucket). A page top cannot read (malformed, over protobuf_format.MAX_PAGE_BYTES, or
dripping for over READ_LIMIT_S) is an error it says, as a lost agent is."""

from __future__ import annotations

import collections
import http.client
import io
import math
import shutil
import signal
import sys
import threading
import time
import urllib.request
from collections import defaultdict

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from outrider.diagnosis.bottleneck import advice
from outrider.diagnosis.signals import Signals
from outrider.metrics import protobuf_format, text_format, units
from outrider.metrics.exposition import PROTOBUF_MEDIA_TYPE
from outrider.metrics.family import HistogramValue
from outrider.metrics.quantile import quantile
from outrider.metrics.rate import CounterHistory
from outrider.shared.sketch import Sketch

Sample = tuple[str, tuple[tuple[str, str], ...]]


# What Prometheus (2.42) asks for with native histograms on: the protobuf exposition first, the text formats after,
# so an agent that serves no protobuf (an older one, or native_histograms: false) answers with text
ACCEPT = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
          "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,"
          "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
READ_LIMIT_S = 10.0  # a whole answer, however slowly it drips
# A histogram family's sketch, in a read: its native buckets summed over its series, one sample per bucket under the
# family's name and this suffix (with a space: no exposition's metric name has one), labelled with the bucket's
# index ("zero" for the zero bucket). Only where every series of the family has its sketch, so that the sum is the
# sketch of all its values.
SKETCH = " sketch"


class UnreadablePage(OSError):
    """An answer from /metrics that is not a page top can read (malformed, too large, or too slow to arrive): an
    error like a lost connection, said and not drawn."""


def parse(page: str | bytes, content_type: str = "") -> dict[Sample, float]:
    """A read of /metrics as samples: a text format's as they are; the protobuf exposition's as the text format
    gives them, and beside each histogram family its sketch (SKETCH). MalformedPage for a protobuf page that is
    not one."""
    if content_type.split(";", 1)[0].strip().lower() != PROTOBUF_MEDIA_TYPE:
        text = page.decode(errors="replace") if isinstance(page, bytes) else page
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in text_format.parse(text).samples}
    families = protobuf_format.parse(page.encode() if isinstance(page, str) else page)
    # a name with a space is no metric's (and would be taken for a sketch's bucket): left out
    out = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in protobuf_format.samples(families)
           if " " not in s.name}
    for fam in families:
        values = [s.value for s in fam.samples if isinstance(s.value, HistogramValue)]
        sketches = [h.sketch for h in values if h.sketched and h.sketch is not None]
        if not values or len(sketches) < len(values):
            continue
        merged = sum(sketches[1:], sketches[0])
        out[(fam.name + SKETCH, (("bucket", "zero"),))] = float(merged.zero)
        for i, c in merged.buckets.items():
            out[(fam.name + SKETCH, (("bucket", str(i)),))] = float(c)
    return out


def fetch(url: str) -> dict[Sample, float]:
    """One read of the agent's /metrics: the protobuf exposition where the agent serves it (the distributions at
    their recorded resolution), a text format otherwise. The whole answer within READ_LIMIT_S (read on a thread
    of its own, left to its socket's timeout if the answer drips for longer) and at most MAX_PAGE_BYTES; OSError
    (UnreadablePage for an answer that is not a page) when it cannot be read."""
    answer: list[tuple[bytes, str] | BaseException] = []
    reader = threading.Thread(target=_read, args=(url, answer), name="outrider-top-read", daemon=True)
    reader.start()
    reader.join(READ_LIMIT_S)
    if not answer:
        raise UnreadablePage(f"no whole answer within {READ_LIMIT_S:g} s")
    got = answer[0]
    if isinstance(got, BaseException):
        raise got
    try:
        return parse(*got)
    except protobuf_format.MalformedPage as e:
        raise UnreadablePage(f"not a protobuf exposition: {e}") from None


def _read(url: str, answer: list[tuple[bytes, str] | BaseException]) -> None:
    """The page and its content type, or the error, into `answer`."""
    request = urllib.request.Request(url.rstrip("/") + "/metrics", headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            chunks, size = [], 0
            while chunk := resp.read1(1 << 16):  # what has arrived, not a whole buffer's worth
                size += len(chunk)
                if size > protobuf_format.MAX_PAGE_BYTES:
                    raise UnreadablePage(f"a page over {protobuf_format.MAX_PAGE_BYTES} bytes")
                chunks.append(chunk)
            answer.append((b"".join(chunks), resp.headers.get("Content-Type", "")))
    except http.client.HTTPException as e:  # an answer that is not HTTP
        answer.append(UnreadablePage(f"{type(e).__name__}: {e}"))
    except BaseException as e:
        answer.append(e)


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
    """A histogram's series in a read, summed: the classic buckets, and the sketch where the read has it (SKETCH)
    for all of its values."""
    buckets: dict[float, float] = defaultdict(float)
    zero, native, sketched = 0.0, {}, False
    for (n, labels), v in m.items():
        if n == name + "_bucket":
            le = dict(labels)["le"]
            buckets[math.inf if le == "+Inf" else float(le)] += v
        elif n == name + SKETCH:
            sketched = True
            index = labels[0][1]
            if index == "zero":
                zero = v
            else:
                native[int(index)] = v
    if not buckets:
        return None
    bounds = sorted(b for b in buckets if b != math.inf)
    cum = [buckets[b] for b in bounds] + [buckets.get(math.inf, 0.0)]
    counts = tuple(int(c - (cum[i - 1] if i else 0)) for i, c in enumerate(cum))
    sketch = Sketch.of(zero, native) if sketched else None
    return HistogramValue(tuple(bounds), counts, total(m, name + "_sum"),
                          sketch if sketch is not None and sketch.count == sum(counts) else None)


# The counters top shows as rates and shares: its name in the history -> (metric, labels it must have)
COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    "steps": ("outrider_train_steps_total", {}), "samples": ("outrider_samples_total", {}),
    "tokens": ("outrider_tokens_total", {}), "requests": ("outrider_requests_total", {}),
    "loop": ("outrider_train_loop_seconds_total", {}),
    "data_wait": ("outrider_train_loop_seconds_total", {"part": "data_wait"}),
    "flops_peak": ("outrider_train_flops_peak_seconds_total", {}),
    "flops_timed": ("outrider_train_flops_timed_seconds_total", {}),
}
KEPT_READS = 512  # at POLL_S, the last four minutes
# Histograms whose growth a screen shows over a rate window: only their series are kept of each read
WINDOWED = ("outrider_train_step_duration_seconds", "outrider_request_duration_seconds")
POLL_S = 0.5
ONCE_LIMIT_S = 30.0


class Reads:
    """The reads of /metrics so far: the counters' history, for rates over the window between two sweeps'
    publications, and the reads themselves, for the histograms' growth over the same windows."""

    def __init__(self) -> None:
        self.counters = CounterHistory(COUNTERS, KEPT_READS)
        self.latest: dict[Sample, float] = {}
        # each read's WINDOWED histograms' series only (the whole read is the latest)
        self.reads: collections.deque[tuple[float, dict[Sample, float]]] = collections.deque(maxlen=KEPT_READS)

    def add(self, t: float, m: dict[Sample, float]) -> None:
        self.latest = m
        self.reads.append((t, {k: v for k, v in m.items() if k[0].startswith(WINDOWED)}))
        self.counters.add(t, ((name, dict(labels), v) for (name, labels), v in m.items()
                              if name in self.counters.metrics))

    def rate(self, key: str) -> float | None:
        return self.counters.rate(key)

    def known(self) -> bool:
        """Whether every counter the agent serves has its rate: what `--once` waits for."""
        return all(self.counters.rate(k) is not None for k in ("steps", "requests")
                   if total(self.latest, COUNTERS[k][0]))

    def since(self, key: str) -> dict[Sample, float]:
        """The read at the start of `key`'s rate window (the oldest read while it has none)."""
        window = self.counters.window(key)
        start = window[0] if window else self.reads[0][0]
        return next((m for t, m in self.reads if t >= start), self.latest)


def delta_quantile(new: dict[Sample, float], old: dict[Sample, float], name: str, q: float) -> float | None:
    """The q-quantile of what a histogram recorded between two reads: from the sketches' difference where both
    reads have them (within 1.08%), else from the classic buckets'."""
    b = histogram(new, name)
    return None if b is None else quantile(q, b.since(histogram(old, name)))


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


def _rate(reads: Reads, key: str, what: str) -> str:
    value = reads.rate(key)
    return f"… {what}/s" if value is None else units.rate(value, what)


def _over(reads: Reads, key: str) -> str:
    """The window the line's rates and percentiles are over, by the publishers' clock."""
    seconds = reads.counters.seconds(key)
    return "" if seconds is None else f"  over {units.seconds(seconds)}"


def _efficiency(reads: Reads, new: dict[Sample, float]) -> str:
    """MFU over the window (the agent's counters of time at the peak over the loop's time of the same steps), by
    rank where there are several, goodput so far, tokens a second per device."""
    parts = []
    mfu = reads.counters.ratio("flops_peak", "flops_timed")
    if mfu is not None:
        ranks = by_label(new, "outrider_train_mfu_ratio", "rank")
        each = ("  " + " ".join(f"{r or '-'}:{units.percent(v)}" for r, v in sorted(ranks.items()))
                if len(ranks) > 1 else "")
        parts.append(f"MFU {units.percent(mfu)}{each}")
    everything = total(new, "outrider_train_goodput_seconds_total")
    if everything > 0:
        productive = sum(v for (n, labels), v in new.items()
                         if n == "outrider_train_goodput_seconds_total" and ("cause", "productive") in labels)
        parts.append(f"goodput {units.percent(productive / everything)}")
    tokens = by_label(new, "outrider_train_device_tokens_per_second", "rank")
    if tokens:
        parts.append(f"{units.rate(sum(tokens.values()) / len(tokens), 'tokens')} a device")
    return "  ".join(parts)


def frame(reads: Reads, url: str) -> Group:
    """One screen: GPUs, the job's KPIs, the verdict and the alerts, as rich renderables that fit any width
    (columns shrink and cut with an ellipsis; only the advice wraps)."""
    new = reads.latest
    rows = Table.grid(padding=(0, 2))
    rows.add_column(style="bold", no_wrap=True, min_width=9)
    rows.add_column()
    if total(new, "outrider_train_steps_total"):
        step, old = "outrider_train_step_duration_seconds", reads.since("steps")
        rates = [_rate(reads, "steps", "steps")]
        rates += [_rate(reads, key, key) for key in ("samples", "tokens") if reads.counters.total(key)
                  or total(new, COUNTERS[key][0])]
        wait = reads.counters.ratio("data_wait", "loop")
        if wait is not None:
            rates.append(f"data wait {units.percent(wait)}")
        rows.add_row("training", _cut("  ".join(rates)))
        rows.add_row("", _cut(f"step time p50 {_q(new, old, step, 0.5)}  p99 {_q(new, old, step, 0.99)}"
                              f"{_over(reads, 'steps')}"))
        efficiency = _efficiency(reads, new)
        if efficiency:
            rows.add_row("", _cut(efficiency))
    if total(new, "outrider_requests_total"):
        req, old = "outrider_request_duration_seconds", reads.since("requests")
        rows.add_row("inference", _cut(f"{_rate(reads, 'requests', 'req')}  latency p50 "
                                      f"{_q(new, old, req, 0.5)}  p90 {_q(new, old, req, 0.9)}  "
                                      f"p99 {_q(new, old, req, 0.99)}{_over(reads, 'requests')}"))
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
        # the advice follows the evidence the agent serves beside the verdict (which input, a service, a GPU or
        # none), as the run's summary does; it wraps: it is read, not scanned
        evidence = Signals.from_evidence(by_label(new, "outrider_diagnosis_signal", "signal"))
        rows.add_row("", Text(advice(verdict[0], evidence)))
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
    """Draw a screen every interval_s, reading /metrics every POLL_S or interval_s if shorter (the agent serves
    the latest sweep's rendering: a read costs it nothing more), so that a new sweep is seen within a read. Live
    mode redraws in place on the terminal's alternate screen (no clear, so no flicker) and re-reads the terminal's
    width on every screen; --once reads until the rates are known (a read of the agent's next sweep after the
    first read: two reads a sweep apart, at most ONCE_LIMIT_S), draws one screen and exits."""
    reads = Reads()
    poll_s = min(POLL_S, interval_s)
    try:
        start = time.monotonic()
        reads.add(start, fetch(url))
    except OSError as e:
        print(f"outrider top: cannot read {url}/metrics: {e}", file=sys.stderr)
        return 1
    # Ctrl-C sets a flag the loop reads between reads and screens, rather than raising wherever the main thread is
    # (inside a thread's join, or rich's drawing, an interrupt could leave top hanging at exit)
    interrupted: list[int] = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, lambda signum, _frame: interrupted.append(signum))
    try:
        if once:
            while not interrupted:
                time.sleep(poll_s)
                now = time.monotonic()
                reads.add(now, fetch(url))
                if reads.known() or now - start >= ONCE_LIMIT_S:
                    break
            if interrupted:
                return 0
            sys.stdout.write(render_text(frame(reads, url), shutil.get_terminal_size().columns))
            return 0
        console = Console(highlight=False)
        drawn = start
        with Live(console=console, screen=True, auto_refresh=False, redirect_stderr=False) as live:
            while not interrupted:
                time.sleep(poll_s)
                if interrupted:
                    break
                now = time.monotonic()
                reads.add(now, fetch(url))
                if now - drawn >= interval_s - poll_s / 2:
                    live.update(frame(reads, url), refresh=True)
                    drawn = now
        return 0
    except KeyboardInterrupt:
        return 0
    except OSError as e:
        print(f"outrider top: lost {url}: {e}", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
