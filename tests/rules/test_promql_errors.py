"""The embedded PromQL evaluator's refusals, message by message: what a rule's failed evaluation says (it is
logged and counted per rule, and shown by `outrider rules test`), for the vector-matching errors Prometheus also
raises, and for the defensive checks behind the parser (an argument of the wrong type, an operator or function
outside the subset), which a parser upgrade letting something new through would reach.

The corpus (test_promql_corpus.py) pins values against promtool; promtool cannot say what an error reads, so these
are pinned here whole, not by a fragment. Two things the engine reads besides values sit here too: the matcher cache's
key, and how far back each selector reads (what the store keeps)."""

from __future__ import annotations

import pytest

from outrider.rules import promql
from outrider.rules.promql import Evaluator, PromQLError
from outrider.rules.promtest import parse_series
from outrider.rules.store import SeriesStore, make_labels


def evaluator(*series: str) -> Evaluator:
    """An evaluator over series written as promtool writes them, each with one sample, 1, at time 0."""
    store = SeriesStore(None)
    for text in series:
        name, pairs = parse_series(text)
        store.add(make_labels(name, pairs), 0, 1.0)
    ev = Evaluator(store)
    ev.ts = 0
    return ev


def refusal(ev: Evaluator, expr: str) -> str:
    with pytest.raises(PromQLError) as e:
        ev.vector(promql.parse(expr), 0)
    return str(e.value)


def test_many_to_many_names_the_group_and_the_side_with_the_duplicates() -> None:
    ev = evaluator('x{a="1",b="p"}', 'y{a="1",b="q"}', 'y{a="1",b="r"}')
    assert refusal(ev, "x + on(a) y") == ("found duplicate series for the match group {'a': '1'} on the right hand "
                                          "side of the operation: many-to-many matching not allowed")
    ev = evaluator('x{a="1",b="p"}', 'x{a="1",b="q"}', 'y{a="1",b="r"}')
    assert refusal(ev, "x + on(a) group_right y") == (
        "found duplicate series for the match group {'a': '1'} on the left hand side of the operation: "
        "many-to-many matching not allowed")


def test_many_to_one_without_a_group_modifier_is_refused() -> None:
    ev = evaluator('x{a="1",b="p"}', 'x{a="1",b="q"}', 'y{a="1"}')
    assert refusal(ev, "x + on(a) y") == ("multiple matches for labels {'a': '1'}: many-to-one matching must be "
                                          "explicit (group_left/group_right)")
    assert [s.value for s in ev.vector(promql.parse("x + on(a) group_left y"), 0)] == [2.0, 2.0]


def test_a_group_modifier_that_makes_two_results_alike_is_refused() -> None:
    ev = evaluator('m1{a="1"}', 'm2{a="1"}', 'y{a="1"}')
    assert refusal(ev, '{__name__=~"m.*"} + on(a) group_left y') == (
        "multiple matches for the same label set on the 'one' side: vector cannot contain metrics with the same "
        "labelset")
    assert len(ev.vector(promql.parse('{__name__=~"m.*"} > on(a) group_left y - 1'), 0)) == 2, \
        "a comparison keeps each side's name: no two alike"


def test_a_rule_giving_a_string_is_refused() -> None:
    assert refusal(evaluator(), '"text"') == "a rule's expression must give a vector or a scalar, not a string"


def test_arguments_of_the_wrong_type_are_refused_by_the_evaluator_too() -> None:
    """The parser checks types first; these are the evaluator's own checks behind it."""
    ev = evaluator('x{a="1"}', 'x{a="2"}')
    for method, expr, message in (
            (ev._scalar, "x", "expected a scalar argument"),
            (ev._scalar, '"a"', "expected a scalar argument"),
            (ev._string, "x", "expected a string argument"),
            (ev._vector, "1", "expected an instant vector argument"),
            (ev._vector, '"a"', "expected an instant vector argument")):
        with pytest.raises(PromQLError) as e:
            method(promql.parse(expr))
        assert str(e.value) == message, expr
    assert ev._scalar(promql.parse("vector(3)")) == 3.0, "a one-element vector reads as its value"
    assert ev._scalar(promql.parse("2 * 4")) == 8.0
    assert ev._string(promql.parse('"a"')) == "a"


def test_what_is_outside_the_subset_is_named() -> None:
    cases = (
        (lambda: promql._aggregate_values("count_values", [1.0], 0.0, promql.COMPAT_3),
         "the aggregation count_values"),
        (lambda: promql._simple_function("atan", []), "the function atan()"),
        (lambda: promql._range_function("holt_winters", [0, 1], [1.0, 2.0], promql.Window(60.0, 0, 1, 1), [],
                                               promql.COMPAT_3),
         "the function holt_winters()"),
        (lambda: promql._apply("atan2", 1.0, 2.0), "the operator atan2"),
    )
    for call, message in cases:
        with pytest.raises(PromQLError) as e:
            call()
        assert str(e.value) == message


