"""The HTML run report: KPIs over time as inline SVG plots, the verdict timeline with its evidence and advice,
events (stalls), and the summary. One self-contained file that opens offline (no scripts, no fetched resources)."""

from __future__ import annotations

import html
import time
from collections.abc import Sequence

from outrider.diagnosis.bottleneck import RECOMMENDATIONS
from outrider.runs.store import RunRecord

COLORS = {"idle": "#9e9e9e", "throttled": "#e65100", "memory_pressure": "#c62828", "input_bound": "#6a1b9a",
          "memory_bandwidth_bound": "#283593", "compute_bound": "#2e7d32", "host_bound": "#f9a825",
          "communication_bound": "#00838f", "balanced": "#607d8b"}
PLOTS = [  # (title, [(kpi, label, scale)], unit)
    ("Step time", [("step_time_s", "mean", 1000), ("step_p99_s", "p99", 1000)], "ms"),
    ("Throughput", [("samples_per_s", "samples/s", 1)], "samples/s"),
    ("GPU utilisation and memory", [("gpu_util", "utilisation", 100), ("gpu_mem_ratio", "memory used", 100)], "%"),
    ("Data wait", [("data_wait_fraction", "share of the loop", 100)], "%"),
    ("CPU", [("process_cpu_cores", "job (cores)", 1), ("host_cpu_util", "host (fraction)", 1)], ""),
    ("Request latency", [("latency_p50_s", "p50", 1000), ("latency_p99_s", "p99", 1000)], "ms"),
]
LINE_COLORS = ("#1565c0", "#ef6c00")


def dominant_verdict(rec: RunRecord) -> str | None:
    """The class that held longest (each verdict lasts until the next, the last until the run ended)."""
    if not rec.verdicts:
        return None
    end = rec.ended or (rec.verdicts[-1][0] + 1)
    held: dict[str, float] = {}
    for i, (t, cls, _, _) in enumerate(rec.verdicts):
        until = rec.verdicts[i + 1][0] if i + 1 < len(rec.verdicts) else end
        if cls != "idle":
            held[cls] = held.get(cls, 0.0) + max(0.0, until - t)
    return max(held, key=lambda k: held[k]) if held else rec.verdicts[-1][1]


def _svg_plot(rec: RunRecord, series: Sequence[tuple[str, str, float]], unit: str, t0: float, t1: float) -> str:
    w, h, pad = 640, 180, 40
    lines = [(label, [(t, v * scale) for t, v in rec.samples.get(kpi, [])]) for kpi, label, scale in series]
    lines = [(label, pts) for label, pts in lines if pts]
    if not lines:
        return '<p class="none">no data</p>'
    ymax = max(v for _, pts in lines for _, v in pts) or 1.0
    span = max(t1 - t0, 1e-9)

    def xy(t: float, v: float) -> str:
        return f"{pad + (w - 2 * pad) * (t - t0) / span:.1f},{h - pad / 2 - (h - pad) * v / (ymax * 1.1):.1f}"

    parts = [f'<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img">',
             f'<line x1="{pad}" y1="{h - pad / 2}" x2="{w - pad}" y2="{h - pad / 2}" stroke="#999"/>',
             f'<text x="2" y="14" font-size="11">{ymax:.3g} {html.escape(unit)}</text>',
             f'<text x="{w - pad}" y="{h - 4}" font-size="11" text-anchor="end">{t1 - t0:.0f} s</text>']
    for (_label, pts), color in zip(lines, LINE_COLORS):
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                     f'points="{" ".join(xy(t, v) for t, v in pts)}"/>')
    legend = " ".join(f'<span style="color:{c}">&#9632; {html.escape(label)}</span>'
                      for (label, _), c in zip(lines, LINE_COLORS))
    return "".join(parts) + "</svg><div class=legend>" + legend + "</div>"


def _timeline(rec: RunRecord, t0: float, t1: float) -> str:
    w, h = 640, 28
    span = max(t1 - t0, 1e-9)
    parts = [f'<svg viewBox="0 0 {w} {h + 14}" width="{w}" height="{h + 14}" role="img">']
    for i, (t, cls, _, _) in enumerate(rec.verdicts):
        until = rec.verdicts[i + 1][0] if i + 1 < len(rec.verdicts) else t1
        x, x2 = w * (t - t0) / span, w * (until - t0) / span
        parts.append(f'<rect x="{x:.1f}" y="0" width="{max(1.0, x2 - x):.1f}" height="{h}" '
                     f'fill="{COLORS.get(cls, "#999")}"><title>{html.escape(cls)}</title></rect>')
    for t, _kind, text in rec.events:
        x = w * (t - t0) / span
        parts.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{h + 10}" stroke="#000" stroke-width="2">'
                     f'<title>{html.escape(text)}</title></line>')
    return "".join(parts) + "</svg>"


def render(rec: RunRecord) -> str:
    t0 = rec.started
    t1 = rec.ended or max([t for pts in rec.samples.values() for t, _ in pts] + [t0 + 1])
    verdict = dominant_verdict(rec)
    e = html.escape
    summary = rec.summary or {}
    rows = "".join(f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in summary.items()
                   if k in ("exit_code", "wall_s", "cpu_user_s", "cpu_system_s", "peak_tree_rss_bytes",
                            "read_bytes", "written_bytes", "max_processes"))
    evidence = ""
    if rec.verdicts:
        last = next((v for v in reversed(rec.verdicts) if v[1] == verdict), rec.verdicts[-1])
        evidence = "".join(f"<tr><th>{e(k)}</th><td>{v:g}</td></tr>" for k, v in sorted(last[3].items()))
        evidence = f"<p>{e(last[2])}</p><table>{evidence}</table>"
    legend = " ".join(f'<span style="color:{c}">&#9632; {e(k)}</span>' for k, c in COLORS.items())
    events = "".join(f"<li>{time.strftime('%H:%M:%S', time.localtime(t))} {e(text)}</li>" for t, _, text in rec.events)
    plots = "".join(f"<section><h3>{e(title)}</h3>{_svg_plot(rec, series, unit, t0, t1)}</section>"
                    for title, series, unit in PLOTS)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Outrider run {e(rec.id)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; max-width: 60em; }}
table {{ border-collapse: collapse; }} th, td {{ text-align: left; padding: 2px 10px; border-bottom: 1px solid #eee; }}
.verdict {{ font-size: 1.6em; padding: 0.4em 0.8em; color: #fff; display: inline-block; border-radius: 4px; }}
.legend, .none {{ font-size: 0.85em; color: #555; }} section {{ margin-bottom: 1.2em; }}
</style></head><body>
<h1>Outrider run {e(rec.id)}</h1>
<p><code>{e(" ".join(rec.command))}</code> &middot; started {e(time.strftime("%Y-%m-%d %H:%M:%S",
                                                                                time.localtime(t0)))}
 &middot; {t1 - t0:.0f} s &middot; exit code {e(str(rec.exit_code))}</p>
<h2>Verdict</h2>
<p id="verdict" class="verdict" style="background:{COLORS.get(verdict or "", "#999")}">{e(verdict or "no verdict")}</p>
<p id="recommendation">{e(RECOMMENDATIONS.get(verdict or "", ""))}</p>
{evidence}
<h2>Verdict and alert timeline</h2>
{_timeline(rec, t0, t1)}<div class=legend>{legend}</div>
<ul id="events">{events or "<li>no stall or alert</li>"}</ul>
<h2>KPIs over time</h2>
{plots}
<h2>Summary</h2>
<table>{rows}</table>
</body></html>
"""
