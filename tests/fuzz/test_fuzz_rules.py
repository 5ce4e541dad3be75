"""Rule files, expressions, templates, receivers files and promtool series notation, fuzzed with hypothesis: every
bad input is a RuleLoadError / NotifyConfigError / PromTestError that names the file, and the group, rule and
construct where there is one, or it loads; a rule file loads exactly when Prometheus's own `promtool check rules`
takes it; an expression that loads evaluates over any store without an exception other than PromQLError (which the
engine counts)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import promql_parser as pp
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from outrider.notify import NotifyConfigError, parse_receivers
from outrider.rules import promql
from outrider.rules.promql import Evaluator, PromQLError
from outrider.rules.promtest import PromTestError, expand_values
from outrider.rules.rule import RuleLoadError, load_groups, parse_groups
from outrider.rules.store import SeriesStore, make_labels
from outrider.rules.templates import Template, TemplateError
from tests.conftest import need_binary

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


WHERE_A = "fuzz: group 'g', alert 'A': "


def tree_depth(node: Any) -> int:
    """The depth of a parsed expression, walked without recursion (the thing MAX_DEPTH bounds)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        n, depth = stack.pop()
        deepest = max(deepest, depth)
        children: list[Any] = []
        if isinstance(n, (pp.ParenExpr, pp.UnaryExpr, pp.AggregateExpr)):
            children = [n.expr] + ([n.param] if isinstance(n, pp.AggregateExpr) and n.param is not None else [])
        elif isinstance(n, pp.BinaryExpr):
            children = [n.lhs, n.rhs]
        elif isinstance(n, pp.Call):
            children = list(n.args)
        elif isinstance(n, pp.MatrixSelector):
            children = [n.vector_selector]
        stack.extend((c, depth + 1) for c in children)
    return deepest


