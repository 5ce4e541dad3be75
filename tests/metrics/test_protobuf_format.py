"""The protobuf exposition read back (metrics/protobuf_format.py): a page reads as it was written, histograms and
their sketches bucket by bucket, and as the text format of the same sweep reads; what protobuf's own encoder writes
and ours never does (unpacked deltas, an explicit +Inf bucket, finer and coarser schemas, fields out of order, unknown
fields) is read too; and a page cut short, garbled, or claiming huge lengths is a MalformedPage, never another error
and never a long one."""

from __future__ import annotations

import contextlib
import math
import random
from bisect import bisect_left

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outrider.metrics import text_format
from outrider.metrics.exposition import render as render_text
from outrider.metrics.family import Family, HistogramValue
from outrider.metrics.protobuf_exposition import render
from outrider.metrics.protobuf_format import MAX_PAGE_BYTES, MalformedPage, parse, samples
from outrider.metrics.wire import varint, zigzag
from outrider.shared.sketch import MAX_INDEX, MIN_VALUE, Sketch
from tests.metrics.test_renderer import sweep
from tests.prometheus_model import HISTOGRAM, MetricFamily

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REQUEST_LABELS = ("/x", "GET", "http", "200", "2xx", "0", "job")
LATENCY = "outrider_request_duration_seconds"


def histogram(values: list[float], sketched: bool = True) -> HistogramValue:
    counts = [0] * (len(BOUNDS) + 1)
    for v in values:
        counts[bisect_left(BOUNDS, v)] += 1
    return HistogramValue(BOUNDS, tuple(counts), sum(values), Sketch.of_values(values) if sketched else None)


def sweeps(n: int) -> list[list[Family]]:
    """Sweeps of every kind of family: the renderer tests' (names repeated, series duplicated, NaN and infinities),
    sketched and unsketched histograms, labels empty, non-ASCII and with a lone surrogate."""
    rng = random.Random(11)
    out = []
    for i in range(n):
        fams = sweep(rng, Family("outrider_agent_sweeps_total").add(i))
        values = [rng.lognormvariate(-3, 1.5) for _ in range(rng.randint(0, 300))] + [0.0] * rng.randint(0, 2)
        latency = Family(LATENCY).add(histogram(values, sketched=rng.random() < 0.8), *REQUEST_LABELS)
        latency.add(histogram(values[:7], sketched=rng.random() < 0.9), "/ünï", "", "http", "200", "2xx", "0", "x")
        fams.append(latency)
        fams.append(Family("outrider_process_cpu_seconds_total").add(rng.random(), "1", "x\udce9", "user"))
        out.append(fams)
    return out


def keyed(page: list[text_format.Sample]) -> list[tuple[str, tuple[tuple[str, str], ...], str]]:
    """Samples comparable across formats: the text format writes -0.0 as 0 (+ 0.0 makes it so), NaN as NaN."""
    return sorted((s.name, tuple(sorted(s.labels.items())), repr(s.value + 0.0)) for s in page)


def test_a_page_reads_as_it_was_written_and_as_the_text_format_of_the_same_sweep_reads() -> None:
    sketched_seen = 0
    for fams in sweeps(150):
        families = parse(render(fams))
        text = text_format.parse(render_text(fams).decode())
        assert not text.errors
        assert keyed(samples(families)) == keyed(text.samples)
        assert [f.name for f in families] == list(dict.fromkeys(f.defn.name for f in fams if f.samples))
        (latency,) = [f for f in families if f.name == LATENCY]
        names = Family(LATENCY).defn.label_names
        written: dict[tuple[tuple[str, str], ...], object] = {}
        for f in fams:  # families of one name merged, the first of a label set kept (the renderers' rule)
            for values, h in f.samples if f.defn.name == LATENCY else ():
                written.setdefault(tuple(sorted((n, v) for n, v in zip(names, values) if v)), h)
        native = all(isinstance(v, HistogramValue) and v.sketched for v in written.values())
        assert len(latency.samples) == len(written)
        for series in latency.samples:
            value = written[tuple(sorted(series.labels.items()))]
            assert isinstance(value, HistogramValue)
            # the whole value, the sketch bucket by bucket, where the family was written native
            assert series.value == (value if native else HistogramValue(value.bounds, value.counts, value.sum))
            sketched_seen += native
    assert sketched_seen > 50, "native families were read back, not only classic ones"


