"""Prometheus text format 0.0.4 and OpenMetrics 1.0 rendering of a sweep's families.

Written here rather than through prometheus_client: rendering a sweep is the only per-scrape work the agent
does, and building prometheus_client metric objects for it measured 4.5 us per sample against about 1 us for
this direct writer (see benchmarks/). The output is checked by promtool, prometheus_client's parser and a real
Prometheus server in the tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from outrider.metrics.catalog import MetricDef
from outrider.metrics.family import Family, HistogramValue, SampleValue

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def format_value(value: float) -> str:
    if value.is_integer():  # most samples: counters, bytes, counts (False for NaN and the infinities)
        return str(int(value)) if -1e15 < value < 1e15 else repr(value)
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def format_le(bound: float) -> str:
    """A bucket's le label: "1.0", as prometheus_client writes it; "+Inf" for the last."""
    return "+Inf" if bound == math.inf else repr(float(bound))


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_escape(m: re.Match[str]) -> str:
    """A lone surrogate (text decoded from bytes that were not UTF-8: a path, an environment variable) as the
    byte it stood for (\\xe9), or its code point: the exposition must be UTF-8, and one such value must never
    make every scrape fail."""
    code = ord(m.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def escape_label_value(value: str) -> str:
    if not value.isascii():
        value = _SURROGATE.sub(_surrogate_escape, value)
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_block(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """Labels with empty values are left out: Prometheus treats them as absent, and they only cost bytes."""
    pairs = [f'{n}="{escape_label_value(v)}"' for n, v in zip(names, values) if v]
    return "{" + ",".join(pairs) + "}" if pairs else ""


# Sample-line prefixes ("name{labels} ") keyed by name, label names and label values: label sets repeat sweep
# after sweep, so escaping and formatting them once saves most of the rendering. Cleared when it grows past the
# bound. (Label names are part of the key: one metric's label names can differ between collectors' configurations.)
_PREFIXES: dict[tuple[str, tuple[str, ...], tuple[str, ...]], str] = {}
_PREFIX_BOUND = 50_000


def _prefix(name: str, names: tuple[str, ...], values: tuple[str, ...]) -> str:
    key = (name, names, values)
    hit = _PREFIXES.get(key)
    if hit is None:
        if len(_PREFIXES) >= _PREFIX_BOUND:
            _PREFIXES.clear()
        hit = _PREFIXES[key] = f"{name}{_label_block(names, values)} "
    return hit


def render(families: Iterable[Family], openmetrics: bool = False) -> bytes:
    """Render families; one family name appears once (samples of equal names are merged in order)."""
    return Renderer(openmetrics).render(families)


Samples = list[tuple[tuple[str, ...], SampleValue]]


class Renderer:
    """Renders sweep after sweep in one format, keeping each family's text for the next sweep.

    Between two sweeps most families do not change (static facts, idle disks, counters that did not move: 37-42 of
    48 families of a host sweep at 0.5 s). A family whose definition and samples equal last sweep's is not
    rendered again: comparing two short lists of tuples is a fraction of formatting them. A family absent from a
    sweep is forgotten, so the kept text is bounded by one sweep's exposition.
    """

    def __init__(self, openmetrics: bool) -> None:
        self.openmetrics = openmetrics
        self._kept: dict[str, tuple[MetricDef, Samples, str, str]] = {}  # definition, samples, text, its header

    def render(self, families: Iterable[Family]) -> bytes:
        merged: dict[str, Family] = {}
        for fam in families:
            if not fam.samples:
                continue
            seen = merged.get(fam.defn.name)
            if seen is None:
                merged[fam.defn.name] = fam
            else:
                combined = Family(seen.defn)
                combined.samples = seen.samples + fam.samples
                merged[fam.defn.name] = combined
        kept, self._kept = self._kept, {}
        out: list[str] = []
        for name, fam in merged.items():
            last = kept.get(name)
            if last is not None and last[0] is fam.defn:
                header = last[3]  # HELP and TYPE: half the text of most families that changed (one sample)
                text = last[2] if last[1] == fam.samples else header + _samples_text(fam)
            else:
                header = _header(fam.defn, self.openmetrics)
                text = header + _samples_text(fam)
            # a copy: a collector that kept its Family and changed it would otherwise compare equal to itself
            self._kept[name] = (fam.defn, list(fam.samples), text, header)
            out.append(text)
        if self.openmetrics:
            out.append("# EOF\n")
        return "".join(out).encode("utf-8")


def _header(d: MetricDef, openmetrics: bool) -> str:
    head = d.family_name if openmetrics else d.name
    text = f"# HELP {head} {escape_help(d.help)}\n# TYPE {head} {d.type}\n"
    if openmetrics and d.prom_unit:
        text += f"# UNIT {head} {d.prom_unit}\n"
    return text


def _samples_text(fam: Family) -> str:
    d = fam.defn
    out: list[str] = []
    name, names = d.name, d.label_names
    samples = fam.samples
    if len(samples) > 1 and len({values for values, _ in samples}) < len(samples):
        # a duplicate series would make the whole scrape fail: the first of equal label sets wins
        seen: set[tuple[str, ...]] = set()
        first: Samples = []
        for sample in samples:
            if sample[0] not in seen:
                seen.add(sample[0])
                first.append(sample)
        samples = first
    for values, value in samples:
        if isinstance(value, HistogramValue):
            _histogram_lines(out, name, names, values, value)
        else:
            out.append(_prefix(name, names, values) + format_value(value) + "\n")
    return "".join(out)


def _histogram_lines(out: list[str], name: str, names: tuple[str, ...], values: tuple[str, ...],
                     h: HistogramValue) -> None:
    bucket_names = (*names, "le")
    cumulative = h.cumulative()
    for bound, count in zip((*h.bounds, math.inf), cumulative):
        out.append(_prefix(name + "_bucket", bucket_names, (*values, format_le(bound))) + str(count) + "\n")
    out.append(_prefix(name + "_sum", names, values) + format_value(h.sum) + "\n")
    out.append(_prefix(name + "_count", names, values) + str(cumulative[-1]) + "\n")


def wants_openmetrics(accept_header: str | None) -> bool:
    """Content negotiation: OpenMetrics when the client lists it (Prometheus does, preferring it)."""
    if not accept_header:
        return False
    for part in accept_header.split(","):
        media, _, params = part.strip().partition(";")
        if media.strip() == "application/openmetrics-text":
            q = 1.0
            for p in params.split(";"):
                k, _, v = p.strip().partition("=")
                if k == "q":
                    try:
                        q = float(v)
                    except ValueError:
                        q = 0.0
            if q > 0:
                return True
    return False
