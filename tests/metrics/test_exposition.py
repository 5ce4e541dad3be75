"""Exposition: Prometheus text 0.0.4 and OpenMetrics 1.0, checked with prometheus_client's parsers."""

from __future__ import annotations

import math

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from outrider.metrics.catalog import MetricDef
from outrider.metrics.exposition import format_value, negotiate, render, wants_openmetrics
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


PROMETHEUS_NATIVE = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
                     "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;"
                     "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")  # Prometheus 2.42, native histograms on
PROMETHEUS = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")  # Prometheus 2.42 without
PB = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"


@pytest.mark.parametrize(("accept", "fmt"), [
    (PROMETHEUS_NATIVE, "protobuf"), (PROMETHEUS, "openmetrics"), (None, "text"), ("", "text"),
    ("text/plain;version=0.0.4", "text"),
    (PB, "protobuf"),
    (PB + ";q=0.5,application/openmetrics-text", "openmetrics"),  # ranked below OpenMetrics
    (PB + ";q=0.5,application/openmetrics-text;q=0.5", "protobuf"),  # a tie goes to the richer format
    (PB + ";q=0,text/plain", "text"),  # refused
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily", "text"),  # not delimited
    ("application/vnd.google.protobuf;encoding=delimited", "text"),  # no message named
    ("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited", "protobuf"),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text", "text"),
])
def test_negotiation_picks_protobuf_when_asked_first_openmetrics_when_listed_else_text(
        accept: str | None, fmt: str) -> None:
    assert negotiate(accept) == fmt


def test_negotiation_without_protobuf_is_the_text_formats_negotiation() -> None:
    assert negotiate(PROMETHEUS_NATIVE, protobuf=False) == "openmetrics"
    assert negotiate(PB, protobuf=False) == "text"


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


# --- every branch of the writer, each to the byte (mutation testing: scripts/mutation.sh metrics/exposition) ----

def test_an_unlabelled_sample_has_no_braces_and_text_format_has_no_unit_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from outrider.metrics import exposition

    monkeypatch.setattr(exposition, "_PREFIXES", {})  # formatted here, not found in an earlier test's cache
    text = render([Family("outrider_host_load1").add(0.5), Family("outrider_host_memory_limit_bytes").add(1)])
    assert b"\noutrider_host_load1 0.5\n" in text
    assert b"# UNIT" not in text, "UNIT lines are OpenMetrics only"


@pytest.mark.parametrize(("value", "text"), [
    (1e15, "1000000000000000.0"), (-1e15, "-1000000000000000.0"), (999999999999999.0, "999999999999999"),
    (-999999999999999.0, "-999999999999999"), (0.0, "0"), (-3.0, "-3"),
])
def test_integers_are_written_as_integers_only_below_1e15(value: float, text: str) -> None:
    assert format_value(value) == text