def test_types_help_and_labels_read_back() -> None:
    fams = [Family("outrider_host_cpu_seconds_total").add(12.5, "user"),
            Family("outrider_collector_success").add(1, "host").add(0, "gpu")]
    cpu, success = parse(render(fams))
    assert (cpu.name, cpu.type, cpu.help) == ("outrider_host_cpu_seconds_total", "counter", fams[0].defn.help)
    assert [(s.labels, s.value) for s in cpu.samples] == [({"mode": "user"}, 12.5)]
    assert success.type == "gauge"
    assert [(s.labels, s.value) for s in success.samples] == [({"collector": "host"}, 1.0), ({"collector": "gpu"}, 0.0)]


def index_at(value: float, scale: int) -> int:
    """The exponential bucket of a value at a scale, (2**(i/2**scale), 2**((i+1)/2**scale)], checked at its bounds."""
    i = math.ceil(math.log2(value) * 2**scale) - 1
    while value <= 2 ** ((i) / 2**scale):
        i -= 1
    while value > 2 ** ((i + 1) / 2**scale):
        i += 1
    return i


def native(values: list[float], schema: int, zero_threshold: float = MIN_VALUE, zeros: int = 0) -> object:
    """A Histogram message as another client writes one: the values bucketed at `schema`, each bucket a span of its
    own (so the offsets are gaps), the deltas unpacked (proto2's default for our model), no classic buckets."""
    m = MetricFamily(name="latency_seconds", type=HISTOGRAM)
    h = m.metric.add().histogram
    h.sample_count, h.sample_sum, h.schema, h.zero_threshold, h.zero_count = \
        len(values) + zeros, sum(values), schema, zero_threshold, zeros
    counts: dict[int, int] = {}
    for v in values:
        i = index_at(v, schema) + 1  # Prometheus's index
        counts[i] = counts.get(i, 0) + 1
    previous_end, previous = None, 0
    for i in sorted(counts):
        span = h.positive_span.add()
        span.offset, span.length = (i if previous_end is None else i - previous_end), 1
        h.positive_delta.append(counts[i] - previous)
        previous_end, previous = i + 1, counts[i]
    return m


def delimited(*messages: object) -> bytes:
    out = b""
    for m in messages:
        body = m.SerializeToString()  # type: ignore[attr-defined]
        out += varint(len(body)) + body
    return out


def test_a_finer_schema_is_the_sketch_exactly_and_a_coarser_one_is_not_claimed() -> None:
    rng = random.Random(3)
    values = [rng.lognormvariate(-4, 1.0) for _ in range(2000)]
    (fine,) = parse(delimited(native(values, 8, zeros=3)))
    h = fine.samples[0].value
    assert isinstance(h, HistogramValue)
    assert h.sketch == Sketch.of_values(values + [0.0] * 3), "schema 8 merged into scale 5 bucket by bucket"
    assert (h.bounds, h.counts) == ((), (len(values) + 3,)), "no classic buckets: the count alone"
    for schema in (4, 0, -4):
        (coarse,) = parse(delimited(native(values, schema)))
        assert isinstance(coarse.samples[0].value, HistogramValue) and coarse.samples[0].value.sketch is None, schema
    (wide_zero,) = parse(delimited(native(values, 5, zero_threshold=1e-3)))
    assert isinstance(wide_zero.samples[0].value, HistogramValue) and wide_zero.samples[0].value.sketch is None


def test_negative_buckets_float_histograms_and_summaries_are_not_read_as_sketches() -> None:
    negative = native([0.1, 0.2], 5)
    h = negative.metric[0].histogram  # type: ignore[attr-defined]
    h.sample_count += 1
    h.negative_span.add(offset=3, length=1)
    h.negative_delta.append(1)
    floats = MetricFamily(name="rates", type=HISTOGRAM)
    floats.metric.add().histogram.sample_count_float = 2.5
    summary = MetricFamily(name="rpc_seconds", type=2)
    summary.metric.add()
    got_negative, got_floats, got_summary = parse(delimited(negative, floats, summary))
    value = got_negative.samples[0].value
    assert isinstance(value, HistogramValue) and value.sketch is None and value.count == 3
    assert got_floats.samples == [] and got_summary.samples == []


