"""Exposition: Prometheus text 0.0.4 and OpenMetrics 1.0, checked with prometheus_client's parsers."""

from __future__ import annotations

import math

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from outrider.metrics.exposition import format_value, render, wants_openmetrics
from outrider.metrics.family import Family


def fams() -> list[Family]:
    cpu = Family("outrider_process_cpu_seconds_total")
    cpu.add(1.5, "42", 'we"ird\\name\nx', "user").add(0.25, "42", 'we"ird\\name\nx', "system")
    return [cpu, Family("outrider_host_memory_limit_bytes").add(2**40), Family("outrider_host_load1").add(0.5)]


def test_text_format_round_trips_through_prometheus_client_parser() -> None:
    parsed = {f.name: f for f in parse_text(render(fams()).decode())}
    cpu = parsed["outrider_process_cpu_seconds"]
    assert cpu.type == "counter"
    s = {x.labels["mode"]: x for x in cpu.samples}
    assert s["user"].value == 1.5 and s["user"].labels["name"] == 'we"ird\\name\nx'
    assert parsed["outrider_host_memory_limit_bytes"].samples[0].value == 2**40


def test_openmetrics_is_valid_with_units_and_eof() -> None:
    text = render(fams(), openmetrics=True).decode()
    assert text.endswith("# EOF\n")
    assert "# UNIT outrider_process_cpu_seconds seconds\n" in text
    assert "# TYPE outrider_process_cpu_seconds counter\n" in text
    parsed = {f.name: f for f in parse_openmetrics(text)}  # strict parser: raises on any violation
    assert parsed["outrider_process_cpu_seconds"].unit == "seconds"
    assert parsed["outrider_host_memory_limit_bytes"].unit == "bytes"
    assert parsed["outrider_host_load1"].samples[0].value == 0.5


@pytest.mark.parametrize(("value", "text"), [
    (1.0, "1"), (0.5, "0.5"), (1e20, "1e+20"), (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN"),
    (123456789012.0, "123456789012"),
])
def test_values(value: float, text: str) -> None:
    assert format_value(value) == text


def test_empty_families_are_left_out_and_duplicates_dropped() -> None:
    dup = Family("outrider_host_load1").add(1).add(2)
    text = render([Family("outrider_host_load5"), dup]).decode()
    assert "load5" not in text
    assert text.count("\noutrider_host_load1 ") == 1, "a duplicate series would fail the whole scrape"


def test_same_family_from_two_collectors_is_merged_under_one_header() -> None:
    a = Family("outrider_collector_success").add(1, "host")
    b = Family("outrider_collector_success").add(0, "gpu")
    text = render([a, b]).decode()
    assert text.count("# TYPE outrider_collector_success") == 1
    assert 'collector="gpu"} 0' in text


def test_wrong_label_count_is_refused() -> None:
    with pytest.raises(ValueError, match="expected labels"):
        Family("outrider_host_cpu_seconds_total").add(1)


@pytest.mark.parametrize(("accept", "om"), [
    (None, False),
    ("text/plain;version=0.0.4", False),
    ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1", True),  # what Prometheus 2.x sends
    ("application/openmetrics-text;q=0", False),
])
def test_content_negotiation(accept: str | None, om: bool) -> None:
    assert wants_openmetrics(accept) is om


def test_histograms_in_both_formats() -> None:
    from dataclasses import replace

    from outrider.metrics.catalog import CATALOG
    from outrider.metrics.family import HistogramValue

    defn = replace(CATALOG["outrider_host_load1"], name="outrider_test_step_seconds", type="histogram")
    h = HistogramValue(bounds=(0.1, 1.0), counts=(3, 2, 1), sum=4.5)
    fam = Family(defn).add(h)
    text = render([fam]).decode()
    parsed = {s.name + str(sorted(s.labels.items())): s.value for f in parse_text(text) for s in f.samples}
    assert parsed["outrider_test_step_seconds_bucket[('le', '0.1')]"] == 3
    assert parsed["outrider_test_step_seconds_bucket[('le', '1.0')]"] == 5
    assert parsed["outrider_test_step_seconds_bucket[('le', '+Inf')]"] == 6
    assert parsed["outrider_test_step_seconds_count[]"] == 6 and parsed["outrider_test_step_seconds_sum[]"] == 4.5
    om = list(parse_openmetrics(render([fam], openmetrics=True).decode()))
    assert om[0].type == "histogram" and om[0].unit == "seconds"
    with pytest.raises(TypeError):
        Family(defn).add(1.0)
