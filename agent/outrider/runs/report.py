"""The HTML run report: the run's verdict with its evidence and advice beside the timeline of verdicts, alerts and
stalls; the alerts and events of the run; what the agent measured; KPIs over time as charts with axes and units;
and what the run cost. One self-contained file that opens offline (inline SVG and CSS, no script, nothing
fetched). Every number is in human units (metrics/units.py)."""

from __future__ import annotations

import html
import time
from dataclasses import dataclass

from outrider.metrics import units
from outrider.runs import plot
from outrider.runs.measured import Measured
from outrider.runs.store import RunRecord

COLORS = {"idle": "#9e9e9e", "throttled": "#e65100", "memory_pressure": "#c62828", "input_bound": "#6a1b9a",
          "memory_bandwidth_bound": "#283593", "compute_bound": "#2e7d32", "host_bound": "#f9a825",
          "communication_bound": "#00838f", "balanced": "#607d8b", "hung_before_first_step": "#b71c1c",
          "python_bound": "#ad1457", "checkpoint_bound": "#8d6e63", "waiting": "#0277bd", "not_judged": "#cfd8dc"}
WHERE_COLORS = {"python": "#ad1457", "native": "#2e7d32", "waiting": "#9e9e9e", "data": "#6a1b9a",
                "collective": "#00838f", "checkpoint": "#e65100", "optimizer": "#f9a825"}
ALERT_COLORS = {"critical": "#b71c1c", "warning": "#ef6c00"}


@dataclass(frozen=True)
class Chart:
    title: str
    kind: str  # how its values read: seconds, bytes, ratio, cores, rate:WHAT
    series: tuple[tuple[str, str], ...]  # (KPI, legend label)