def test_an_explicit_inf_bucket_unknown_fields_and_a_type_after_the_metrics_are_read() -> None:
    m = MetricFamily(name="sizes", type=HISTOGRAM)
    h = m.metric.add().histogram
    h.sample_count, h.sample_sum = 5, 9.0
    for bound, cumulative in ((1.0, 2), (4.0, 4), (math.inf, 5)):
        b = h.bucket.add()
        b.upper_bound, b.cumulative_count = bound, cumulative
    metrics_first = MetricFamily(metric=m.metric).SerializeToString() + MetricFamily(
        name="sizes", type=HISTOGRAM).SerializeToString()  # two messages concatenated: one, merged
    unknown = varint(99 << 3) + varint(7)  # field 99, a varint
    page = varint(len(metrics_first) + len(unknown)) + metrics_first + unknown
    untyped = MetricFamily(name="legacy", type=3)
    untyped.metric.add().untyped.value = 4.5
    sizes, legacy = parse(page + delimited(untyped))
    assert sizes.type == "histogram"
    assert sizes.samples[0].value == HistogramValue((1.0, 4.0), (2, 2, 1), 9.0)
    assert (legacy.type, legacy.samples[0].value) == ("untyped", 4.5)


def valid_page() -> bytes:
    rng = random.Random(8)
    values = [rng.lognormvariate(-3, 1) for _ in range(200)]
    return render([Family("outrider_host_cpu_seconds_total").add(1.5, "user"),
                   Family(LATENCY).add(histogram(values), *REQUEST_LABELS),
                   Family("outrider_collector_success").add(1, "host")])


def test_every_cut_of_a_page_is_malformed_unless_it_falls_between_families() -> None:
    page = valid_page()
    boundaries, pos = {0}, 0
    while pos < len(page):  # where each family ends
        length, size = 0, 0
        while True:
            b = page[pos + size]
            length |= (b & 0x7F) << (7 * size)
            size += 1
            if b < 0x80:
                break
        pos += size + length
        boundaries.add(pos)
    whole = parse(page)
    for cut in range(len(page)):
        if cut in boundaries:
            assert len(parse(page[:cut])) == sorted(boundaries).index(cut)
            continue
        with pytest.raises(MalformedPage, match=r"family \d"):
            parse(page[:cut])
    assert len(whole) == 3


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_garbled_pages_are_malformed_or_read_never_anything_else(data: st.DataObject) -> None:
    page = bytearray(valid_page())
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(page) - 1))
        how = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if how == "flip":
            page[pos] = data.draw(st.integers(0, 255))
        elif how == "insert":
            page[pos:pos] = data.draw(st.binary(min_size=1, max_size=12))
        else:
            del page[pos]
    try:
        families = parse(bytes(page))
    except MalformedPage:
        return
    samples(families)  # what was read can be used


@given(st.binary(max_size=300))
def test_random_bytes_are_malformed_or_read(page: bytes) -> None:
    with contextlib.suppress(MalformedPage):  # any other error fails the test
        parse(page)


@pytest.mark.parametrize(("page", "why"), [
    (varint(2**62) + b"\x0a\x01x", "past the end of the page"),
    (b"\x05\x0a\x7f" + b"abc", "runs past the end"),  # a name of 127 bytes in a family of 5
    (b"\x0c" + b"\x18" + b"\xff" * 11, "longer than ten bytes"),
    (b"\x02\x0b\x00", "wire type 3"),  # a group
    (b"\x02\x00\x00", "field number 0"),
    (b"\x02\x18\x07", "metric type 7"),
    (b"\x03\x0a\x01\xff", "utf-8"),
], ids=["huge family", "huge field", "long varint", "group", "field 0", "type", "not utf-8"])
def test_lengths_past_the_end_and_wire_errors_are_malformed(page: bytes, why: str) -> None:
    with pytest.raises(MalformedPage, match=f"(?i){why}"):
        parse(page)


def histogram_page(**fields: object) -> bytes:
    m = MetricFamily(name="h", type=HISTOGRAM)
    h = m.metric.add().histogram
    for name, value in fields.items():
        if name == "buckets":
            for bound, cumulative in value:  # type: ignore[attr-defined]
                b = h.bucket.add()
                b.upper_bound, b.cumulative_count = bound, cumulative
        elif name in ("positive_span", "negative_span"):
            for offset, length in value:  # type: ignore[attr-defined]
                getattr(h, name).add(offset=offset, length=length)
        elif name in ("positive_delta", "negative_delta"):
            getattr(h, name).extend(value)
        else:
            setattr(h, name, value)
    return delimited(m)


