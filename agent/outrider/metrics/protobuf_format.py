"""Prometheus's protobuf exposition, read: the inverse of metrics/protobuf_exposition.py. `outrider top` asks the
agent for it so that the percentiles it shows come from the recorded distributions (native histograms: the sketch,
within 1.08%) rather than from classic buckets as coarse as 10 ms to 25 ms.

`parse(page)` gives the page's families (each an io.prometheus.client.MetricFamily message after its varint length):
name, type, help and series; a counter's, gauge's or untyped series' value is a float, a histogram's a
HistogramValue with its classic buckets and, where the native fields hold one, its sketch. `samples(families)` gives
the samples the text format carries for the same families (a histogram's `_bucket`, `_sum` and `_count`), so a
reader of both formats reads them alike.

A native histogram becomes the sketch where one exists of it (Sketch.at_scale): schema 5 as the agent writes it, or a
finer one (up to 8, Prometheus's finest) merged into ours exactly; a zero bucket no wider than ours (MIN_VALUE);
whole counts that add up to the histogram's; no negative buckets. Any other (a coarser schema, a wider zero bucket,
negative values) keeps its classic buckets alone: no resolution is claimed that the page does not carry. Float
histograms (counts as doubles) and summaries are skipped.

Bounded and defensive, for a page from anywhere: a page over MAX_PAGE_BYTES, bytes that are not messages, a length
past the end, and fields that contradict each other (bounds out of order, cumulative counts that go down, more
deltas than the spans hold) raise MalformedPage saying which family; nothing else is raised, and the work is bounded
by the page's bytes (the wire reader, metrics/wire.py, never reads past a message's end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate

from outrider.metrics.exposition import format_le
from outrider.metrics.family import HistogramValue
from outrider.metrics.text_format import ParsedFamily, Sample
from outrider.metrics.wire import (
    I64,
    LEN,
    VARINT,
    WireError,
    fields,
    packed_varints,
    read_double,
    read_varint,
    unzigzag,
)
from outrider.shared.sketch import MIN_VALUE, Sketch

MAX_PAGE_BYTES = 64 << 20  # an agent's page with 10,000 series is a few MiB
TYPES = ("counter", "gauge", "summary", "untyped", "histogram", "gaugehistogram")  # MetricType, by number
MIN_SCHEMA, MAX_SCHEMA = -4, 8  # native histogram schemas, as Prometheus takes them


class MalformedPage(ValueError):
    """A page that is not a protobuf exposition, or says contradictory things."""


@dataclass
class Series:
    labels: dict[str, str]
    value: float | HistogramValue


DecodedFamily = ParsedFamily[Series]  # a family of this format: each histogram whole


def parse(page: bytes) -> list[DecodedFamily]:
    """The families of a delimited protobuf page, in its order; MalformedPage if it is not one."""
    if len(page) > MAX_PAGE_BYTES:
        raise MalformedPage(f"a page of {len(page)} bytes, over {MAX_PAGE_BYTES}")
    out: list[DecodedFamily] = []
    pos, end = 0, len(page)
    while pos < end:
        start = stop = pos
        try:
            length, start = read_varint(page, pos, end)
            stop = start + length
            if stop > end:
                raise WireError(f"its length runs {stop - end} bytes past the end of the page")
            family = _family(page, start, stop)
        except (WireError, UnicodeDecodeError) as e:
            name = _name_of(page, start, min(stop, end))
            raise MalformedPage(f"family {len(out) + 1}{f' ({name})' if name else ''} at byte {pos}: {e}") from None
        out.append(family)
        pos = stop
    return out


def _name_of(page: bytes, pos: int, end: int) -> str:
    """A malformed family's name, for the error, where its first field is a readable one (as the agent writes)."""
    try:
        number, wire, start, stop = next(fields(page, pos, end))
        return _text(page, start, stop)[:200] if number == 1 and wire == LEN else ""
    except (WireError, UnicodeDecodeError, StopIteration):
        return ""


