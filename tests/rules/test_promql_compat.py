"""promql_compat: the embedded evaluator follows Prometheus 3 (the default) or Prometheus 2, wherever the two give
different results (rules/promql.Compat; docs/alerting.md, Prometheus 2 and 3).

promql_compat_v2.test.yaml and promql_compat_v3.test.yaml hold the same cases, one per difference, with each
version's values: promtool 2.42 passes the first, the evaluator reproduces each under its own semantics, and every
case fails under the other one (so each is a real difference, not a case both give alike). What a promtool file
cannot state (an error on one side, a sum whose order promtool 2.42 leaves to Go's map order) is stated here.
"""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from outrider.commands import cli
from outrider.ground.config import ConfigError, load
from outrider.metrics.catalog import CATALOG
from outrider.metrics.family import Family, HistogramValue
from outrider.rules import promql
from outrider.rules.engine import RuleEngine
from outrider.rules.promql import Evaluator, PromQLError, normalised_le
from outrider.rules.promtest import parse_series, run_file
from outrider.rules.rule import parse_groups
from outrider.rules.store import SeriesStore, make_labels
from tests.conftest import need_binary

HERE = Path(__file__).parent
V2, V3 = HERE / "promql_compat_v2.test.yaml", HERE / "promql_compat_v3.test.yaml"