def test_an_expression_outside_the_subset_that_reaches_the_evaluator_is_named() -> None:
    """check() refuses subqueries when a rule loads; the evaluator names what it cannot evaluate all the same."""
    assert refusal(evaluator('x{a="1"}'), "x[5m:1m]") == "cannot evaluate SubqueryExpr"


def test_selectors_that_differ_only_in_a_matchers_label_are_not_mixed_up() -> None:
    """The evaluator caches each selector's compiled matchers by what the selector says."""
    ev = evaluator('x{a="1"}', 'x{b="1"}')
    assert [dict(s.labels) for s in ev.vector(promql.parse('x{a="1"}'), 0)] == [{"__name__": "x", "a": "1"}]
    assert [dict(s.labels) for s in ev.vector(promql.parse('x{b="1"}'), 0)] == [{"__name__": "x", "b": "1"}]
    assert [dict(s.labels) for s in ev.vector(promql.parse('x{a!="1"}'), 0)] == [{"__name__": "x", "b": "1"}]


def test_each_selector_says_how_far_back_it_reads() -> None:
    """What the rule engine keeps of each series (rules/rule.retention): the lookback or the range, plus the
    offset."""
    got = [(promql.selector_name(vs), ms) for vs, ms in
           promql.selectors(promql.parse("rate(x[2m] offset 1m) + -(y offset 30s) + sum(z)"))]
    assert got == [("x", 180_000), ("y", 330_000), ("z", 300_000)]


@pytest.mark.parametrize(("expr", "depth"), [
    ("x", 2), ("a + b + c", 4), ("(a + b)", 4), ("sum(rate(x[5m]))", 4), ('x{a="-1",b!="+"}', 2),
    ("a and b or c", 4), ("a atan2 b", 3), ("-x", 3), ("a > 1", 3), ("a != b", 3), ("a)", 2), ("((a + b", 5),
    ('x{a="("} * (y{b="}"} - 1)', 5), ("((a)) + b", 5), ("f(g(h(x) + 1))", 6),
    ("(a) + (b) + (c)", 5), ("Xa + b", 3)])
def test_the_depth_bound_read_from_the_text(expr: str, depth: int) -> None:
    """nesting(): one level per bracketed group, one per operator in it, two for the selector; matchers, strings
    and ranges add nothing; a stray or missing bracket still gives a bound."""
    assert promql.nesting(expr) == depth


def test_an_expression_nested_past_the_bound_is_refused_before_parsing() -> None:
    at_bound = "x" + " + x" * (promql.MAX_DEPTH - 2)
    assert promql.nesting(at_bound) == promql.MAX_DEPTH
    promql.parse(at_bound)
    with pytest.raises(PromQLError) as e:
        promql.parse(at_bound + " + x")
    assert str(e.value) == (f"an expression nested more than {promql.MAX_DEPTH} levels deep (brackets, calls and "
                            "operators counted), which the agent's embedded evaluator does not take; the rule still "
                            "works in Prometheus")
    with pytest.raises(PromQLError) as e:
        promql.parse("rate(x)")
    assert str(e.value) == "cannot parse: expected type matrix in call to function 'rate', got vector"


@pytest.mark.parametrize(("expr", "message"), [
    ("x @ 10", "the @ modifier"),
    ('x{a="1" or b="2"}', "'or' inside a label matcher"),
    ("max_over_time(x[5m:1m])", "a subquery as the argument of max_over_time()"),
    ("x[5m:1m]", "a subquery ([range:step])"),
    ('x{a=~"a{1001}"}', "the pattern 'a{1001}' is not a regular expression RE2 takes (invalid repetition size: "
                        "{1001})"),
    ('label_replace(x, "a", "b", "c", "a{1001}")',
     "the pattern 'a{1001}' is not a regular expression RE2 takes (invalid repetition size: {1001})")])
def test_what_check_refuses_is_named(expr: str, message: str) -> None:
    with pytest.raises(PromQLError) as e:
        promql.check(promql.parse(expr))
    assert str(e.value) == message


def test_an_equality_matchers_value_is_no_pattern() -> None:
    for expr in ('x{a="("}', 'x{a="a{1001}"}', 'x{a!="["}', "x[5m]"):
        promql.check(promql.parse(expr))