@FAST
@given(expr=expressions(), values=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=30))
def test_generated_expressions_load_and_evaluate_or_fail_cleanly(expr: str, values: list[float]) -> None:
    try:
        groups = parse_groups({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": expr}]}]}, "fuzz")
    except RuleLoadError as e:
        assert str(e).startswith(WHERE_A) and len(str(e)) > len(WHERE_A), str(e)
        return
    rule = groups[0].rules[0]
    assert rule.expr_text == expr.strip()
    assert promql.nesting(expr) >= tree_depth(rule.expr), "the depth bound read from the text is an upper bound"
    ev = Evaluator(store(values))
    for ts in (0, 60_000, 300_000, 3_600_000):
        try:
            vector = ev.vector(rule.expr, ts)
        except PromQLError as e:  # counted by the engine as a failed evaluation, with this text
            assert str(e), "an evaluation failure says what failed"
            continue
        for sample in vector:
            assert isinstance(sample.value, float)
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in sample.labels)


@FAST
@given(text=st.one_of(st.text(max_size=300), st.text(alphabet="()-+ab{}[]\"'#,", max_size=300)))
def test_arbitrary_expression_text_is_a_load_error_or_loads(text: str) -> None:
    try:
        groups = parse_groups({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": text}]}]}, "fuzz")
    except RuleLoadError as e:
        assert str(e).startswith(WHERE_A) and len(str(e)) > len(WHERE_A), str(e)
        if text.strip():  # what is wrong: the parser's complaint, the construct, the depth, or a missing expr
            assert re.search(r"cannot parse|uses |nested more than|no expr|selector without", str(e)), str(e)
        return
    assert groups[0].rules[0].expr_text == text.strip()


# A rule file's structure with a valid value, a scalar of another type, or a list or mapping at every field. None
# is left out of alert, record and expr, where Prometheus reads it as the text "null" and the files would differ
# only in what the agent names the rule; limit takes only 0, as the agent refuses any other (it does not apply it).
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(
    ["", "g", "5m", "0", "up", "a b", "__name__", "x:y", "1h5m", "5m1h", "-5m"]))
WRONG = st.one_of(st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.sampled_from(["a", "b"]),
                                                                          st.integers(0, 3), max_size=2))


def mostly(common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`common` five times in six (one_of would pick each half the time): most files get as far as their rules."""
    return st.integers(0, 5).flatmap(lambda i: rare if i == 5 else common)


def field(valid: st.SearchStrategy[Any], nullable: bool = True) -> st.SearchStrategy[Any]:
    scalars = SCALARS if nullable else SCALARS.filter(lambda v: v is not None)
    return mostly(valid, st.one_of(scalars, WRONG))


def sometimes_unknown(fields: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return mostly(fields, st.tuples(fields, SCALARS).map(lambda t: {**t[0], "lables": t[1]}))


DURATIONS = st.sampled_from(["0", "30s", "5m", "1h30m", 0])
NAMED_VALUES = st.dictionaries(st.sampled_from(["severity", "a", "summary", "bad name", "__name__", "__x", "5"]),
                               st.one_of(st.sampled_from(["page", "x"]), SCALARS, WRONG), max_size=2)
RULE_NAMES = {"alert": st.sampled_from(["A", "B"]), "record": st.sampled_from(["job:up:sum", "bad name"])}


def rules(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    other = "record" if kind == "alert" else "alert"
    core = st.fixed_dictionaries(
        {kind: field(RULE_NAMES[kind], nullable=False),
         "expr": field(st.sampled_from(["up", "sum by (job) (up)", "rate(x_total[5m]) > 0", "up +", "5"]),
                       nullable=False)},
        optional={"for": field(DURATIONS), "keep_firing_for": field(DURATIONS), "labels": field(NAMED_VALUES),
                  "annotations": field(NAMED_VALUES)})
    both = st.tuples(core, field(RULE_NAMES[other], nullable=False)).map(lambda t: {**t[0], other: t[1]})
    return sometimes_unknown(mostly(core, both))


RULES = st.one_of(rules("alert"), rules("record"))
GROUPS = sometimes_unknown(st.fixed_dictionaries(
    {"name": field(st.sampled_from(["g", "h", "i"])), "rules": field(st.lists(field(RULES), min_size=1, max_size=3))},
    optional={"interval": field(DURATIONS), "limit": mostly(st.just(0), st.sampled_from([None, "x", True, [1]]))}))
RULE_FILES = mostly(sometimes_unknown(st.fixed_dictionaries({"groups": field(st.lists(field(GROUPS), min_size=1,
                                                                                      max_size=3))})),
                    st.one_of(SCALARS, WRONG))
# Where a refusal says the problem is: the file, then a group (by name, or position), then a rule in it.
LOCATION = re.compile(r"^(file )?(?P<file>[^:]+): (group (\d+|'[^']*')(, (rule \d+|alert '[^']*'|recording rule "
                      r"'[^']*'))?: )?\S")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                     HealthCheck.function_scoped_fixture])
@given(doc=RULE_FILES)
# Found by this test once: Prometheus reads alert/record/expr as YAML nodes, whose text a list or mapping has none of
@example(doc={"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up"},
                                                 {"alert": "A", "expr": "up", "record": []}]}]})
@example(doc={"groups": [{"name": "g", "rules": [{"alert": "A", "expr": ["up"]}]}]})
# and once in a clean-clone CI run: `for: null` is Prometheus' zero duration, which the agent refused as ''
@example(doc={"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up", "for": None}]}]})
@example(doc={"groups": [{"name": "g", "rules": [{"record": "r", "expr": "up", "keep_firing_for": None}]}]})
def test_a_rule_file_loads_exactly_when_prometheus_takes_it(tmp_path_factory: pytest.TempPathFactory,
                                                           doc: object) -> None:
    path = tmp_path_factory.mktemp("rules") / "r.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        load_groups([path])
        error = None
    except RuleLoadError as e:  # never a TypeError, AttributeError or OverflowError
        error = str(e)
    prometheus = subprocess.run([need_binary("promtool"), "check", "rules", str(path)], capture_output=True,
                                text=True)
    assert (error is None) == (prometheus.returncode == 0), f"agent: {error}\npromtool: {prometheus.stdout}" \
                                                            f"{prometheus.stderr}\n{path.read_text()}"
    if error is not None:
        m = LOCATION.match(error)
        assert m and m.group("file") == str(path), error


@FAST
@given(text=st.text(max_size=200), value=st.floats(allow_nan=True, allow_infinity=True),
       labels=st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=4))
def test_templates_are_refused_at_load_or_render(text: str, value: float, labels: dict[str, str]) -> None:
    try:
        template = Template(text, "fuzz: group 'g', alert 'A': annotation summary")
    except TemplateError as e:
        assert str(e).startswith("fuzz: group 'g', alert 'A': annotation summary: "), str(e)
        assert "{{" in text, "only an action can be outside the subset"
        return
    rendered = template.render(labels, value)
    assert isinstance(rendered, str)
    if "{{" not in text:
        assert rendered == text, "text without an action renders as itself"


@FAST
@given(doc=st.recursive(st.one_of(st.none(), st.integers(), st.text(max_size=30)),
                        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(
                            st.sampled_from(["receivers", "name", "type", "url", "match", "match_re", "timeout_s",
                                             "routing_key", "url_env", "routing_key_file"]), inner, max_size=5)),
                        max_leaves=15))
def test_arbitrary_receivers_files_are_a_config_error_or_load(doc: object) -> None:
    try:
        loaded = parse_receivers(doc, "receivers_file fuzz")
    except NotifyConfigError as e:
        assert str(e).startswith("receivers_file fuzz: "), str(e)
        receivers = doc.get("receivers") if isinstance(doc, dict) else None
        if isinstance(receivers, list) and receivers and "top-level" not in str(e):
            assert re.match(r"receivers_file fuzz: receiver (\d+|'[^']*')", str(e)), str(e)
        return
    assert isinstance(doc, dict) and [n.name for n, _ in loaded] == [r["name"] for r in doc["receivers"]]


@FAST
@given(text=st.text(alphabet="0123456789+-x_ .eInfNastl", max_size=40))
def test_series_notation_is_a_clear_error_or_values(text: str) -> None:
    try:
        values = expand_values(text)
    except PromTestError as e:  # names the token or the series it could not read
        assert re.match(r"(cannot read series( value)? |series )'", str(e)), str(e)
        quoted = re.search(r"'(.*)'", str(e))
        assert quoted and quoted.group(1) in text, str(e)
        return
    assert len(values) <= 1_000_000 * max(1, len(text.split()))


def test_a_broken_rule_file_on_disk_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("groups: [\n")
    with pytest.raises(RuleLoadError) as e:
        load_groups([path])
    assert str(path) in str(e.value) and "YAML" in str(e.value)
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"alert": "A"}]}]}))
    with pytest.raises(RuleLoadError) as e:  # it passed on a file that loaded before: no `else: raise`
        load_groups([path])
    assert str(e.value) == f"{path}: group 'g', alert 'A': no expr"


def test_a_series_that_would_expand_without_bound_is_refused() -> None:
    with pytest.raises(PromTestError, match="more than 1000000 samples"):
        expand_values("0+1x99999999999")
    assert expand_values("1+2x2 _x2 stale")[:3] == [1.0, 3.0, 5.0]
