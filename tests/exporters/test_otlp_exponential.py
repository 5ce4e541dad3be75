"""Recorded distributions on OTLP: a histogram metric whose every point carries its sketch is an exponential
histogram at scale 5 (the sketch's buckets, its zero count, the exact sum; min and max left unset), encoded by the
SDK's own OTLP encoder; anything else, or the explicit setting, is the explicit-bucket histogram it always was."""

from __future__ import annotations

import random
from bisect import bisect_left
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.resources import Resource

from outrider.exporters.otlp import to_metrics_data
from outrider.ground.config import Config, load
from outrider.metrics.family import Family, HistogramValue
from outrider.shared.sketch import Sketch

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LABELS = ("/x", "GET", "http", "200", "2xx", "0", "job")


def histogram(values: list[float], sketched: bool = True) -> HistogramValue:
    counts = [0] * (len(BOUNDS) + 1)
    for v in values:
        counts[bisect_left(BOUNDS, v)] += 1
    return HistogramValue(BOUNDS, tuple(counts), sum(values), Sketch.of_values(values) if sketched else None)


def encoded(fams: list[Family], exponential: bool = True) -> list[Any]:
    """The OTLP metrics as the SDK's encoder puts them on the wire (decoded back: what a receiver reads)."""
    request = encode_metrics(to_metrics_data(fams, Resource({}), 10, 20, exponential))
    return list(request.resource_metrics[0].scope_metrics[0].metrics)


def test_a_sketched_histogram_is_an_exponential_histogram_of_its_sketch() -> None:
    rng = random.Random(3)
    values = [rng.lognormvariate(-4, 1.5) for _ in range(3000)] + [0.0, 0.0]
    h = histogram(values)
    (metric,) = encoded([Family("outrider_request_duration_seconds").add(h, *LABELS)])
    assert metric.name == "http.server.request.duration" and metric.unit == "s"
    assert metric.WhichOneof("data") == "exponential_histogram"
    assert metric.exponential_histogram.aggregation_temporality == 2  # cumulative
    (p,) = metric.exponential_histogram.data_points
    assert (p.scale, p.count, p.zero_count) == (5, len(values), 2)
    assert p.sum == sum(values) and (p.start_time_unix_nano, p.time_unix_nano) == (10, 20)
    assert not p.HasField("min") and not p.HasField("max"), "not recorded: absent, not 0"
    assert not p.HasField("negative")
    assert h.sketch is not None
    got = {p.positive.offset + k: c for k, c in enumerate(p.positive.bucket_counts) if c}
    assert got == dict(h.sketch.buckets), "the protocol's bucket index is the sketch's"
    assert p.positive.offset == min(h.sketch.buckets) and len(p.positive.bucket_counts) == \
        max(h.sketch.buckets) - min(h.sketch.buckets) + 1, "dense from the first bucket to the last"


def test_points_that_map_to_one_attribute_set_merge_their_sketches() -> None:
    """status_class is a Prometheus-only label: two of them are one OTLP point, its sketch the two merged."""
    a, b = histogram([0.01, 0.02]), histogram([0.3, 0.3, 7.0])
    fam = Family("outrider_request_duration_seconds").add(a, *LABELS).add(b, *LABELS[:4], "other", *LABELS[5:])
    (metric,) = encoded([fam])
    (p,) = metric.exponential_histogram.data_points
    merged = Sketch.of_values([0.01, 0.02, 0.3, 0.3, 7.0])
    assert p.count == 5 and p.sum == a.sum + b.sum
    assert {p.positive.offset + k: c for k, c in enumerate(p.positive.bucket_counts) if c} == dict(merged.buckets)


def test_a_metric_with_one_unsketched_point_is_explicit_for_all_its_points() -> None:
    fam = Family("outrider_request_duration_seconds").add(histogram([0.1]), *LABELS)
    fam.add(histogram([0.2], sketched=False), *LABELS[:-1], "other-job")
    (metric,) = encoded([fam])
    assert metric.WhichOneof("data") == "histogram", "one name, one type"
    assert [list(p.bucket_counts) for p in metric.histogram.data_points] == [list(histogram([0.1]).counts),
                                                                          list(histogram([0.2]).counts)]


def test_the_explicit_setting_exports_the_classic_buckets() -> None:
    (metric,) = encoded([Family("outrider_request_duration_seconds").add(histogram([0.1, 3.0]), *LABELS)],
                        exponential=False)
    assert metric.WhichOneof("data") == "histogram"
    (p,) = metric.histogram.data_points
    assert list(p.explicit_bounds) == list(BOUNDS) and p.count == 2


def test_the_standard_variable_chooses_the_aggregation_and_outriders_default_is_exponential() -> None:
    assert Config().otlp_histogram_aggregation == "base2_exponential_bucket_histogram"
    env = {"OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "EXPLICIT_BUCKET_HISTOGRAM"}
    assert load(env=env).config.otlp_histogram_aggregation == "explicit_bucket_histogram"
    over = {**env, "OUTRIDER_OTLP_HISTOGRAM_AGGREGATION": "base2_exponential_bucket_histogram"}
    assert load(env=over).config.otlp_histogram_aggregation == "base2_exponential_bucket_histogram"