def test_promtool_2_passes_the_prometheus_2_cases() -> None:
    r = subprocess.run([need_binary("promtool"), "test", "rules", str(V2)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(("path", "compat"), [(V2, 2), (V3, 3)], ids=["2", "3"])
def test_each_semantics_gives_its_own_values_and_not_the_others(path: Path, compat: int) -> None:
    own = run_file(path, compat)
    assert [f for r in own for f in r.failures] == []
    other = run_file(path, 5 - compat)
    assert len(other) == 5 and all(r.failures for r in other), [r.name for r in other if not r.failures]


def evaluate(compat: int, expr: str, *series: str) -> list[tuple[dict[str, str], float]] | str:
    """The expression at time 0 over series written `name{labels} value`, each one sample at time 0, in the order
    given; or the error's text."""
    store = SeriesStore(None)
    for text in series:
        selector, value = text.rsplit(" ", 1)
        name, pairs = parse_series(selector)
        store.add(make_labels(name, pairs), 0, float(value))
    try:
        got = Evaluator(store, compat=compat).vector(promql.parse(expr), 0)
    except PromQLError as e:
        return str(e)
    return [(dict(s.labels), s.value) for s in got]


MANY_TO_ONE = ('many_side{label="foo",job="test"} 0', 'many_side{label="bar",job="test"} 1',
               'one_side{job="test"} 1')
TEN = ('data{point="a"} 2', 'data{point="b"} 8', 'data{point="c"} 1e100', 'data{point="d"} -1e100')


@pytest.mark.parametrize(("expr", "series", "as_2", "as_3"), [
    # 3 counts the one-to-one matches before the comparison filters them (operators.test at v3.14.0)
    ("many_side > on(job) one_side", MANY_TO_ONE, [],
     "multiple matches for labels {'job': 'test'}: many-to-one matching must be explicit (group_left/group_right)"),
    # any UTF-8 label name in 3, the legacy grammar in 2 (functions.test at v2.55.1)
    ('label_replace(x, "invalid-label-name", "a", "src", "(.*)")', ("x 1",),
     "invalid destination label name in label_replace(): invalid-label-name",
     [({"__name__": "x", "invalid-label-name": "a"}, 1.0)]),
    # a k below 1 is no result in 3 before it is checked as an int64
    ("topk(-Inf, x)", ("x 1",), "Scalar value -inf overflows int64", []),
    ("topk(0 / 0, x)", ("x 1",), "Scalar value NaN overflows int64", "Parameter value is NaN"),
    # Kahan-compensated sum and avg in 3; 2 adds in the series' order (aggregators.test at v3.14.0: 10 and 2.5)
    ("sum(data)", TEN, [({}, 0.0)], [({}, 10.0)]),
    ("avg(data)", TEN, [({}, 0.0)], [({}, 2.5)]),
    # a compensated sum that reaches an infinity forgets its compensation in 3 (inf - inf would make it NaN)
    ("avg(data)", ("data{a=\"1\"} 1", "data{a=\"2\"} +Inf"), [({}, math.inf)], [({}, math.inf)]),
    # 3 drops its type-and-unit metadata labels with the name (type_and_unit.test at v3.14.0)
    ('-x{__type__="counter"}', ('x{__type__="counter",__unit__="request",a="1"} 1',),
     [({"__type__": "counter", "__unit__": "request", "a": "1"}, -1.0)], [({"a": "1"}, -1.0)]),
])
def test_what_a_promtool_file_cannot_state(expr: str, series: tuple[str, ...], as_2: object, as_3: object) -> None:
    assert (evaluate(2, expr, *series), evaluate(3, expr, *series)) == (as_2, as_3)


def test_the_setting_takes_2_or_3_and_defaults_to_3() -> None:
    assert load(env={}).config.promql_compat == 3
    assert load(env={"OUTRIDER_PROMQL_COMPAT": "2"}).config.promql_compat == 2
    for wrong in ("4", "2.5", "three"):
        with pytest.raises(ConfigError, match="promql_compat"):
            load(env={"OUTRIDER_PROMQL_COMPAT": wrong})
    with pytest.raises(ValueError, match="promql_compat"):
        promql.Compat.of(4)


@pytest.mark.parametrize(("bound", "stored"), [
    (1.0, "1.0"), (0.1, "0.1"), (0.0001, "0.0001"), (0.00001, "1e-05"), (100000.0, "100000.0"),
    (1000000.0, "1e+06"), (2.5e6, "2.5e+06"), (123456789.0, "1.23456789e+08"), (0.0, "0.0"), (math.inf, "+Inf"),
])
def test_le_is_stored_as_prometheus_3_normalises_it(bound: float, stored: str) -> None:
    """labels.FormatOpenMetricsFloat: Go's shortest %g, with ".0" where it has neither "." nor an exponent."""
    assert normalised_le(bound) == stored


def test_rules_check_names_the_semantics_and_warns_where_2_and_3_differ(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "r.yaml"
    rules.write_text("groups:\n- name: g\n  rules:\n"
                     "  - alert: Slow\n    expr: rate(x_bucket{le=\"1000000.0\"}[5m]) > 0\n"
                     "  - record: up:plain\n    expr: up{job=~\"a.b\"}\n")
    assert cli.main(["rules", "check", "--promql-compat", "2", str(rules)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{rules}: ok (2 rules the agent can evaluate, as Prometheus 2 evaluates them: promql_compat 2)"
    assert out[1] == (f"{rules}: warning: group 'g', alert 'Slow': le=\"1000000.0\" selects nothing scraped by "
                      "Prometheus 3, which stores that bucket as le=\"1e+06\" (Prometheus 2 keeps the page's text)")
    assert out[2].startswith(f"{rules}: 1 rule read range windows") and out[2].endswith(": Slow")
    assert out[3].startswith(f"{rules}: 1 rule match regexes whose `.`") and out[3].endswith(": up:plain")
    assert len(out) == 4


def test_rules_test_takes_a_test_file_over_4_mib_as_promtool_does(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "r.yaml").write_text("groups:\n- name: g\n  rules:\n  - record: one\n    expr: vector(1)\n")
    test = tmp_path / "big.test.yaml"
    test.write_text("# " + "x" * (5 * 1024 * 1024) + "\nrule_files: [r.yaml]\nevaluation_interval: 1m\ntests:\n"
                    "- promql_expr_test:\n  - expr: one\n    eval_time: 0m\n"
                    "    exp_samples: [{labels: one, value: 1}]\n")
    assert cli.main(["rules", "test", "--promql-compat", "2", str(test)]) == 0
    assert "SUCCESS" in capsys.readouterr().out


@pytest.mark.parametrize(("compat", "le"), [(2, "1000000.0"), (3, "1e+06")])
def test_the_engine_stores_the_agents_buckets_as_that_prometheus_would(compat: int, le: str) -> None:
    name = "outrider_request_duration_seconds"
    rules = parse_groups({"groups": [{"name": "g", "rules": [
        {"record": "big", "expr": f'{name}_bucket{{le="{le}"}}'}]}]}, "test")
    engine = RuleEngine(rules, 1.0, None, compat=compat)
    defn = CATALOG[name]
    engine.ingest([Family(defn).add(HistogramValue((1e6,), (3, 0), 1.0), *[""] * len(defn.labels))], 1000)
    got = engine.evaluator.vector(promql.parse(f'{name}_bucket{{le="{le}"}}'), 1000)
    assert [s.value for s in got] == [3.0]
