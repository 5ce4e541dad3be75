"""Inline SVG for the run report: line charts with axes, ticks, gridlines and units, and the verdict timeline.

Plain SVG text, no script and nothing fetched, so the report opens offline and prints. The x axis is run time
(m:ss from the run's start); the y axis starts at zero (every KPI is a non-negative amount) and is labelled in the
unit that reads best for the data's range (ms or s, MiB or GiB, %), with ticks at 1, 2, 2.5 or 5 times a power
of ten.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from outrider.metrics import units

LINE_COLORS = ("#1565c0", "#ef6c00", "#6d4c41")
GRID, AXIS, INK = "#e6e6e6", "#777777", "#333333"
TIME_STEPS = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


@dataclass(frozen=True)
class Line:
    label: str
    points: Sequence[tuple[float, float]]  # (seconds since the run started, value in base units)


@dataclass(frozen=True)
class Frame:
    """Where a chart's data area sits in its SVG, and the ranges it maps."""

    left: float
    top: float
    width: float
    height: float
    x_max: float
    y_max: float

    def x(self, t: float) -> float:
        return self.left + self.width * min(max(t, 0.0), self.x_max) / self.x_max

    def y(self, v: float) -> float:
        return self.top + self.height * (1 - min(max(v, 0.0), self.y_max) / self.y_max)


def display_unit(kind: str, top: float) -> tuple[str, float]:
    """(unit label, factor from base units) for an axis whose largest value is `top` (base units)."""
    if kind == "seconds":
        if top < 1e-3:
            return "µs", 1e6
        return ("ms", 1e3) if top < 1 else ("s", 1.0)
    if kind == "bytes":
        divisor, unit = units.iec_scale(top)
        return unit, 1 / divisor
    if kind == "ratio":
        return "%", 100.0
    if kind.startswith("rate:"):
        return f"{kind[5:]}/s", 1.0
    return kind, 1.0


def nice_step(span: float, most: int = 5) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that cuts span into at most `most` steps."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / most
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * magnitude >= raw * (1 - 1e-9):
            return m * magnitude
    return 10 * magnitude


def _decimals(step: float) -> int:
    for d in range(0, 7):
        if abs(round(step, d) - step) < step * 1e-6:
            return d
    return 6


def ticks(top: float, most: int = 5) -> tuple[list[float], float, int]:
    """(tick values from 0, the axis maximum, decimals their labels need) for data up to `top` (display units)."""
    step = nice_step(top if top > 0 else 1.0, most)
    n = max(1, math.ceil(top / step - 1e-9)) if top > 0 else most
    return [i * step for i in range(n + 1)], n * step, _decimals(step)