@pytest.mark.parametrize(("code", "escaped"), [
    (0xDC80, "\\x80"), (0xDCE9, "\\xe9"), (0xDCFF, "\\xff"),  # bytes that were not UTF-8 (surrogateescape)
    # other lone surrogates: their code point
    (0xDC7F, "\\udc7f"), (0xDD00, "\\udd00"), (0xD800, "\\ud800"), (0xDFFF, "\\udfff"),
])
def test_a_lone_surrogate_in_a_label_is_written_as_the_byte_or_code_point_it_stood_for(
        code: int, escaped: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from outrider.metrics import exposition
    from outrider.metrics.exposition import escape_label_value

    monkeypatch.setattr(exposition, "_PREFIXES", {})

    # the escape's backslash is then escaped like any other: a parser reads back the text "\\xe9"
    assert escape_label_value(f"a{chr(code)}é") == f"a\\{escaped}é"
    cpu = Family("outrider_process_cpu_seconds_total").add(1, "1", f"x{chr(code)}", "user")
    text = render([cpu]).decode("utf-8")  # valid UTF-8 whatever the label held
    assert f'name="x\\{escaped}"' in text
    (sample,) = next(iter(parse_text(text))).samples
    assert sample.labels["name"] == f"x{escaped}"


def test_help_text_escapes_backslash_and_newline() -> None:
    from outrider.metrics.exposition import escape_help

    assert escape_help("a\\b\nc\"d") == 'a\\\\b\\nc"d'


@pytest.mark.parametrize(("accept", "om"), [
    ("text/plain,application/openmetrics-text", True),  # no spaces after the comma
    ("application/openmetrics-text;version=1.0.0;q=0.5", True),  # more than one parameter
    ("application/openmetrics-text;version=1.0.0;q=0", False),
    ("application/openmetrics-text; q=0 ", False),
    ("application/openmetrics-text;q=abc", False),  # a q that is no number refuses
    ("application/openmetrics-text;q=0=1", False),
    ("text/plain;q=1", False),
    ("", False),
])
def test_content_negotiation_reads_each_media_range_and_its_q(accept: str, om: bool) -> None:
    assert wants_openmetrics(accept) is om


def test_families_of_one_name_from_two_collectors_keep_both_samples() -> None:
    a = Family("outrider_collector_success").add(1, "host")
    b = Family("outrider_collector_success").add(0, "gpu")
    text = render([a, b]).decode()
    assert 'collector="host"} 1\n' in text and 'collector="gpu"} 0\n' in text


def test_a_renderer_reuses_an_unchanged_familys_text_and_a_changed_ones_header(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from outrider.metrics import exposition
    from outrider.metrics.exposition import Renderer

    formatted: list[str] = []
    headers: list[str] = []
    real_samples, real_header = exposition._samples_text, exposition._header

    def counting(fam: Family) -> str:
        formatted.append(fam.defn.name)
        return real_samples(fam)

    def counting_header(d: MetricDef, openmetrics: bool) -> str:
        headers.append(d.help)
        return real_header(d, openmetrics)
    monkeypatch.setattr(exposition, "_samples_text", counting)
    monkeypatch.setattr(exposition, "_header", counting_header)
    r = Renderer(openmetrics=False)
    first = r.render([Family("outrider_host_load1").add(0.5)])
    assert r.render([Family("outrider_host_load1").add(0.5)]) == first
    assert formatted == ["outrider_host_load1"] and len(headers) == 1, "an equal family is not formatted again"
    changed = r.render([Family("outrider_host_load1").add(0.75)])
    assert b"outrider_host_load1 0.75\n" in changed and b" 0.5\n" not in changed
    assert changed.startswith(first.split(b"outrider_host_load1 0.5")[0]), "the same HELP and TYPE text"
    assert formatted == ["outrider_host_load1"] * 2 and len(headers) == 1, "new samples under the kept header"
    # the same samples under another definition of the name (another help text) are formatted anew, header too
    other = replace(Family("outrider_host_load1").defn, help="another help")
    again = r.render([Family(other).add(0.75)])
    assert b"# HELP outrider_host_load1 another help\n" in again
    assert formatted == ["outrider_host_load1"] * 3 and headers[-1] == "another help" and len(headers) == 2


def test_label_prefixes_are_formatted_once_and_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from outrider.metrics import exposition

    monkeypatch.setattr(exposition, "_PREFIXES", {})
    blocks: list[tuple[str, ...]] = []
    real = exposition._label_block

    def counting(names: tuple[str, ...], values: tuple[str, ...]) -> str:
        blocks.append(values)
        return real(names, values)
    monkeypatch.setattr(exposition, "_label_block", counting)
    fam = Family("outrider_collector_success").add(1, "host")
    render([fam])
    render([Family("outrider_collector_success").add(0, "host")])
    assert blocks == [("host",)], "the second sweep's prefix comes from the cache"
    # The bound: at _PREFIX_BOUND entries the next new prefix clears the cache first.
    names = ("collector",)
    bound = exposition._PREFIX_BOUND
    assert bound == 50_000
    exposition._PREFIXES.clear()
    exposition._PREFIXES.update({("m", names, (str(i),)): "" for i in range(bound - 1)})
    assert exposition._prefix("m", names, ("last",)) == 'm{collector="last"} '
    assert len(exposition._PREFIXES) == bound, "just below the bound: kept"
    assert exposition._prefix("m", names, ("0",)) == "", "a hit at the bound: no clearing"
    exposition._prefix("m", names, ("one more",))
    assert len(exposition._PREFIXES) == 1, "past the bound: cleared, then the new one"
