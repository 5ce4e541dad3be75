"""The protobuf exposition, read back by protobuf's own parser (tests/prometheus_model.py builds the message classes
from client_model's field numbers and types with the protobuf runtime): every family kind, the classic buckets, and
a sketched histogram's native buckets equal to the sketch bucket by bucket."""

from __future__ import annotations

import math
import random
from bisect import bisect_left

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outrider.metrics.exposition import render as render_text
from outrider.metrics.family import Family, HistogramValue
from outrider.metrics.protobuf_exposition import ProtobufRenderer, native_buckets, render, varint, zigzag
from outrider.shared.sketch import MIN_VALUE, Sketch
from tests.metrics.test_renderer import sweep
from tests.prometheus_model import COUNTER, GAUGE, HISTOGRAM, parse_exposition
from tests.prometheus_model import native_buckets as decoded_buckets

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REQUEST_LABELS = ("/x", "GET", "http", "200", "2xx", "0", "job")


def histogram(values: list[float], sketched: bool = True) -> HistogramValue:
    counts = [0] * (len(BOUNDS) + 1)
    for v in values:
        counts[bisect_left(BOUNDS, v)] += 1  # le: a value on a bound is in that bound's bucket
    return HistogramValue(BOUNDS, tuple(counts), sum(values), Sketch.of_values(values) if sketched else None)


def labels(metric: object) -> dict[str, str]:
    return {lp.name: lp.value for lp in metric.label}  # type: ignore[attr-defined]


def test_counters_gauges_and_labels_read_back_by_protobufs_parser() -> None:
    fams = [Family("outrider_host_load1").add(0.5),
            Family("outrider_collector_success").add(1, "host").add(0, "gpu"),
            Family("outrider_host_cpu_seconds_total").add(12.5, "user"),
            Family("outrider_host_load1").add(float("nan"))]  # a second family of one name: merged, first wins
    load, success, cpu = parse_exposition(render(fams))
    assert (load.name, load.type, load.help) == ("outrider_host_load1", GAUGE, fams[0].defn.help)
    (metric,) = load.metric
    assert labels(metric) == {} and metric.gauge.value == 0.5 and not metric.HasField("counter")
    assert success.type == GAUGE
    assert [(labels(m), m.gauge.value) for m in success.metric] == [({"collector": "host"}, 1.0),
                                                                   ({"collector": "gpu"}, 0.0)]
    assert (cpu.name, cpu.type) == ("outrider_host_cpu_seconds_total", COUNTER), "the name as the text format's"
    assert cpu.metric[0].counter.value == 12.5 and not cpu.metric[0].HasField("gauge")


@pytest.mark.parametrize("value", [float("nan"), math.inf, -math.inf, -0.0, 1e300, 2.0 ** 53 + 2])
def test_every_double_arrives_as_it_is(value: float) -> None:
    (fam,) = parse_exposition(render([Family("outrider_host_load1").add(value)]))
    got = fam.metric[0].gauge.value
    same = got == value and math.copysign(1, got) == math.copysign(1, value)
    assert same or (math.isnan(got) and math.isnan(value))


def test_an_empty_label_is_an_absent_label_and_a_lone_surrogate_is_written_as_the_text_format_writes_it() -> None:
    cpu = Family("outrider_process_cpu_seconds_total").add(1, "1", "x\udce9", "user").add(2, "2", "", "system")
    (fam,) = parse_exposition(render([cpu]))  # protobuf refuses a string that is not UTF-8: this one parses
    first, second = (labels(m) for m in fam.metric)
    assert first["name"] == "x\\xe9", "the byte it stood for, as the text format writes it"
    assert "name" not in second
    text_label = render_text([cpu]).decode().split('name="', 1)[1].split('"', 1)[0]
    assert text_label.replace("\\\\", "\\") == first["name"]


def test_a_duplicate_label_set_keeps_the_first_as_the_text_format_does() -> None:
    fam = Family("outrider_collector_success").add(1, "host").add(0, "host")
    (got,) = parse_exposition(render([fam]))
    assert [m.gauge.value for m in got.metric] == [1.0]