@pytest.mark.parametrize(("fields", "why"), [
    ({"sample_count": 5, "buckets": [(1.0, 3), (2.0, 2)]}, "counts that go down"),
    ({"sample_count": 5, "buckets": [(2.0, 1), (1.0, 2)]}, "out of order"),
    ({"sample_count": 5, "buckets": [(math.nan, 1)]}, "out of order"),
    ({"sample_count": 1, "buckets": [(1.0, 3)]}, "count below its buckets"),
    ({"sample_count": 4, "buckets": [(1.0, 3), (math.inf, 5)]}, r"\+Inf bucket"),
    ({"sample_count": 2, "schema": 5, "positive_span": [(0, 3)], "positive_delta": [1, 1]}, "more buckets than"),
    ({"sample_count": 2, "schema": 5, "positive_span": [(0, 2**32 - 1)], "positive_delta": [1]}, "more buckets than"),
    ({"sample_count": 2, "schema": 5, "positive_span": [(0, 1)], "positive_delta": [1, 1]}, "more deltas"),
    ({"sample_count": 2, "schema": 5, "positive_span": [(0, 2)], "positive_delta": [1, -2]}, "below zero"),
    ({"sample_count": 1, "schema": 9, "positive_span": [(0, 1)], "positive_delta": [1]}, "schema 9"),
], ids=["down", "order", "nan bound", "count", "inf", "short deltas", "huge span", "long deltas", "negative",
        "schema"])
def test_histograms_that_contradict_themselves_are_malformed(fields: dict[str, object], why: str) -> None:
    with pytest.raises(MalformedPage, match=why):
        parse(histogram_page(**fields))


def test_a_native_histogram_whose_buckets_are_not_its_count_or_beyond_the_sketch_has_no_sketch() -> None:
    page = histogram_page(sample_count=3, schema=5, zero_count=0, positive_span=[(10, 2)], positive_delta=[1, 0])
    (fam,) = parse(page)
    assert isinstance(fam.samples[0].value, HistogramValue) and fam.samples[0].value.sketch is None
    beyond = histogram_page(sample_count=1, schema=5, positive_span=[(MAX_INDEX + 5, 1)], positive_delta=[1])
    (fam,) = parse(beyond)
    assert isinstance(fam.samples[0].value, HistogramValue) and fam.samples[0].value.sketch is None
    counted = histogram_page(sample_count=2, schema=5, positive_span=[(10, 1)], positive_delta=[2])
    (fam,) = parse(counted)
    assert isinstance(fam.samples[0].value, HistogramValue) and fam.samples[0].value.sketch == Sketch.of(0, {9: 2})


def test_a_page_over_the_limit_is_refused_before_it_is_read() -> None:
    with pytest.raises(MalformedPage, match="over"):
        parse(bytes(MAX_PAGE_BYTES + 1))


def test_the_type_and_sign_of_what_was_written_survive() -> None:
    fams = [Family("outrider_host_load1").add(-0.0), Family("outrider_host_cpu_seconds_total").add(2.0**53 + 2, "x")]
    load, cpu = parse(render(fams))
    assert math.copysign(1, load.samples[0].value) == -1  # type: ignore[arg-type]
    assert cpu.samples[0].value == 2.0**53 + 2
    assert (load.type, cpu.type) == ("gauge", "counter")


def test_the_sketch_of_a_finer_scale_is_exact_and_of_a_coarser_none() -> None:
    rng = random.Random(4)
    values = [rng.lognormvariate(0, 3) for _ in range(3000)]
    for scale in (5, 6, 9, 20):
        counts: dict[int, int] = {}
        for v in values:
            counts[index_at(v, scale)] = counts.get(index_at(v, scale), 0) + 1
        assert Sketch.at_scale(scale, 2, counts) == Sketch.of_values([*values, 0.0, -1.0]), scale
    assert Sketch.at_scale(4, 0, {1: 1}) is None
    assert Sketch.at_scale(5, 0, {MAX_INDEX + 1: 1}) is None
    assert Sketch.at_scale(5, 0, {MAX_INDEX: 1, MAX_INDEX + 1: 0}) == Sketch.of(0, {MAX_INDEX: 1})


@pytest.mark.parametrize("n", [0, 1, 127, 128, 2**31, 2**63 + 5])
def test_a_zigzag_reads_back(n: int) -> None:
    from outrider.metrics.wire import unzigzag

    assert unzigzag(zigzag(n)) == n and unzigzag(zigzag(-n)) == -n


def test_protobuf_format_names_what_it_refuses() -> None:
    with pytest.raises(MalformedPage, match=r"family 2 \(outrider_host_load1\) at byte \d+"):
        page = render([Family("outrider_host_cpu_seconds_total").add(1, "x"), Family("outrider_host_load1").add(1)])
        parse(page[:-3])
