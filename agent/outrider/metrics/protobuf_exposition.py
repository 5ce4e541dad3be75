"""Prometheus's protobuf exposition of a sweep's families: each family an io.prometheus.client.MetricFamily message
after its length (a varint), as Prometheus asks for it when native histograms are enabled (content negotiation is
metrics/exposition.negotiate).

The one format that carries native histograms. A histogram family whose every sample has its log-bucketed sketch
(outrider/shared/sketch.py, scale 5 = native histogram schema 5) gets, in each Histogram message, the native fields
(schema 5, the zero bucket's threshold and count, the positive buckets as spans and count deltas) and the classic
buckets, so a Prometheus that keeps classic buckets too (scrape_classic_histograms, 2.45 and later) still has the
`_bucket` series the rule file queries. A family where some sample has no sketch (another library's histogram, an
older hook) is classic only: all its series or none are native, so a metric is one kind of series in Prometheus.

Written by hand (varints and length-delimited fields, metrics/wire.py; client_model's metrics.proto the
reference) rather than through a generated module: the agent needs no protobuf runtime for /metrics, and each
series' label bytes and field prefix are built once and kept, as the text format keeps its line prefixes, so a
render costs what the text one does. Checked by protobuf's own parser and a real Prometheus in the tests; read back
by metrics/protobuf_format.py (`outrider top`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from outrider.metrics.catalog import MetricDef
from outrider.metrics.exposition import KeepingRenderer, remember, unique_samples, utf8_safe
from outrider.metrics.family import Family, HistogramValue
from outrider.metrics.wire import ONE_BYTE, varint, zigzag
from outrider.shared.sketch import MIN_VALUE, SCALE, Sketch

_TYPE = {"counter": 0, "gauge": 1, "histogram": 4}  # MetricType
_VALUE_FIELD = {"counter": b"\x1a\x09\x09", "gauge": b"\x12\x09\x09"}  # Metric.counter/.gauge: {value: double}
_double = struct.Struct("<d").pack
# Buckets of a native histogram's span as close as this are written as one span with zero counts between: two
# zero deltas cost two bytes, a new span four or more
_MAX_GAP = 2


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    return tag + varint(len(payload)) + payload


def _string(tag: bytes, text: str) -> bytes:
    return _field(tag, utf8_safe(text).encode("utf-8"))


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> bytes:
    """Metric.label: a LabelPair per label with a value (an empty one is an absent label, as in the text format)."""
    return b"".join(_field(b"\x0a", _string(b"\x0a", n) + _string(b"\x12", v)) for n, v in zip(names, values) if v)


# Per series, its bytes before the value: for a counter or gauge the whole Metric but its 8 value bytes (its length
# is known beforehand), for a histogram its labels. Label sets repeat sweep after sweep; cleared past the bound.
_PREFIXES: dict[tuple[str, tuple[str, ...], tuple[str, ...]], bytes] = {}
_PREFIX_BOUND = 50_000


def _prefix(kind: str, names: tuple[str, ...], values: tuple[str, ...]) -> bytes:
    key = (kind, names, values)
    hit = _PREFIXES.get(key)
    if hit is not None:
        return hit
    labels = _labels(names, values)
    # a counter's or gauge's MetricFamily.metric: {labels, {value}}: the labels, 3 bytes of value field, 8 of double
    return remember(_PREFIXES, key, labels if kind == "histogram" else
                    b"\x22" + varint(len(labels) + 11) + labels + _VALUE_FIELD[kind], _PREFIX_BOUND)


_BOUNDS: dict[tuple[float, ...], list[bytes]] = {}  # per classic bucket layout: each bound's bytes (Bucket.upper_bound)


def _bound_fields(bounds: tuple[float, ...]) -> list[bytes]:
    hit = _BOUNDS.get(bounds)
    return hit if hit is not None else remember(_BOUNDS, bounds, [b"\x11" + _double(float(b)) for b in bounds], 1_000)


def native_buckets(sketch: Sketch) -> tuple[list[tuple[int, int]], list[int]]:
    """A sketch's positive buckets as native histogram spans (offset, length) and count deltas. Prometheus's bucket
    index is OpenTelemetry's plus one (its bucket i holds (base**(i-1), base**i], OpenTelemetry's (base**i,
    base**(i+1)]); the first span's offset is its first index, each next one's the gap since the previous span."""
    items = sorted(sketch.buckets.items())
    if not items:
        return [], []
    spans: list[tuple[int, int]] = []
    deltas: list[int] = []
    append = deltas.append
    start = previous = items[0][0]
    offset, previous_count = start + 1, 0
    for i, count in items:
        gap = i - previous - 1  # -1 for the first bucket
        if gap > _MAX_GAP:
            spans.append((offset, previous - start + 1))
            offset, start = gap, i
        elif gap > 0:  # empty buckets inside the span
            append(-previous_count)
            if gap == 2:
                append(0)
            previous_count = 0
        append(count - previous_count)
        previous, previous_count = i, count
    spans.append((offset, previous - start + 1))
    return spans, deltas


def _packed_sint64(values: list[int]) -> bytes:
    """Repeated sint64 packed: each zigzagged as a varint (one byte each, for the small deltas of most buckets)."""
    zigzagged = [n << 1 if n >= 0 else ~(n << 1) for n in values]
    return bytes(zigzagged) if max(zigzagged) < 128 else b"".join(map(varint, zigzagged))


_NATIVE_HEAD = b"\x28" + varint(zigzag(SCALE)) + b"\x31" + _double(MIN_VALUE)  # schema, zero_threshold
_NO_OP_SPAN = _field(b"\x62", b"\x08\x00\x10\x00")  # a native histogram with no bucket yet: still not a classic one


def _histogram(h: HistogramValue, native: bool) -> bytes:
    """A Histogram message: sample_count, sample_sum, the classic buckets (cumulative; +Inf is the count, left
    out), and with `native` the sketch as schema-5 buckets."""
    count = h.count
    parts = [b"\x08" + varint(count) + b"\x11" + _double(h.sum)]
    cumulative = 0
    for bound, n in zip(_bound_fields(h.bounds), h.counts):
        cumulative += n
        count_field = varint(cumulative)
        # a Bucket: cumulative_count and upper_bound, 11 to 20 bytes: its length is one byte
        parts.append(b"\x1a" + ONE_BYTE[10 + len(count_field)] + b"\x08" + count_field + bound)
    if native and h.sketch is not None:
        sketch = h.sketch
        parts.append(_NATIVE_HEAD + b"\x38" + varint(sketch.zero))
        spans, deltas = native_buckets(sketch)
        for offset, length in spans:
            zigzagged = zigzag(offset)
            if zigzagged < 128 and length < 128:  # most spans: a small gap and a few buckets, 6 bytes
                parts.append(bytes((0x62, 4, 0x08, zigzagged, 0x10, length)))
            else:
                parts.append(_field(b"\x62", b"\x08" + varint(zigzagged) + b"\x10" + varint(length)))
        if deltas:
            parts.append(_field(b"\x6a", _packed_sint64(deltas)))
        else:
            parts.append(_NO_OP_SPAN)
    return b"".join(parts)


def _family_metrics(fam: Family) -> bytes:
    d = fam.defn
    kind, names = d.type, d.label_names
    samples = unique_samples(fam.samples)
    out: list[bytes] = []
    if kind == "histogram":
        # native for the whole family or none of it; one sample_count serves the classic and the native buckets
        native = all(isinstance(v, HistogramValue) and v.sketched for _, v in samples)
        for values, value in samples:
            if isinstance(value, HistogramValue):
                metric = _prefix(kind, names, values) + _field(b"\x3a", _histogram(value, native))
                out.append(b"\x22" + varint(len(metric)) + metric)
    else:
        for values, value in samples:
            out.append(_prefix(kind, names, values) + _double(value))
    return b"".join(out)


def _header(d: MetricDef) -> bytes:
    """MetricFamily's name, help and type."""
    return _string(b"\x0a", d.name) + _string(b"\x12", d.help) + b"\x18" + varint(_TYPE[d.type])


class ProtobufRenderer(KeepingRenderer[bytes]):
    """Sweep after sweep, each family's message kept while its samples do not change (metrics/exposition.py)."""

    def header(self, d: MetricDef) -> bytes:
        return _header(d)

    def family(self, header: bytes, fam: Family) -> bytes:
        message = header + _family_metrics(fam)
        return varint(len(message)) + message

    def page(self, parts: list[bytes]) -> bytes:
        return b"".join(parts)


def render(families: Iterable[Family]) -> bytes:
    """The families as one protobuf exposition (one message per name, samples of equal names merged in order)."""
    return ProtobufRenderer().render(families)
