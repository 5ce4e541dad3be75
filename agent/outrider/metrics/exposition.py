"""Prometheus text format 0.0.4 and OpenMetrics 1.0 rendering of a sweep's families, the renderer that keeps each
family's rendering between sweeps (for these and the protobuf format of metrics/protobuf_exposition.py), and the
content negotiation between the three formats.

Written here rather than through prometheus_client: rendering a sweep is the only per-scrape work the agent
does, and building prometheus_client metric objects for it measured 4.5 us per sample against about 1 us for
this direct writer (see benchmarks/). The output is checked by promtool, prometheus_client's parser and a real
Prometheus server in the tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Generic, Literal, TypeVar

from outrider.metrics.catalog import MetricDef
from outrider.metrics.family import Family, HistogramValue, SampleValue

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
# Prometheus's protobuf exposition (io.prometheus.client.MetricFamily messages, each after its varint length): the
# one format that carries native histograms, which Prometheus asks for first when they are enabled
PROTOBUF_MEDIA_TYPE = "application/vnd.google.protobuf"
PROTOBUF_CONTENT_TYPE = f"{PROTOBUF_MEDIA_TYPE}; proto=io.prometheus.client.MetricFamily; encoding=delimited"
Format = Literal["text", "openmetrics", "protobuf"]
CONTENT_TYPES: dict[Format, str] = {"text": TEXT_CONTENT_TYPE, "openmetrics": OPENMETRICS_CONTENT_TYPE,
                                    "protobuf": PROTOBUF_CONTENT_TYPE}


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


def utf8_safe(value: str) -> str:
    """The text with each lone surrogate written as the byte or code point it stood for: encodable as UTF-8."""
    return _SURROGATE.sub(_surrogate_escape, value) if not value.isascii() else value


def escape_label_value(value: str) -> str:
    value = utf8_safe(value)
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
    return hit if hit is not None else remember(_PREFIXES, key, f"{name}{_label_block(names, values)} ")


K = TypeVar("K")
V = TypeVar("V")


def remember(cache: dict[K, V], key: K, value: V, bound: int = _PREFIX_BOUND) -> V:
    """value, kept in cache under key; a cache at its bound is cleared first (what is asked again is made again)."""
    if len(cache) >= bound:
        cache.clear()
    cache[key] = value
    return value


def render(families: Iterable[Family], openmetrics: bool = False) -> bytes:
    """Render families; one family name appears once (samples of equal names are merged in order)."""
    return Renderer(openmetrics).render(families)


Samples = list[tuple[tuple[str, ...], SampleValue]]
Part = TypeVar("Part", str, bytes)


def by_name(families: Iterable[Family]) -> dict[str, Family]:
    """The families with samples, one per name in order of first appearance (samples of equal names merged in
    order): a name appears once in an exposition."""
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
    return merged


def unique_samples(samples: Samples) -> Samples:
    """The samples, the first of equal label sets only: a duplicate series would make the whole scrape fail."""
    if len(samples) > 1 and len({values for values, _ in samples}) < len(samples):
        seen: set[tuple[str, ...]] = set()
        first: Samples = []
        for sample in samples:
            if sample[0] not in seen:
                seen.add(sample[0])
                first.append(sample)
        return first
    return samples


class KeepingRenderer(Generic[Part]):
    """Renders sweep after sweep in one format, keeping each family's rendering for the next sweep.

    Between two sweeps most families do not change (static facts, idle disks, counters that did not move: 37-42 of
    48 families of a host sweep at 0.5 s). A family whose definition and samples equal last sweep's is not
    rendered again: comparing two short lists of tuples is a fraction of formatting them. A family absent from a
    sweep is forgotten, so what is kept is bounded by one sweep's exposition. A format gives its family header
    (rendered once per definition), a family's rendering under that header, and the page of the families.
    """

    def __init__(self) -> None:
        self._kept: dict[str, tuple[MetricDef, Samples, Part, Part]] = {}  # definition, samples, rendering, header

    def render(self, families: Iterable[Family]) -> bytes:
        kept, self._kept = self._kept, {}
        out: list[Part] = []
        for name, fam in by_name(families).items():
            last = kept.get(name)
            if last is not None and last[0] is fam.defn:
                header = last[3]  # HELP and TYPE: half the text of most families that changed (one sample)
                text = last[2] if last[1] == fam.samples else self.family(header, fam)
            else:
                header = self.header(fam.defn)
                text = self.family(header, fam)
            # a copy: a collector that kept its Family and changed it would otherwise compare equal to itself
            self._kept[name] = (fam.defn, list(fam.samples), text, header)
            out.append(text)
        return self.page(out)

    def header(self, d: MetricDef) -> Part:
        raise NotImplementedError

    def family(self, header: Part, fam: Family) -> Part:
        raise NotImplementedError

    def page(self, parts: list[Part]) -> bytes:
        raise NotImplementedError


class Renderer(KeepingRenderer[str]):
    """The text formats: Prometheus text 0.0.4, or OpenMetrics 1.0."""

    def __init__(self, openmetrics: bool) -> None:
        super().__init__()
        self.openmetrics = openmetrics

    def header(self, d: MetricDef) -> str:
        return _header(d, self.openmetrics)

    def family(self, header: str, fam: Family) -> str:
        return header + _samples_text(fam)

    def page(self, parts: list[str]) -> bytes:
        if self.openmetrics:
            parts.append("# EOF\n")
        return "".join(parts).encode("utf-8")


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
    for values, value in unique_samples(fam.samples):
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


def _media_ranges(accept_header: str | None) -> list[tuple[str, dict[str, str], float]]:
    """An Accept header's media ranges: (type, parameters but q, q); a q that is no number refuses (0)."""
    out = []
    for part in (accept_header or "").split(","):
        media, _, params = part.strip().partition(";")
        q, named = 1.0, {}
        for p in params.split(";"):
            k, _, v = p.strip().partition("=")
            if k == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
            elif k:
                named[k] = v.strip()
        out.append((media.strip(), named, q))
    return out


def wants_openmetrics(accept_header: str | None) -> bool:
    """OpenMetrics when the client lists it (Prometheus does, preferring it)."""
    return any(media == "application/openmetrics-text" and q > 0 for media, _, q in _media_ranges(accept_header))


def negotiate(accept_header: str | None, protobuf: bool = True) -> Format:
    """Content negotiation: the protobuf exposition when the client lists it (delimited MetricFamily messages) and
    ranks it no lower than OpenMetrics, as Prometheus does with native histograms enabled (and `protobuf` allows
    it); else OpenMetrics when the client lists it; else the text format."""
    ranges = _media_ranges(accept_header)
    om = max((q for media, _, q in ranges if media == "application/openmetrics-text"), default=0.0)
    if protobuf:
        pb = max((q for media, params, q in ranges if media == PROTOBUF_MEDIA_TYPE
                  and params.get("proto") == "io.prometheus.client.MetricFamily"
                  and params.get("encoding") == "delimited"), default=0.0)
        if pb > 0 and pb >= om:
            return "protobuf"
    return "openmetrics" if om > 0 else "text"