def samples(families: list[DecodedFamily]) -> list[Sample]:
    """The families' samples as the text format writes them (the metrics/text_format.py reader's)."""
    out: list[Sample] = []
    for fam in families:
        for s in fam.samples:
            if not isinstance(s.value, HistogramValue):
                out.append(Sample(fam.name, s.labels, s.value))
                continue
            h = s.value
            for bound, cumulative in zip((*h.bounds, math.inf), h.cumulative()):
                out.append(Sample(fam.name + "_bucket", {**s.labels, "le": format_le(bound)}, float(cumulative)))
            out.append(Sample(fam.name + "_sum", s.labels, h.sum))
            out.append(Sample(fam.name + "_count", s.labels, float(h.count)))
    return out


def _text(page: bytes, start: int, stop: int) -> str:
    return page[start:stop].decode("utf-8")


def _family(page: bytes, pos: int, end: int) -> DecodedFamily:
    fam = DecodedFamily("")
    metrics: list[tuple[int, int]] = []
    for number, wire, value, stop in fields(page, pos, end):
        if number == 1 and wire == LEN:
            fam.name = _text(page, value, stop)
        elif number == 2 and wire == LEN:
            fam.help = _text(page, value, stop)
        elif number == 3 and wire == VARINT:
            if value >= len(TYPES):
                raise WireError(f"metric type {value}")
            fam.type = TYPES[value]
        elif number == 4 and wire == LEN:
            metrics.append((value, stop))  # read once the type is known: it may come after them
    if fam.type == "summary":
        return fam
    for start, stop in metrics:
        series = _metric(page, start, stop, fam.type)
        if series is not None:
            fam.samples.append(series)
    return fam


_VALUE_FIELD = {"counter": 3, "gauge": 2, "untyped": 5}


def _metric(page: bytes, pos: int, end: int, kind: str) -> Series | None:
    labels: dict[str, str] = {}
    value: float | HistogramValue | None = 0.0 if kind in _VALUE_FIELD else None
    want = _VALUE_FIELD.get(kind, 7)
    for number, wire, start, stop in fields(page, pos, end):
        if number == 1 and wire == LEN:
            name, text = _label(page, start, stop)
            if name in labels:
                raise WireError(f"label {name!r} given twice")
            labels[name] = text
        elif number == want and wire == LEN:
            value = _histogram(page, start, stop) if want == 7 else _double_value(page, start, stop)
    if value is None:  # a histogram family's metric without its histogram, or a float histogram
        return None
    return Series(labels, value)


def _label(page: bytes, pos: int, end: int) -> tuple[str, str]:
    name = text = ""
    for number, wire, start, stop in fields(page, pos, end):
        if wire == LEN and number in (1, 2):
            if number == 1:
                name = _text(page, start, stop)
            else:
                text = _text(page, start, stop)
    return name, text


def _double_value(page: bytes, pos: int, end: int) -> float:
    """Counter, Gauge, Untyped: field 1, a double (0 when absent, as protobuf's default)."""
    value = 0.0
    for number, wire, start, _ in fields(page, pos, end):
        if number == 1 and wire == I64:
            value = read_double(page, start)
    return value


def _signed(page: bytes, wire: int, value: int, stop: int) -> list[int]:
    """A repeated sint64 field's values: packed (one LEN field) or not (one varint each)."""
    if wire == VARINT:
        return [unzigzag(value)]
    if wire == LEN:
        return [unzigzag(v) for v in packed_varints(page, value, stop)]
    raise WireError("a bucket delta neither a varint nor packed")


class _Native:
    """A native histogram's fields as they come."""

    def __init__(self) -> None:
        self.seen = False
        self.schema = 0
        self.zero_threshold = 0.0
        self.zero = 0
        self.spans: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # positive? -> (offset, length)
        self.deltas: dict[bool, list[int]] = {True: [], False: []}

    def buckets(self, positive: bool) -> dict[int, int]:
        """{Prometheus bucket index: count} of one side, from its spans and count deltas."""
        spans, deltas = self.spans[positive], self.deltas[positive]
        out: dict[int, int] = {}
        counts = accumulate(deltas)
        index = 0  # the next bucket's index
        taken = 0
        for n, (offset, length) in enumerate(spans):
            index = offset if n == 0 else index + offset
            if length > len(deltas) - taken:
                raise WireError("the spans hold more buckets than there are deltas")
            for _ in range(length):
                count = next(counts)
                if count < 0:
                    raise WireError("a native bucket's count below zero")
                if count:
                    out[index] = count
                index += 1
            taken += length
        if taken != len(deltas):
            raise WireError("more deltas than the spans hold")
        return out