CHARTS = (
    Chart("Step time", "seconds", (("step_time_s", "mean"), ("step_p50_s", "p50"), ("step_p99_s", "p99"))),
    Chart("Throughput", "rate:samples", (("samples_per_s", "samples per second"),)),
    Chart("Token throughput", "rate:tokens", (("tokens_per_s", "tokens per second"),)),
    Chart("Data wait", "ratio", (("data_wait_fraction", "share of the loop waiting for data"),)),
    Chart("MFU", "ratio", (("mfu", "model FLOPs over the devices' peak"),)),
    Chart("Job CPU", "cores", (("process_cpu_cores", "the watched process tree"),)),
    Chart("Host CPU", "ratio", (("host_cpu_util", "all CPUs of the machine"),)),
    Chart("Memory (RSS)", "bytes", (("rss_bytes", "the watched process tree"),)),
    Chart("GPU", "ratio", (("gpu_util", "utilisation"), ("gpu_mem_ratio", "memory used"))),
    Chart("Requests", "rate:req", (("requests_per_s", "requests per second"),)),
    Chart("Errors", "rate:errors", (("client_errors_per_s", "4xx"), ("server_errors_per_s", "5xx"))),
    Chart("Request latency", "seconds", (("latency_p50_s", "p50"), ("latency_p99_s", "p99"))),
)

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; color: #222; max-width: 1180px; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin: 1.4em 0 0.5em; }
h3 { font-size: 0.95em; margin: 0 0 4px; } .meta { color: #555; margin-top: 0; }
table { border-collapse: collapse; } th, td { text-align: left; padding: 3px 12px 3px 0; vertical-align: top;
  border-bottom: 1px solid #eee; } th { font-weight: 600; color: #444; }
.top { display: grid; grid-template-columns: minmax(300px, 1fr) 640px; gap: 24px; align-items: start; }
.verdict { font-size: 1.5em; padding: 0.3em 0.7em; color: #fff; display: inline-block; border-radius: 4px;
  margin: 0 0 0.4em; }
.charts { display: grid; grid-template-columns: repeat(2, 560px); gap: 18px 28px; }
.legend { font-size: 0.8em; color: #444; } .legend span { margin-right: 14px; white-space: nowrap; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
.note { color: #666; font-size: 0.9em; } caption { text-align: left; }
"""


def dominant_verdict(rec: RunRecord) -> str | None:
    """The run's verdict class (runs/verdict.py), None when the run had none."""
    return rec.run_verdict().cls or None


def _when(rec: RunRecord, t: float) -> str:
    return f"{units.run_time(t - rec.started)} ({time.strftime('%H:%M:%S', time.localtime(t))})"


def _verdict_section(rec: RunRecord) -> str:
    e = html.escape
    v = rec.run_verdict()
    color = COLORS.get(v.cls, "#999")
    evidence = "".join(f"<tr><th>{e(label)}</th><td>{e(value)}</td></tr>" for label, value in v.evidence_rows())
    why = f'<p id="reason"><b>Why:</b> {e(v.reason)}</p>' if v.reason else ""
    card = (f'<p id="verdict" class="verdict" style="background:{color}">{e(v.cls or "no verdict")}</p>'
            f'<p id="share">{e(v.headline())}</p>{why}'
            f'<p id="recommendation">{e(v.recommendation)}</p>'
            + (f'<table id="evidence"><caption class="note">evidence: the mean over the time the verdict held'
               f'</caption>{evidence}</table>' if evidence else ""))
    span = rec.end - rec.started
    verdicts = [plot.Band(s.start - rec.started, s.end - rec.started, COLORS.get(s.cls, "#999"),
                          f"{s.cls}: {units.run_time(s.start - rec.started)}-{units.run_time(s.end - rec.started)}",
                          s.cls) for s in rec.timeline()]
    alerts = [plot.Band(max(0.0, a.fired - rec.started), (a.resolved or rec.end) - rec.started,
                        ALERT_COLORS.get(a.severity, "#ef6c00"), a.text(rec.started), a.name) for a in rec.alerts]
    marks = [(t - rec.started, text) for t, _, text in rec.events]
    present = sorted({s.cls for s in rec.timeline()})
    legend = "".join(f'<span><i style="background:{COLORS.get(c, "#999")}"></i>{e(c)}</span>' for c in present)
    chart = plot.timeline([("verdict", verdicts), ("alerts", alerts)], marks, span)
    return (f'<section class="top"><div><h2>Verdict</h2>{card}</div>'
            f'<div><h2>Timeline</h2>{chart}<div class="legend">{legend}'
            + ('<span><i style="background:#000;width:3px"></i>stall</span>' if marks else "")
            + "</div></div></section>")


def _events_section(rec: RunRecord) -> str:
    e = html.escape
    rows = [(a.fired, "alert", a.text(rec.started)) for a in rec.alerts]
    rows += [(t, kind, text) for t, kind, text in rec.events]
    if not rows:
        return '<p id="events" class="note">No alert fired and no process stalled during this run.</p>'
    body = "".join(f"<tr><td>{e(_when(rec, t))}</td><td>{e(kind)}</td><td>{e(text)}</td></tr>"
                   for t, kind, text in sorted(rows))
    return f'<table id="events"><tr><th>when</th><th>what</th><th></th></tr>{body}</table>'


def _charts_section(rec: RunRecord) -> str:
    span = rec.end - rec.started
    drawn, skipped = [], []
    for c in CHARTS:
        lines = [plot.Line(label, [(t - rec.started, v) for t, v in rec.samples.get(kpi, [])])
                 for kpi, label in c.series]
        if c.title == "Errors" and not any(v > 0 for _, v in rec.samples.get("requests_per_s", [])):
            skipped.append(c.title)
            continue
        if c.title != "Errors" and not any(v > 0 for line in lines for _, v in line.points):
            skipped.append(c.title)
            continue
        drawn.append(f'<section class="plot" data-title="{html.escape(c.title)}"><h3>{html.escape(c.title)}</h3>'
                     f'{plot.chart(lines, c.kind, span)}</section>')
    note = (f'<p class="note">Not measured, or zero throughout this run: {html.escape(", ".join(skipped))}.</p>'
            if skipped else "")
    return f'<div class="charts">{"".join(drawn)}</div>{RATES_NOTE}{note}'


# Where the charts' rates come from (metrics/rate.py), said once under them
RATES_NOTE = ('<p id="rates-window" class="note">Rates (throughput, requests, errors) and the data wait at each sweep '
              "are the job's counters' growth between the hook's publications seen by that sweep and the one before "
              "(one sweep interval, timed by the publishing processes' own clock): a job that stops reads 0 from "
              "the second sweep after.</p>")


def _measured_section(rec: RunRecord) -> str:
    data = rec.summary.get("measured")
    if not isinstance(data, dict):
        return '<p class="note">Not kept for this run (recorded by an older Outrider, or the run was cut short).</p>'
    rows = Measured.from_json(data).rows()
    return "<table id=\"measured\">" + "".join(f"<tr><th>{html.escape(topic)}</th><td>{html.escape(text)}</td></tr>"
                                              for topic, text in rows) + "</table>"


def _profile_section(rec: RunRecord) -> str:
    """The loop's hottest lines (a flame-style table: each line's share of the loop thread's samples, as a bar)."""
    e = html.escape
    data = rec.summary.get("measured")
    profile = Measured.from_json(data).profile if isinstance(data, dict) else None
    if profile is None or not profile.samples:
        return ('<p id="profile" class="note">No stack samples of the loop thread (profile_hz 0, no training loop, '
                'or recorded by an older Outrider).</p>')
    shares = ", ".join(f"{w} {units.percent(v)}" for w, v in profile.shares())
    rows = "".join(
        f'<tr><td><code>{e(frame)}</code></td><td>{e(where)}</td><td>{e(units.percent(n / profile.samples))}</td>'
        f'<td><span style="display:inline-block;height:10px;width:{max(1, round(300 * n / profile.samples))}px;'
        f'background:{WHERE_COLORS.get(where, "#999")}"></span></td></tr>' for where, frame, n in profile.frames)
    return (f'<p id="profile-shares">{e(units.count(profile.samples))} samples: {e(shares)}</p>'
            f'<table id="profile"><tr><th>line (innermost frame of your code)</th><th>where</th><th>samples</th>'
            f'<th></th></tr>{rows}</table>')


def _cost_section(rec: RunRecord) -> str:
    s = rec.summary
    rows: list[tuple[str, str]] = []
    if "wall_s" in s:
        rows.append(("ran for", units.seconds(s["wall_s"])))
    if "cpu_user_s" in s:
        cpu = s["cpu_user_s"] + s.get("cpu_system_s", 0.0)
        avg = f" ({units.cores(cpu / s['wall_s'])} on average)" if s.get("wall_s") else ""
        rows.append(("CPU time", f"user {units.seconds(s['cpu_user_s'])}, system "
                                 f"{units.seconds(s.get('cpu_system_s', 0.0))}{avg}"))
    if "peak_tree_rss_bytes" in s:
        rows.append(("peak memory (RSS)", f"{units.bytes_iec(s['peak_tree_rss_bytes'])} the whole tree, "
                                          f"{units.bytes_iec(s.get('peak_process_rss_bytes', 0))} the largest "
                                          "process"))
    if "read_bytes" in s:
        rows.append(("storage", f"read {units.bytes_iec(s['read_bytes'])}, written "
                                f"{units.bytes_iec(s.get('written_bytes', 0))}"))
    if "max_processes" in s:
        rows.append(("processes", f"up to {s['max_processes']} at once"))
    if s.get("signals_forwarded"):
        rows.append(("signals forwarded", ", ".join(map(str, s["signals_forwarded"]))))
    rows.append(("exit code", str(rec.exit_code) if rec.exit_code is not None else "still running, or cut short"))
    return "<table id=\"cost\">" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                                           for k, v in rows) + "</table>"


def render(rec: RunRecord) -> str:
    e = html.escape
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.started))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Outrider run {e(rec.id)}</title>
<style>{STYLE}</style></head><body>
<h1>Outrider run {e(rec.id)}</h1>
<p class="meta"><code>{e(" ".join(rec.command))}</code> &middot; started {e(started)} &middot; ran
 {e(units.seconds(rec.end - rec.started))} &middot; exit code {e(str(rec.exit_code))}</p>
{_verdict_section(rec)}
<h2>Alerts and events</h2>
{_events_section(rec)}
<h2>What the agent measured</h2>
{_measured_section(rec)}
<h2>KPIs over time</h2>
{_charts_section(rec)}
<h2>What the run cost</h2>
{_cost_section(rec)}
<h2>Where the training loop's time goes</h2>
{_profile_section(rec)}
</body></html>
"""

