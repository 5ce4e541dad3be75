"""The agent's reader of the Prometheus text format (metrics/text_format.py) against prometheus_client's own parser:
pages that real prometheus_client registries write (0.0.4 and OpenMetrics), with label values of any text, read
into the same samples, values and types; and what a hand-written page may hold wrong costs that line only."""

from __future__ import annotations

import math
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from outrider.metrics import text_format

NAMES = st.text(string.ascii_lowercase, min_size=1, max_size=6)
LABEL_VALUES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # any text, quotes and \ too
KINDS = st.sampled_from(["counter", "gauge", "histogram", "summary", "info"])
METRIC = st.tuples(KINDS, NAMES, st.lists(st.tuples(LABEL_VALUES, st.floats(0, 1e6)), min_size=1, max_size=4))


def _registry(metrics: list[tuple[str, str, list[tuple[str, float]]]]) -> CollectorRegistry:
    registry = CollectorRegistry()
    for i, (kind, name, points) in enumerate(metrics):
        full = f"m{i}_{name}"
        if kind == "info":
            Info(full, "Facts.", registry=registry).info({"v": points[0][0]})
            continue
        cls = {"counter": Counter, "gauge": Gauge, "histogram": Histogram, "summary": Summary}[kind]
        metric = cls(full, 'Help with "quotes", \\ and a\nnewline.', ["k"], registry=registry)
        for label, v in points:
            child = metric.labels(label)
            if kind == "counter":
                child.inc(v)
            elif kind == "gauge":
                child.set(v)
            else:
                child.observe(v)
    return registry


def _flat(families: object) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], dict[str, str]]:
    values, types = {}, {}
    for fam in families:  # type: ignore[attr-defined]
        for s in fam.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
            types[s.name] = {"untyped": "unknown"}.get(fam.type, fam.type)
    return values, types


def _ours(text: str) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], dict[str, str]]:
    page = text_format.parse(text)
    assert page.bad_lines == 0, page.errors
    return _flat(text_format.families(page))


FORMATS = {"0.0.4": (generate_latest, text_string_to_metric_families),
           "openmetrics": (generate_openmetrics, parse_openmetrics)}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@settings(max_examples=50, deadline=None)
@given(metrics=st.lists(METRIC, min_size=1, max_size=5))
def test_a_prometheus_client_page_reads_as_prometheus_clients_own_parser_reads_it(fmt: str, metrics: list) -> None:  # type: ignore[type-arg]
    write, read = FORMATS[fmt]
    text = write(_registry(metrics)).decode()
    assert _ours(text) == _flat(read(text)), "the same samples, values and types"


def test_a_malformed_line_costs_that_line_only() -> None:
    page = text_format.parse(
        "# TYPE up gauge\n"
        "up 1\n"
        'broken{a="unterminated} 1\n'
        'twice{a="1",a="2"} 1\n'
        "no_value\n"
        "spaced 1_000\n"
        "# TYPE up counter\n"
        'ok{a="x",} 2 1700000000000\n'
        'exemplar_total 3 # {trace_id="abc"} 1.0\n'
        "nan NaN\n"
        "inf +Inf\n"
        "# EOF\n"
        "after_eof 1\n")
    got = {(s.name, tuple(s.labels.items())): s.value for s in page.samples}
    assert math.isnan(got.pop(("nan", ())))
    assert math.isinf(got.pop(("inf", ())))
    assert got == {("up", ()): 1, ("ok", (("a", "x"),)): 2, ("exemplar_total", ()): 3}
    assert page.bad_lines == 5 and len(page.errors) == 5, page.errors
    assert page.types == {"up": "gauge"}, "a second TYPE for a family is refused, the first kept"