def _histogram(page: bytes, pos: int, end: int) -> HistogramValue | None:
    count, total = 0, 0.0
    classic: list[tuple[float, int]] = []
    native = _Native()
    for number, wire, value, stop in fields(page, pos, end):
        if number == 1 and wire == VARINT:
            count = value
        elif number == 2 and wire == I64:
            total = read_double(page, value)
        elif number == 3 and wire == LEN:
            bucket = _bucket(page, value, stop)
            if bucket is None:
                return None
            classic.append(bucket)
        elif number in (4, 8, 11, 14):
            return None  # a float histogram
        elif number == 5 and wire == VARINT:
            native.seen, native.schema = True, unzigzag(value)
        elif number == 6 and wire == I64:
            native.seen, native.zero_threshold = True, read_double(page, value)
        elif number == 7 and wire == VARINT:
            native.seen, native.zero = True, value
        elif number in (9, 12) and wire == LEN:
            native.seen = True
            native.spans[number == 12].append(_span(page, value, stop))
        elif number in (10, 13):
            native.seen = True
            native.deltas[number == 13].extend(_signed(page, wire, value, stop))
    bounds, counts = _classic(classic, count)
    return HistogramValue(bounds, counts, total, _sketch(native, count) if native.seen else None)


def _bucket(page: bytes, pos: int, end: int) -> tuple[float, int] | None:
    """(upper bound, cumulative count), 0 where absent as protobuf's defaults; None for a float bucket
    (cumulative_count_float)."""
    cumulative, bound = 0, 0.0
    for number, wire, value, _ in fields(page, pos, end):
        if number == 1 and wire == VARINT:
            cumulative = value
        elif number == 2 and wire == I64:
            bound = read_double(page, value)
        elif number == 4:
            return None
    return bound, cumulative


def _span(page: bytes, pos: int, end: int) -> tuple[int, int]:
    offset = length = 0
    for number, wire, value, _ in fields(page, pos, end):
        if number == 1 and wire == VARINT:
            offset = unzigzag(value)
        elif number == 2 and wire == VARINT:
            length = value
    return offset, length


def _classic(buckets: list[tuple[float, int]], count: int) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Bounds and per-bucket counts (the last +Inf's) from cumulative buckets, checked."""
    if buckets and buckets[-1][0] == math.inf:  # an explicit +Inf bucket: the count, as the text format's
        if buckets[-1][1] != count:
            raise WireError("the +Inf bucket is not the histogram's count")
        buckets = buckets[:-1]
    bounds: list[float] = []
    counts: list[int] = []
    below = 0
    for bound, cumulative in buckets:
        if math.isnan(bound) or (bounds and bound <= bounds[-1]) or bound == math.inf:
            raise WireError("classic bucket bounds out of order")
        if cumulative < below:
            raise WireError("classic bucket counts that go down")
        bounds.append(bound)
        counts.append(cumulative - below)
        below = cumulative
    if count < below:
        raise WireError("a histogram's count below its buckets'")
    counts.append(count - below)
    return tuple(bounds), tuple(counts)


def _sketch(native: _Native, count: int) -> Sketch | None:
    """The sketch of a native histogram, or None where none exists of it (the module's docstring)."""
    if not MIN_SCHEMA <= native.schema <= MAX_SCHEMA:
        raise WireError(f"native histogram schema {native.schema}")
    positive = native.buckets(positive=True)
    if native.buckets(positive=False) or not native.zero_threshold <= MIN_VALUE:
        return None  # negative values, or a wider zero bucket: what the sketch would have spread, it cannot say
    # Prometheus's bucket i is OpenTelemetry's (and the sketch's) i - 1
    sketch = Sketch.at_scale(native.schema, native.zero, {i - 1: c for i, c in positive.items()})
    return sketch if sketch is not None and sketch.count == count else None
