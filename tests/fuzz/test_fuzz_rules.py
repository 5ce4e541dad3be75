"""Rule files, expressions, templates, receivers files and promtool series notation, fuzzed with hypothesis: every
bad input is a RuleLoadError / NotifyConfigError / PromTestError naming what is wrong, or loads; an expression that
loads evaluates over any store without an exception other than PromQLError (which the engine counts)."""

from __future__ import annotations

import contextlib
import math

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outrider.notify import NotifyConfigError, parse_receivers
from outrider.rules.promql import Evaluator, PromQLError
from outrider.rules.promtest import PromTestError, expand_values
from outrider.rules.rule import RuleLoadError, parse_groups
from outrider.rules.store import SeriesStore, make_labels
from outrider.rules.templates import Template, TemplateError

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NAMES = st.sampled_from(["a", "b", "up", "x_total", "h_bucket"])
LABELS = st.sampled_from(["job", "instance", "gpu", "le", "route"])
DUR = st.sampled_from(["1m", "5m", "30s", "1h"])
FUNCS = st.sampled_from(["rate", "increase", "irate", "delta", "deriv", "avg_over_time", "max_over_time",
                         "min_over_time", "count_over_time", "last_over_time", "changes", "resets"])
AGGS = st.sampled_from(["sum", "avg", "min", "max", "count", "group", "stddev"])
BINOPS = st.sampled_from(["+", "-", "*", "/", "%", "^", ">", "<", "==", "!=", ">=", "<=", "and", "or", "unless"])


@st.composite
def selectors(draw: st.DrawFn) -> str:
    matchers = draw(st.lists(st.tuples(LABELS, st.sampled_from(["=", "!=", "=~", "!~"]),
                                       st.sampled_from(["0", "1", "a.*", "", "x|y"])), max_size=2))
    body = ",".join(f'{k}{op}"{v}"' for k, op, v in matchers)
    off = draw(st.one_of(st.just(""), DUR.map(lambda d: f" offset {d}")))
    return f"{draw(NAMES)}{{{body}}}{off}" if body else f"{draw(NAMES)}{off}"


def expressions() -> st.SearchStrategy[str]:
    leaf = st.one_of(selectors(), st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: repr(round(f, 3))))

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(FUNCS, selectors(), DUR).map(lambda t: f"{t[0]}({t[1].split(' offset')[0]}[{t[2]}])"),
            st.tuples(AGGS, st.sampled_from(["by", "without"]), LABELS, inner).map(
                lambda t: f"{t[0]} {t[1]} ({t[2]}) ({t[3]})"),
            st.tuples(inner, BINOPS, st.sampled_from(["", " on (job)", " ignoring (gpu)"]), inner).map(
                lambda t: f"({t[0]}) {t[1]}{t[2]} ({t[3]})"),
            inner.map(lambda e: f"histogram_quantile(0.9, {e})"),
            inner.map(lambda e: f"abs({e})"),
            inner.map(lambda e: f"-({e})"),
        )

    return st.recursive(leaf, extend, max_leaves=6)


def store(values: list[float]) -> SeriesStore:
    s = SeriesStore(None)
    for i, v in enumerate(values):
        for name in ("a", "b", "x_total", "h_bucket", "up"):
            for gpu in ("0", "1"):
                labels = make_labels(name, [("job", "j"), ("gpu", gpu), ("le", "0.5" if gpu == "0" else "+Inf")])
                s.add(labels, i * 15_000, v * (1 + int(gpu)))
    return s


@FAST
@given(expr=expressions(), values=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=30))
def test_generated_expressions_load_and_evaluate_or_fail_cleanly(expr: str, values: list[float]) -> None:
    try:
        groups = parse_groups({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": expr}]}]}, "fuzz")
    except RuleLoadError as e:
        assert "'A'" in str(e)
        return
    ev = Evaluator(store(values))
    rule = groups[0].rules[0]
    for ts in (0, 60_000, 300_000, 3_600_000):
        with contextlib.suppress(PromQLError):
            for sample in ev.vector(rule.expr, ts):
                assert isinstance(sample.value, float) or math.isnan(sample.value)


@FAST
@given(text=st.text(max_size=300))
def test_arbitrary_expression_text_is_a_load_error_or_loads(text: str) -> None:
    with contextlib.suppress(RuleLoadError):
        parse_groups({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": text}]}]}, "fuzz")


@FAST
@given(doc=st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
                        lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                st.dictionaries(st.sampled_from(
                                                    ["groups", "name", "rules", "alert", "record", "expr", "for",
                                                     "labels", "annotations", "interval", "keep_firing_for"]),
                                                    inner, max_size=5)), max_leaves=20))
def test_arbitrary_rule_file_structures_are_a_load_error_or_load(doc: object) -> None:
    with contextlib.suppress(RuleLoadError):
        parse_groups(doc, "fuzz")


@FAST
@given(text=st.text(max_size=200), value=st.floats(allow_nan=True, allow_infinity=True),
       labels=st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=4))
def test_templates_are_refused_at_load_or_render(text: str, value: float, labels: dict[str, str]) -> None:
    try:
        template = Template(text, "fuzz")
    except TemplateError:
        return
    assert isinstance(template.render(labels, value), str)


@FAST
@given(doc=st.recursive(st.one_of(st.none(), st.integers(), st.text(max_size=30)),
                        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(
                            st.sampled_from(["receivers", "name", "type", "url", "match", "match_re", "timeout_s",
                                             "routing_key", "url_env", "routing_key_file"]), inner, max_size=5)),
                        max_leaves=15))
def test_arbitrary_receivers_files_are_a_config_error_or_load(doc: object) -> None:
    with contextlib.suppress(NotifyConfigError):
        parse_receivers(doc, "fuzz")


@FAST
@given(text=st.text(alphabet="0123456789+-x_ .eInfNastl", max_size=40))
def test_series_notation_is_a_clear_error_or_values(text: str) -> None:
    with contextlib.suppress(PromTestError):
        values = expand_values(text)
        assert len(values) < 10**7


def test_a_broken_rule_file_on_disk_names_the_file() -> None:
    import tempfile
    from pathlib import Path

    from outrider.rules.rule import load_groups

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "r.yaml"
        path.write_text("groups: [\n")
        try:
            load_groups([path])
        except RuleLoadError as e:
            assert str(path) in str(e) and "YAML" in str(e)
        else:
            raise AssertionError("a broken file loaded")
        path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"alert": "A"}]}]}))
        try:
            load_groups([path])
        except RuleLoadError as e:
            assert "'A'" in str(e) and "no expr" in str(e)


def test_a_series_that_would_expand_without_bound_is_refused() -> None:
    import pytest

    with pytest.raises(PromTestError, match="more than 1000000 samples"):
        expand_values("0+1x99999999999")
    assert expand_values("1+2x2 _x2 stale")[:3] == [1.0, 3.0, 5.0]
