"""`outrider rules test` and the embedded evaluator against promtool on the places they used to disagree: each case
is a small promtool test file run by both, and both must reach the same verdict (and the verdict named here).

- series expansion: promtool adds the step again and again ('0+0.1x10' ends at 0.9999999999999999, not 1.0);
- expression values compare exactly, as promtool does (and NaN never equals NaN);
- quantile() and quantile_over_time() sort NaN before every number, whatever order the series come in (and
  quantile_over_time takes its range as the second argument);
- label matchers are cached by what a selector says, not by the id() of a parsed node that a later expression
  (every promql_expr_test is parsed on its own) can inherit once the first is freed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrider.rules.promtest import expand_values, run_file
from tests.conftest import need_binary

RULES = {"groups": [{"name": "r", "rules": [{"record": "r:a:sum", "expr": "sum(a)"}]}]}


def both(tmp_path: Path, case: dict[str, Any]) -> tuple[bool, bool, str]:
    """(promtool passed, the embedded replay passed, what they said) for one test case."""
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(RULES))
    test = tmp_path / "t.test.yaml"
    test.write_text(yaml.safe_dump({"rule_files": ["r.yaml"], "evaluation_interval": "1m", "tests": [case]},
                                   width=1000))
    prom = subprocess.run([need_binary("promtool"), "test", "rules", str(test)], capture_output=True, text=True)
    failures = [f for r in run_file(test, compat=2) for f in r.failures]
    return prom.returncode == 0, failures == [], prom.stdout + prom.stderr + "\n".join(failures)


def expr_case(series: dict[str, str], tests: list[tuple[str, str, list[tuple[str, float]]]]) -> dict[str, Any]:
    return {"interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "promql_expr_test": [{"expr": expr, "eval_time": at,
                                  "exp_samples": [{"labels": labels, "value": value} for labels, value in samples]}
                                 for expr, at, samples in tests]}


def test_series_expand_step_by_step_like_promtool() -> None:
    assert expand_values("0+0.1x10")[-1] == 0.9999999999999999
    assert expand_values("1-0.1x10")[-1] == sum([-0.1] * 10, 1.0)
    assert expand_values("5x2 _x2 1+1x1") == [5.0, 5.0, 5.0, None, None, 1.0, 2.0]


@pytest.mark.parametrize(("want", "passes"), [(0.9999999999999999, True), (1.0, False)])
def test_expanded_values_compare_exactly_as_promtool_does(tmp_path: Path, want: float, passes: bool) -> None:
    case = expr_case({'a{x="1"}': "0+0.1x10", 'b{x="1"}': "1-0.3x3"},
                     [("a", "10m", [('a{x="1"}', want)]), ("b", "3m", [('b{x="1"}', 1 - 0.3 - 0.3 - 0.3)])])
    prom, embedded, said = both(tmp_path, case)
    assert (prom, embedded) == (passes, passes), said


def test_an_expected_nan_never_matches_in_either(tmp_path: Path) -> None:
    case = expr_case({'a{x="1"}': "NaN"}, [("a", "0m", [('a{x="1"}', float("nan"))])])
    prom, embedded, said = both(tmp_path, case)
    assert (prom, embedded) == (False, False), said


@pytest.mark.parametrize("order", [("1", "NaN", "3"), ("NaN", "3", "1"), ("3", "1", "NaN")])
def test_quantile_sorts_nan_first_whatever_the_series_order(tmp_path: Path, order: tuple[str, ...]) -> None:
    series = {f'c{{x="{i}"}}': v for i, v in enumerate(order)}
    series['d{x="0"}'] = " ".join(order)
    # [NaN, 1, 3]: the median is 1 and the 0.75-quantile 2, in Prometheus; a NaN left in the middle makes both NaN
    case = expr_case(series, [("quantile(0.5, c)", "0m", [("{}", 1.0)]),
                              ("quantile(0.75, c)", "0m", [("{}", 2.0)]),
                              ("quantile_over_time(0.5, d[2m])", "2m", [('{x="0"}', 1.0)])])
    prom, embedded, said = both(tmp_path, case)
    assert (prom, embedded) == (True, True), said


def test_each_expression_gets_its_own_matchers(tmp_path: Path) -> None:
    """Before: matchers cached by id() of the parsed selector; `count(b)` parsed after `count(a)` was freed could
    inherit a's matchers and count a's series (or none)."""
    series = {'a{x="1"}': "1", 'a{x="2"}': "1", 'b{x="1"}': "1", 'c{y="1"}': "1", 'c{y="2"}': "1", 'c{y="3"}': "1"}
    tests = []
    for _ in range(10):
        tests += [("count(a)", "0m", [("{}", 2.0)]), ("count(b)", "0m", [("{}", 1.0)]),
                  ('count(c{y!="2"})', "0m", [("{}", 2.0)]), ("r:a:sum", "0m", [("r:a:sum", 2.0)])]
    prom, embedded, said = both(tmp_path, expr_case(series, tests))
    assert (prom, embedded) == (True, True), said