def test_a_sketched_histogram_has_its_classic_buckets_and_its_native_ones_equal_to_the_sketch() -> None:
    rng = random.Random(5)
    values = [rng.lognormvariate(-3, 1.2) for _ in range(5000)] + [0.0] * 7 + [0.5, 1.0]  # zeros; bounds hit
    h = histogram(values)
    fam = Family("outrider_request_duration_seconds").add(h, *REQUEST_LABELS)
    (got,) = parse_exposition(render([fam]))
    assert got.type == HISTOGRAM and got.name == "outrider_request_duration_seconds"
    p = got.metric[0].histogram
    assert p.sample_count == len(values) and p.sample_sum == pytest.approx(sum(values))
    assert [b.upper_bound for b in p.bucket] == list(BOUNDS), "finite bounds; +Inf is the count"
    assert [b.cumulative_count for b in p.bucket] == h.cumulative()[:-1]
    assert p.schema == 5 and p.zero_threshold == MIN_VALUE and p.zero_count == 7
    assert h.sketch is not None
    # Prometheus's bucket i is (base**(i-1), base**i]: the sketch's (OpenTelemetry's) bucket i - 1
    assert decoded_buckets(p) == {i + 1: c for i, c in h.sketch.buckets.items()}
    assert p.zero_count + sum(decoded_buckets(p).values()) == p.sample_count


def test_a_family_with_one_unsketched_sample_is_classic_for_all_its_samples() -> None:
    """All of a family's series are native histograms or none: one metric, one kind of series in Prometheus (a
    series with no sketch, another library's histogram, has no native buckets to give)."""
    fam = Family("outrider_request_duration_seconds")
    fam.add(histogram([0.1, 0.2]), *REQUEST_LABELS)
    fam.add(histogram([0.3], sketched=False), "/y", *REQUEST_LABELS[1:])
    (got,) = parse_exposition(render([fam]))
    for m in got.metric:
        h = m.histogram
        assert not h.HasField("schema") and not h.HasField("zero_threshold") and not h.positive_span
        assert h.bucket, "the classic buckets"


def test_a_sketch_whose_count_differs_from_the_buckets_is_left_out() -> None:
    h = histogram([0.1, 0.2])
    off = HistogramValue(h.bounds, h.counts, h.sum, Sketch.of_values([0.1]))
    (got,) = parse_exposition(render([Family("outrider_request_duration_seconds").add(off, *REQUEST_LABELS)]))
    assert not got.metric[0].histogram.HasField("schema"), "one sample_count cannot serve both"


def test_an_empty_sketch_is_still_a_native_histogram() -> None:
    (got,) = parse_exposition(render([Family("outrider_request_duration_seconds").add(histogram([]),
                                                                                        *REQUEST_LABELS)]))
    h = got.metric[0].histogram
    assert h.schema == 5 and h.zero_threshold > 0 and h.sample_count == 0
    assert [(s.offset, s.length) for s in h.positive_span] == [(0, 0)] and not h.positive_delta


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(-900, 700), st.integers(1, 2**40), max_size=40), st.integers(0, 5))
def test_native_buckets_are_the_sketch_bucket_by_bucket_whatever_its_gaps(buckets: dict[int, int], zero: int) -> None:
    sketch = Sketch.of(zero, buckets)
    spans, deltas = native_buckets(sketch)
    assert sum(length for _, length in spans) == len(deltas)
    assert all(offset >= 3 for offset, _ in spans[1:]), "gaps of up to two buckets are filled, not new spans"
    count = sketch.count
    h = HistogramValue((), (count,), 1.0, sketch)
    (got,) = parse_exposition(render([Family("outrider_request_duration_seconds").add(h, *REQUEST_LABELS)]))
    assert decoded_buckets(got.metric[0].histogram) == {i + 1: c for i, c in buckets.items()}


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2**31, 2**63 + 5])
def test_varints_read_back(n: int) -> None:
    from google.protobuf.internal.decoder import _DecodeVarint  # protobuf's own reading of one

    assert _DecodeVarint(varint(n), 0) == (n, len(varint(n)))


def test_zigzag_is_protobufs() -> None:
    assert [zigzag(n) for n in (0, -1, 1, -2, 2, -(2**62))] == [0, 1, 2, 3, 4, 2**63 - 1]


def test_kept_messages_equal_a_fresh_render_sweep_after_sweep() -> None:
    rng = random.Random(7)
    renderer = ProtobufRenderer()
    kept = Family("outrider_agent_sweeps_total").add(1)  # a collector that keeps its Family and changes it
    for i in range(300):
        if rng.random() < 0.3:
            kept.samples[0] = ((), float(i))
        fams = sweep(rng, kept)
        assert renderer.render(fams) == render(fams), f"sweep {i}"