def time_ticks(span_s: float, most: int = 8) -> list[float]:
    step = next((s for s in TIME_STEPS if span_s / s <= most), TIME_STEPS[-1])
    return [i * step for i in range(int(span_s // step) + 1)]


def _x_axis(f: Frame, parts: list[str]) -> None:
    bottom = f.top + f.height
    for t in time_ticks(f.x_max):
        x = f.x(t)
        parts.append(f'<line class="grid" x1="{x:.1f}" y1="{f.top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" '
                     f'stroke="{GRID}" shape-rendering="crispEdges"/>')
        parts.append(f'<line class="tick x" x1="{x:.1f}" y1="{bottom:.1f}" x2="{x:.1f}" y2="{bottom + 4:.1f}" '
                     f'stroke="{AXIS}" shape-rendering="crispEdges"/>')
        parts.append(f'<text class="tick-label x" x="{x:.1f}" y="{bottom + 16:.1f}" text-anchor="middle">'
                     f'{units.run_time(t)}</text>')
    parts.append(f'<line class="axis x" x1="{f.left:.1f}" y1="{bottom:.1f}" x2="{f.left + f.width:.1f}" '
                 f'y2="{bottom:.1f}" stroke="{AXIS}" shape-rendering="crispEdges"/>')


def chart(lines: Sequence[Line], kind: str, x_max: float, width: int = 540, height: int = 210) -> str:
    """A line chart of `lines` (values in base units, of one kind: seconds, bytes, ratio, rate:WHAT, cores)."""
    drawn = [line for line in lines if line.points]
    top = max((v for line in drawn for _, v in line.points), default=0.0)
    unit, factor = display_unit(kind, top)
    values, y_max, decimals = ticks(top * factor)
    labels = [f"{v:,.{decimals}f}" for v in values]
    left = 30 + 7 * max(len(text) for text in labels)  # room for the widest tick label and the axis title
    f = Frame(left=left, top=12, width=width - left - 14, height=height - 12 - 42, x_max=max(x_max, 1e-9),
              y_max=y_max / factor)
    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'font-size="11" fill="{INK}">']
    for v, text in zip(values, labels):
        y = f.y(v / factor)
        parts.append(f'<line class="grid" x1="{f.left:.1f}" y1="{y:.1f}" x2="{f.left + f.width:.1f}" y2="{y:.1f}" '
                     f'stroke="{GRID}" shape-rendering="crispEdges"/>')
        parts.append(f'<line class="tick y" x1="{f.left - 4:.1f}" y1="{y:.1f}" x2="{f.left:.1f}" y2="{y:.1f}" '
                     f'stroke="{AXIS}" shape-rendering="crispEdges"/>')
        parts.append(f'<text class="tick-label y" x="{f.left - 7:.1f}" y="{y + 4:.1f}" text-anchor="end">'
                     f'{text}</text>')
    _x_axis(f, parts)
    parts.append(f'<line class="axis y" x1="{f.left:.1f}" y1="{f.top:.1f}" x2="{f.left:.1f}" '
                 f'y2="{f.top + f.height:.1f}" stroke="{AXIS}" shape-rendering="crispEdges"/>')  # over the grid
    mid = f.top + f.height / 2
    parts.append(f'<text class="axis-title y" x="14" y="{mid:.1f}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {mid:.1f})">{html.escape(unit)}</text>')
    parts.append(f'<text class="axis-title x" x="{f.left + f.width / 2:.1f}" y="{height - 4}" '
                 f'text-anchor="middle">run time (m:ss)</text>')
    for line, color in reversed(list(zip(drawn, LINE_COLORS))):  # the first series is drawn last, on top
        pts = [(f.x(t), f.y(v)) for t, v in line.points]
        label = html.escape(line.label)
        if len(pts) == 1:
            parts.append(f'<circle class="series" data-series="{label}" cx="{pts[0][0]:.1f}" cy="{pts[0][1]:.1f}" '
                         f'r="3" fill="{color}"/>')
        else:
            parts.append(f'<polyline class="series" data-series="{label}" fill="none" stroke="{color}" '
                         f'stroke-width="2" stroke-linejoin="round" '
                         f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in pts)}"/>')
    parts.append("</svg>")
    legend = "".join(f'<span><i style="background:{c}"></i>{html.escape(line.label)}</span>'
                     for line, c in zip(drawn, LINE_COLORS))
    return "".join(parts) + f'<div class="legend">{legend}</div>'


@dataclass(frozen=True)
class Band:
    start: float  # seconds since the run started
    end: float
    color: str
    title: str  # the tooltip
    label: str = ""  # drawn inside the band where it fits


def timeline(rows: Sequence[tuple[str, Sequence[Band]]], marks: Sequence[tuple[float, str]], x_max: float,
             width: int = 620) -> str:
    """Rows of coloured bands on one run-time axis (the verdict, the alerts), with event marks (stalls) across."""
    row_h, gap = 26, 8
    height = 12 + len(rows) * (row_h + gap) + 34
    f = Frame(left=70, top=12, width=width - 70 - 14, height=len(rows) * (row_h + gap) - gap, x_max=max(x_max, 1e-9),
              y_max=1.0)
    parts = [f'<svg class="timeline" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'font-size="11" fill="{INK}">']
    _x_axis(f, parts)
    for i, (name, bands) in enumerate(rows):
        y = f.top + i * (row_h + gap)
        parts.append(f'<text class="row-label" x="{f.left - 8}" y="{y + row_h / 2 + 4:.1f}" text-anchor="end">'
                     f'{html.escape(name)}</text>')
        if not bands:
            parts.append(f'<text class="none" x="{f.left + 6}" y="{y + row_h / 2 + 4:.1f}" fill="#888">none</text>')
        for b in bands:
            x1, x2 = f.x(b.start), f.x(b.end)
            w = max(2.0, x2 - x1)
            parts.append(f'<rect class="band" x="{x1:.1f}" y="{y:.1f}" width="{w:.1f}" height="{row_h}" '
                         f'fill="{b.color}"><title>{html.escape(b.title)}</title></rect>')
            if b.label and w > 7 * len(b.label):
                parts.append(f'<text x="{x1 + 4:.1f}" y="{y + row_h / 2 + 4:.1f}" fill="#fff">'
                             f'{html.escape(b.label)}</text>')
    for t, text in marks:
        x = f.x(t)
        parts.append(f'<line class="mark" x1="{x:.1f}" y1="{f.top - 6:.1f}" x2="{x:.1f}" '
                     f'y2="{f.top + f.height + 2:.1f}" stroke="#000" stroke-width="2">'
                     f'<title>{html.escape(text)}</title></line>')
    parts.append(f'<text class="axis-title x" x="{f.left + f.width / 2:.1f}" y="{height - 4}" '
                 f'text-anchor="middle">run time (m:ss)</text></svg>')
    return "".join(parts)
