"""The PromQL subset the agent evaluates itself, over its own bounded store (rules/store.py).

Expressions are parsed with `promql-parser` (Prometheus's grammar, in Rust); this module checks that a parsed
expression stays inside the subset (`check`) and evaluates it at one instant (`Evaluator.instant`), as Prometheus 3
evaluates it (`compat=3`, the agent's default) or as Prometheus 2 does (`compat=2`, the version `promtool` runs in
CI). Where the two differ (the `Compat` switches below, docs/alerting.md) both are implemented, each checked by a
case for both: tests/rules/promql_compat_v2.test.yaml (promtool 2.42 states its values), promql_compat_v3.test.yaml
(values Prometheus 3's own test files state) and test_promql_compat.py. The corpus (promql_corpus.test.yaml) and
every alert test in alerts/tests are replayed through the evaluator under 2 and checked by promtool
(rules/promtest.py); scripts/promql_conformance.py runs Prometheus's own PromQL test files under either.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import promql_parser as pp

from outrider.ground import regex
from outrider.metrics.quantile import bucket_value
from outrider.rules.store import Labels, Series, SeriesStore
from outrider.rules.templates import go_v
from outrider.shared import prometheus_names

LOOKBACK_MS = 300_000
NAME = "__name__"
# The labels Prometheus 3 drops with the name (the metadata labels of its type-and-unit feature); 2 knows only one
METADATA_3 = frozenset({NAME, "__type__", "__unit__"})
COMPATS = (2, 3)


@dataclass(frozen=True)
class Compat:
    """Where Prometheus 2 and 3 evaluate the same expression differently, each a switch of its own so that the
    code says which difference it applies. docs/alerting.md lists them side by side."""

    version: int
    # A range [r] selects (t - r, t] and the lookback (t - 5m, t]: 2 closes both on the left
    left_open: bool
    # `.` in a regex matches a newline (matchers and label_replace): 2 compiles without the s flag
    dot_matches_newline: bool
    # Kahan-compensated sum() and avg() (a direct mean until the sum overflows): 2 adds one by one
    compensated_aggregation: bool
    # stddev/stdvar of a group whose first value is NaN or infinite is NaN: 2 starts from 0
    nan_first_deviation: bool
    # A comparison that filters the many side still counts its matches (an error without group_left): 2 filters first
    match_before_filter: bool
    # A destination label of label_replace is any UTF-8 name: 2 takes [a-zA-Z_][a-zA-Z0-9_]*
    utf8_label_names: bool
    # A Kahan sum that reaches an infinity forgets its compensation (no inf - inf = NaN): 2 keeps it
    kahan_forgets_at_infinity: bool
    # topk/bottomk with k below 1 give nothing before k is checked (topk(-Inf, x) is empty): 2 refuses it first
    k_below_one_first: bool
    # rate/increase take a gap to the window's start longer than 1.1 sample intervals as half an interval before
    # cutting it where the counter was zero (2.51 and later): 2.42, which promtool runs in CI, cuts it first
    zero_cut_after_gap: bool
    labels_dropped_with_name: frozenset[str]

    @staticmethod
    def of(version: int) -> Compat:
        if version not in COMPATS:
            raise ValueError(f"promql_compat: {version!r} is not one of {', '.join(map(str, COMPATS))}")
        three = version >= 3
        return Compat(version, three, three, three, three, three, three, three, three, three,
                      METADATA_3 if three else frozenset({NAME}))


COMPAT_2, COMPAT_3 = Compat.of(2), Compat.of(3)


class PromQLError(ValueError):
    """An expression that cannot be parsed, is outside the subset, or fails when evaluated."""


@dataclass
class Sample:
    labels: Labels
    value: float


Vector = list[Sample]
Value = Vector | float | str
MatcherKey = tuple[str, tuple[tuple[str, str, str], ...]]

# The parser's stub (promql_parser/__init__.pyi, 0.12) types each enum member as Any (`Re: Any`, `By: Any`): the
# members used here are named once as what they are, so that comparing with another enum's member is a type error
# (mypy's strict_equality), as it would be were the stub right.
MATCH_EQUAL: pp.MatchOp = pp.MatchOp.Equal
MATCH_NOT_EQUAL: pp.MatchOp = pp.MatchOp.NotEqual
MATCH_RE: pp.MatchOp = pp.MatchOp.Re
MATCH_NOT_RE: pp.MatchOp = pp.MatchOp.NotRe
AGG_BY: pp.AggModifierType = pp.AggModifierType.By
LABELS_ON: pp.LabelModifierType = pp.LabelModifierType.Include
ONE_TO_ONE: pp.VectorMatchCardinality = pp.VectorMatchCardinality.OneToOne
ONE_TO_MANY: pp.VectorMatchCardinality = pp.VectorMatchCardinality.OneToMany


def args_of(call: pp.Call) -> list[pp.Expr]:
    """A call's arguments. The stub types them `List[Any]`; the parser gives an expression for each."""
    return call.args


def param_of(node: pp.AggregateExpr) -> pp.Expr | None:
    """An aggregation's parameter (topk's k, quantile's phi). The stub types it `Optional[Any]`; the parser gives an
    expression, or None for an aggregation that takes none."""
    return node.param


# --- the subset -------------------------------------------------------------------------------------------------

RANGE_FUNCTIONS = {
    "rate", "increase", "irate", "delta", "idelta", "deriv", "predict_linear", "changes", "resets",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "last_over_time",
    "present_over_time", "quantile_over_time", "stddev_over_time", "stdvar_over_time", "absent_over_time",
}
INSTANT_FUNCTIONS = {
    "abs", "ceil", "floor", "round", "exp", "ln", "log2", "log10", "sqrt", "sgn", "clamp", "clamp_min",
    "clamp_max", "histogram_quantile", "absent", "time", "vector", "scalar", "timestamp", "label_replace",
}
AGGREGATIONS = {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "quantile", "topk", "bottomk"}
ARITHMETIC = {"+", "-", "*", "/", "%", "^"}
COMPARISON = {"==", "!=", ">", "<", ">=", "<="}
SET_OPS = {"and", "or", "unless"}


# How deep an expression may nest. The parser (Rust) overflows its stack and kills the process somewhere past 4,000
# levels (5,000 `up + up + ...` terms are enough), and the evaluator, check() and selectors() recurse once or a few
# times per level of the tree; the catalog's deepest expression nests 15 levels (tests/rules/test_rule_files.py).
MAX_DEPTH = 100

# One lexeme of PromQL, coarsely: a string (to its end if unterminated), a comment, a range or subquery in brackets,
# a bracket, an operator, a word, a number; anything else one character at a time.
_LEXEME = re.compile(r""""(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?|`[^`]*`?|#[^\n]*|\[[^\]]*\]?|[(){}]"""
                     r"|[-+*/%^]|[=!<>~]+|[A-Za-z_][A-Za-z0-9_:]*|[0-9.]+|.", re.DOTALL)
_WORD_OPERATORS = {"and", "or", "unless", "atan2"}


def nesting(expr: str) -> int:
    """An upper bound on the depth of expr's syntax tree, read from the text without parsing it: a bracketed group
    is one level, plus one per operator inside it (a chain `a + b + c` nests as deep as it is long), plus its
    deepest inner group, plus two for the selector at the bottom (a range selector holds an instant one). Label
    matchers, strings, comments and ranges add nothing."""
    groups = [[0, 0]]  # per open bracket: [operators in it, deepest group inside it]
    in_matchers = False
    for m in _LEXEME.finditer(expr):
        token = m.group()
        if in_matchers:
            in_matchers = token != "}"
        elif token == "{":
            in_matchers = True
        elif token == "(":
            groups.append([0, 0])
        elif token == ")" and len(groups) > 1:
            operators, inner = groups.pop()
            groups[-1][1] = max(groups[-1][1], 1 + operators + inner)
        elif token[0] in "-+*/%^=!<>" or token in _WORD_OPERATORS:
            groups[-1][0] += 1
    while len(groups) > 1:  # unclosed brackets: the parser refuses them, but bound what they would have nested
        operators, inner = groups.pop()
        groups[-1][1] = max(groups[-1][1], 1 + operators + inner)
    return 2 + groups[0][0] + groups[0][1]


def parse(expr: str) -> pp.Expr:
    if nesting(expr) > MAX_DEPTH:
        raise PromQLError(f"an expression nested more than {MAX_DEPTH} levels deep (brackets, calls and operators "
                          "counted), which the agent's embedded evaluator does not take; the rule still works in "
                          "Prometheus")
    try:
        return pp.parse(expr)
    except Exception as e:  # the parser raises ValueError/RuntimeError with its own message
        raise PromQLError(f"cannot parse: {e}") from None


def check(node: pp.Expr) -> None:
    """Raise PromQLError naming the first construct outside the embedded subset."""
    if isinstance(node, (pp.NumberLiteral, pp.StringLiteral)):
        return
    if isinstance(node, pp.ParenExpr):
        return check(node.expr)
    if isinstance(node, pp.UnaryExpr):
        return check(node.expr)
    if isinstance(node, pp.VectorSelector):
        if node.at is not None:
            raise PromQLError("the @ modifier")
        if node.matchers.or_matchers:
            raise PromQLError("'or' inside a label matcher")
        for m in node.matchers.matchers:
            if m.op in (MATCH_RE, MATCH_NOT_RE):
                _check_regex(m.value)
        return
    if isinstance(node, pp.MatrixSelector):
        return check(node.vector_selector)
    if isinstance(node, pp.SubqueryExpr):
        raise PromQLError("a subquery ([range:step])")
    if isinstance(node, pp.Call):
        name = node.func.name
        if name not in RANGE_FUNCTIONS and name not in INSTANT_FUNCTIONS:
            raise PromQLError(f"the function {name}()")
        args = args_of(node)
        for arg in args:
            if name in RANGE_FUNCTIONS and isinstance(unwrap(arg), pp.SubqueryExpr):
                raise PromQLError(f"a subquery as the argument of {name}()")
            check(arg)
        pattern = unwrap(args[4]) if name == "label_replace" and len(args) == 5 else None
        if isinstance(pattern, pp.StringLiteral):
            _check_regex(pattern.val)
        return
    if isinstance(node, pp.AggregateExpr):
        op = str(node.op)
        if op not in AGGREGATIONS:
            raise PromQLError(f"the aggregation {op}")
        param = param_of(node)
        if param is not None:
            check(param)
        return check(node.expr)
    if isinstance(node, pp.BinaryExpr):
        op = str(node.op)
        if op not in ARITHMETIC | COMPARISON | SET_OPS:
            raise PromQLError(f"the operator {op}")
        fill = node.modifier.fill_values if node.modifier is not None else None
        if fill is not None and (fill.lhs is not None or fill.rhs is not None):
            raise PromQLError("the fill modifiers (fill, fill_left, fill_right: a Prometheus 3 feature flag)")
        check(node.lhs)
        return check(node.rhs)
    raise PromQLError(f"the expression type {type(node).__name__}")


class PromQLRegexError(PromQLError):
    """A regex matcher or label_replace pattern RE2 refuses: Prometheus refuses it too."""


def _check_regex(pattern: str) -> None:
    """The evaluator matches in linear time, as Prometheus's RE2 does (outrider.ground.regex): what RE2 cannot compile
    is refused when the rule loads rather than failing every evaluation."""
    try:
        regex.compile(pattern, dotall=True)
    except regex.RegexError as e:
        raise PromQLRegexError(f"the pattern {e}") from None


def unwrap(node: pp.Expr) -> pp.Expr:
    """The expression inside any brackets: Prometheus takes a function's argument so (`rate((x[5m]))`)."""
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    return node


def selectors(node: pp.Expr) -> Iterable[tuple[pp.VectorSelector, int]]:
    """(vector selector, how far back it reads in ms: range + offset) for every selector in the expression."""
    if isinstance(node, pp.VectorSelector):
        yield node, _ms(node.offset) + LOOKBACK_MS
    elif isinstance(node, pp.MatrixSelector):
        vs = node.vector_selector
        yield vs, _ms(node.range) + _ms(vs.offset)
    elif isinstance(node, (pp.ParenExpr, pp.UnaryExpr)):
        yield from selectors(node.expr)
    elif isinstance(node, pp.Call):
        for arg in args_of(node):
            yield from selectors(arg)
    elif isinstance(node, pp.AggregateExpr):
        yield from selectors(node.expr)
    elif isinstance(node, pp.BinaryExpr):
        yield from selectors(node.lhs)
        yield from selectors(node.rhs)


@dataclass(frozen=True)
class CompatDifferences:
    """Where an expression's result can differ between Prometheus 2 and 3 (`compat_differences`)."""

    ranges: list[str]  # the range windows it reads ("5m"): a sample exactly on the left edge counts in 2 only
    newline_regexes: list[str]  # regexes whose `.` would meet a newline in a label value: matched in 3 only
    normalised_le: list[tuple[str, str]]  # (le as written, as 3 stores it) where they are not the same


def compat_differences(node: pp.Expr) -> CompatDifferences:
    """What of the expression Prometheus 2 and 3 evaluate differently, read from its syntax (docs/alerting.md,
    Prometheus 2 and 3). The differences of arithmetic (Kahan sums, NaN in stddev) are left out: they change the
    last bits of a value, or a value that is NaN anyway."""
    out = CompatDifferences([], [], [])
    for vs, _ in selectors(node):
        for m in vs.matchers.matchers:
            if m.op in (MATCH_RE, MATCH_NOT_RE) and _dot_outside_class(m.value):
                out.newline_regexes.append(m.value)
            if m.name == "le" and m.op == MATCH_EQUAL:
                with contextlib.suppress(ValueError):
                    stored = normalised_le(float(m.value))
                    if stored != m.value:
                        out.normalised_le.append((m.value, stored))
    _walk_compat(node, out)
    return out


def normalised_le(bound: float) -> str:
    """The le label Prometheus 3 stores for a scraped bucket, whatever the page wrote (textparse's
    normalizeFloatsInLabelValues, labels.FormatOpenMetricsFloat): Go's shortest %g, with ".0" added where it has
    neither "." nor "e". It differs from the page's format_le from 1e6 up ("1e+06", not "1000000.0") and below
    1e-4."""
    text = go_v(bound)
    return text if "." in text or "e" in text or "Inf" in text or text == "NaN" else text + ".0"


def _walk_compat(node: pp.Expr, out: CompatDifferences) -> None:
    if isinstance(node, pp.MatrixSelector):
        out.ranges.append(pp.display_duration(node.range))
    elif isinstance(node, (pp.ParenExpr, pp.UnaryExpr)):
        _walk_compat(node.expr, out)
    elif isinstance(node, pp.Call):
        args = args_of(node)
        if node.func.name == "label_replace" and len(args) == 5:
            pattern = unwrap(args[4])
            if isinstance(pattern, pp.StringLiteral) and _dot_outside_class(pattern.val):
                out.newline_regexes.append(pattern.val)
        for arg in args:
            _walk_compat(arg, out)
    elif isinstance(node, pp.AggregateExpr):
        _walk_compat(node.expr, out)
    elif isinstance(node, pp.BinaryExpr):
        _walk_compat(node.lhs, out)
        _walk_compat(node.rhs, out)


def _dot_outside_class(pattern: str) -> bool:
    """Whether the pattern has a `.` that is neither escaped nor inside a [class]: the one that matches any
    character (a newline too, in Prometheus 3)."""
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern.startswith("]", i + 1) or pattern.startswith("^]", i + 1):
                i += 1 + pattern.startswith("^", i + 1)  # a leading ] is a member, not the end
        elif c == ".":
            return True
        i += 1
    return False


def _ms(td: timedelta | None) -> int:
    if td is None:
        return 0
    return round(td.total_seconds() * 1000)


def selector_name(vs: pp.VectorSelector) -> str | None:
    if vs.name:
        return vs.name
    for m in vs.matchers.matchers:
        if m.name == NAME and m.op == MATCH_EQUAL:
            return m.value
    return None


# --- labels -----------------------------------------------------------------------------------------------------

def drop_name(labels: Labels, dropped: frozenset[str] = frozenset({NAME})) -> Labels:
    """The labels less the name (and, as Prometheus 3 drops them with it, `dropped`'s others)."""
    return tuple(kv for kv in labels if kv[0] not in dropped)


def get(labels: Labels, name: str) -> str:
    for k, v in labels:
        if k == name:
            return v
    return ""


def with_label(labels: Labels, name: str, value: str) -> Labels:
    rest = [kv for kv in labels if kv[0] != name]
    if value:
        rest.append((name, value))
    return tuple(sorted(rest))


def _signature(labels: Labels, names: Sequence[str], on: bool) -> Labels:
    if on:
        return tuple(kv for kv in labels if kv[0] in names)
    return tuple(kv for kv in labels if kv[0] not in names and kv[0] != NAME)


def _equals(value: str) -> Callable[[str], bool]:
    return lambda v: v == value


def _matcher(m: pp.Matcher, dot_matches_newline: bool) -> Callable[[str], bool]:
    value = m.value
    if m.op == MATCH_EQUAL:
        return lambda v: v == value
    if m.op == MATCH_NOT_EQUAL:
        return lambda v: v != value
    fullmatch = _fullmatcher(value, dot_matches_newline)
    if m.op == MATCH_RE:
        return lambda v: fullmatch(v) is not None
    return lambda v: fullmatch(v) is None


def _fullmatcher(pattern: str, dot_matches_newline: bool) -> Callable[[str], regex.Match | None]:
    """The pattern's full match, linear in the text whatever the pattern. Prometheus 3 compiles "^(?s:pattern)$":
    "." matches a newline. Prometheus 2 compiles "^(?:pattern)$", without the s flag; for it the pattern is compiled
    so only for a text that has a newline, the one place where the two differ: `.*`, with dotall, stays in
    outrider.ground.regex's linear subset (RE2 is not loaded for the built-in rules)."""
    dotall = regex.compile(pattern, dotall=True)
    if dot_matches_newline:
        return dotall.fullmatch
    strict: list[regex.Pattern] = []

    def fullmatch(text: str) -> regex.Match | None:
        if "\n" not in text:
            return dotall.fullmatch(text)
        if not strict:
            strict.append(regex.compile(pattern))
        return strict[0].fullmatch(text)
    return fullmatch


# --- evaluation -------------------------------------------------------------------------------------------------

class Evaluator:
    """Evaluates parsed expressions against a SeriesStore at an instant (milliseconds since the epoch), as
    Prometheus `compat` (2 or 3) evaluates them."""

    def __init__(self, store: SeriesStore, lookback_ms: int = LOOKBACK_MS, compat: int = 3) -> None:
        self.store = store
        self.compat = Compat.of(compat)
        self.lookback_ms = lookback_ms
        # Compiled matchers by what the selector says (name and matchers), never by id(): a node parsed for one
        # expression and freed can leave its id to a node of the next one (`rules test` parses each expr).
        self._matchers: dict[MatcherKey, list[tuple[str, Callable[[str], bool]]]] = {}

    def instant(self, node: pp.Expr, ts: int) -> Value:
        self.ts = ts
        return self._eval(node)

    def vector(self, node: pp.Expr, ts: int) -> Vector:
        out = self.instant(node, ts)
        if isinstance(out, float):
            return [Sample((), out)]
        if isinstance(out, str):
            raise PromQLError("a rule's expression must give a vector or a scalar, not a string")
        return out

    # selectors

    def _compiled(self, vs: pp.VectorSelector) -> list[tuple[str, Callable[[str], bool]]]:
        key = (vs.name or "", tuple((m.name, str(m.op), m.value) for m in vs.matchers.matchers))
        got = self._matchers.get(key)
        if got is None:
            got = [(m.name, _matcher(m, self.compat.dot_matches_newline)) for m in vs.matchers.matchers]
            if vs.name:
                got.append((NAME, _equals(vs.name)))
            self._matchers[key] = got
        return got

    def _series(self, vs: pp.VectorSelector) -> Iterable[tuple[Labels, Series]]:
        matchers = self._compiled(vs)
        for labels, series in self.store.candidates(selector_name(vs)):
            if all(ok(get(labels, name)) for name, ok in matchers):
                yield labels, series

    def _select_instant(self, vs: pp.VectorSelector) -> Vector:
        ref = self.ts - _ms(vs.offset)
        out = []
        for labels, series in self._series(vs):
            got = series.at(ref, self.lookback_ms, self.compat.left_open)
            if got is not None:
                out.append(Sample(labels, got))
        return out

    def _sample_times(self, vs: pp.VectorSelector) -> list[tuple[Labels, int]]:
        """(labels, time of the sample) for what the instant selector vs selects."""
        ref = self.ts - _ms(vs.offset)
        out = []
        for labels, series in self._series(vs):
            if series.at(ref, self.lookback_ms, self.compat.left_open) is not None:
                out.append((labels, series.times[bisect.bisect_right(series.times, ref) - 1]))
        return out

    def _select_range(self, ms: pp.MatrixSelector) -> list[tuple[Labels, Sequence[int], Sequence[float]]]:
        vs = ms.vector_selector
        end = self.ts - _ms(vs.offset)
        start = end - _ms(ms.range)
        out = []
        for labels, series in self._series(vs):
            times, values = series.window(start, end, self.compat.left_open)
            if times:
                out.append((labels, times, values))
        return out

    # the tree

    def _eval(self, node: pp.Expr) -> Value:
        if isinstance(node, pp.NumberLiteral):
            return float(node.val)
        if isinstance(node, pp.StringLiteral):
            return str(node.val)
        if isinstance(node, pp.ParenExpr):
            return self._eval(node.expr)
        if isinstance(node, pp.UnaryExpr):
            inner = self._eval(node.expr)
            if isinstance(inner, float):
                return -inner
            if isinstance(inner, str):
                raise PromQLError("unary minus on a string")
            return _unique([Sample(self._drop(s.labels), -s.value) for s in inner])
        if isinstance(node, pp.VectorSelector):
            return self._select_instant(node)
        if isinstance(node, pp.Call):
            return self._call(node)
        if isinstance(node, pp.AggregateExpr):
            return self._aggregate(node)
        if isinstance(node, pp.BinaryExpr):
            return self._binary(node)
        raise PromQLError(f"cannot evaluate {type(node).__name__}")

    def _drop(self, labels: Labels) -> Labels:
        return drop_name(labels, self.compat.labels_dropped_with_name)

    # functions

    def _call(self, node: pp.Call) -> Value:
        out = self._function(node.func.name, [unwrap(a) for a in args_of(node)])
        # A function that drops the name can leave two series with one label set: Prometheus refuses the result
        return _unique(out) if isinstance(out, list) else out

    def _function(self, name: str, args: list[pp.Expr]) -> Value:
        if name in RANGE_FUNCTIONS:
            return self._range_call(name, args)
        if name == "time":
            return self.ts / 1000
        if name == "vector":
            return [Sample((), self._scalar(args[0]))]
        if name == "scalar":
            vec = self._vector(args[0])
            return vec[0].value if len(vec) == 1 else math.nan
        if name == "absent":
            vec = self._vector(args[0])
            if vec:
                return []
            vs = args[0] if isinstance(args[0], pp.VectorSelector) else None
            return [Sample(_absent_labels(vs) if vs is not None else (), 1.0)]
        if name == "histogram_quantile":
            return _histogram_quantile(self._scalar(args[0]), self._vector(args[1]), self._drop)
        if name == "label_replace":
            return self._label_replace(self._vector(args[0]), *[self._string(a) for a in args[1:]])
        if name == "timestamp":
            if isinstance(args[0], pp.VectorSelector):  # the time of the sample it selects, as Prometheus gives
                return [Sample(self._drop(labels), t / 1000) for labels, t in self._sample_times(args[0])]
            return [Sample(self._drop(s.labels), self.ts / 1000) for s in self._vector(args[0])]
        vec = self._vector(args[0])
        extra = [self._scalar(a) for a in args[1:]]
        if name == "clamp" and extra[1] < extra[0]:  # a maximum below the minimum: no result, as Prometheus
            return []
        fn = _simple_function(name, extra)
        return [Sample(self._drop(s.labels), fn(s.value)) for s in vec]

    def _range_call(self, name: str, args: list[pp.Expr]) -> Vector:
        # quantile_over_time(phi, m[r]) takes its range second; every other range function first
        at = 1 if name == "quantile_over_time" else 0
        ms = args[at] if len(args) > at else None
        if not isinstance(ms, pp.MatrixSelector):
            raise PromQLError(f"{name}() needs a range vector selector")
        rng = self._select_range(ms)
        if name == "absent_over_time":
            return [] if rng else [Sample(_absent_labels(ms.vector_selector), 1.0)]
        extra = [self._scalar(a) for i, a in enumerate(args) if i != at]
        window = Window(_ms(ms.range) / 1000, self.ts - _ms(ms.vector_selector.offset) - _ms(ms.range),
                        self.ts - _ms(ms.vector_selector.offset), self.ts)
        out = []
        for labels, times, values in rng:
            v = _range_function(name, times, values, window, extra, self.compat)
            if v is not None:
                out.append(Sample(labels if name == "last_over_time" else self._drop(labels), v))
        return out

    def _label_replace(self, vec: Vector, dst: str, repl: str, src: str, regexp: str) -> Vector:
        if not _valid_label_name(dst, self.compat.utf8_label_names):
            raise PromQLError(f"invalid destination label name in label_replace(): {dst}")
        fullmatch = _fullmatcher(regexp, self.compat.dot_matches_newline)
        out = []
        for s in vec:
            m = fullmatch(get(s.labels, src))
            out.append(Sample(with_label(s.labels, dst, _expand(m, repl)) if m else s.labels, s.value))
        return out

    def _scalar(self, node: pp.Expr) -> float:
        v = self._eval(node)
        if isinstance(v, float):
            return v
        if isinstance(v, list) and len(v) == 1:  # scalar() semantics for a one-element vector argument
            return v[0].value
        raise PromQLError("expected a scalar argument")

    def _string(self, node: pp.Expr) -> str:
        v = self._eval(node)
        if not isinstance(v, str):
            raise PromQLError("expected a string argument")
        return v

    def _vector(self, node: pp.Expr) -> Vector:
        v = self._eval(node)
        if not isinstance(v, list):
            raise PromQLError("expected an instant vector argument")
        return v

    # aggregations

    def _aggregate(self, node: pp.AggregateExpr) -> Vector:
        op = str(node.op)
        vec = self._vector(node.expr)
        mod = node.modifier
        by = mod is None or mod.type == AGG_BY
        names = list(mod.labels) if mod is not None else []
        param = self._scalar(self._param(node)) if op in ("quantile", "topk", "bottomk") else 0.0
        if op in ("topk", "bottomk"):
            k = _k(param, self.compat)
            if k < 1:
                return []
        groups: dict[Labels, list[Sample]] = {}
        for s in vec:
            if by:
                key = tuple(kv for kv in s.labels if kv[0] in names)
            else:
                key = tuple(kv for kv in s.labels if kv[0] not in names and kv[0] != NAME)
            groups.setdefault(key, []).append(s)
        out: Vector = []
        for key, members in groups.items():
            if op in ("topk", "bottomk"):
                # NaN ranks last in both, as in Prometheus's heaps (a NaN in a key would leave sorted() unsorted)
                if op == "topk":
                    ranked = sorted(members, key=lambda s: (not math.isnan(s.value), s.value), reverse=True)
                else:
                    ranked = sorted(members, key=lambda s: (math.isnan(s.value), s.value))
                out.extend(ranked[:k])
                continue
            out.append(Sample(key, _aggregate_values(op, [s.value for s in members], param, self.compat)))
        return out

    @staticmethod
    def _param(node: pp.AggregateExpr) -> pp.Expr:
        param = param_of(node)
        if param is None:  # the parser refuses quantile, topk and bottomk without one
            raise PromQLError(f"{node.op} without its parameter")
        return param

    # binary operators

    def _binary(self, node: pp.BinaryExpr) -> Value:
        op = str(node.op)
        mod = node.modifier
        return_bool = bool(mod is not None and mod.return_bool)
        lhs = self._eval(node.lhs)
        rhs = self._eval(node.rhs)
        if isinstance(lhs, str) or isinstance(rhs, str):
            raise PromQLError(f"operator {op} on a string")
        if isinstance(lhs, float) and isinstance(rhs, float):
            value, keep = _apply(op, lhs, rhs)
            return (1.0 if keep else 0.0) if op in COMPARISON else value
        if isinstance(lhs, float) or isinstance(rhs, float):
            return _unique(self._vector_scalar(op, lhs, rhs, return_bool))
        assert isinstance(lhs, list) and isinstance(rhs, list)
        matching = mod.matching if mod is not None else None
        on = matching is not None and matching.type == LABELS_ON
        names = list(matching.labels) if matching is not None else []
        if op in SET_OPS:
            return _set_op(op, lhs, rhs, names, on)
        card = mod.card if mod is not None else ONE_TO_ONE
        include = list(mod.group_labels or []) if mod is not None else []
        return _vector_vector(op, lhs, rhs, Matching(names, on, card, include, return_bool), self.compat)

    def _vector_scalar(self, op: str, lhs: Value, rhs: Value, return_bool: bool) -> Vector:
        swap = isinstance(lhs, float)
        vec, scalar = (rhs, lhs) if swap else (lhs, rhs)
        assert isinstance(vec, list) and isinstance(scalar, float)
        out = []
        for s in vec:
            lv, rv = (scalar, s.value) if swap else (s.value, scalar)
            value, keep = _apply(op, lv, rv)
            if op in COMPARISON and swap:
                value = s.value
            labels = s.labels
            if return_bool:
                value, keep = (1.0 if keep else 0.0), True
            if not keep:
                continue
            if op in ARITHMETIC or return_bool:
                labels = self._drop(labels)
            out.append(Sample(labels, value))
        return out


@dataclass(frozen=True)
class Window:
    """A range function's window: its length in seconds, its start and end (ms), and the evaluation time."""

    range_s: float
    start: int
    end: int
    ts: int


@dataclass(frozen=True)
class Matching:
    """How a binary operator matches two vectors: on/ignoring these names, its cardinality, the labels group_left
    or group_right copies, and `bool`."""

    names: list[str]
    on: bool
    card: pp.VectorMatchCardinality
    include: list[str]
    return_bool: bool


def _unique(vec: Vector) -> Vector:
    """vec, unless two of its samples have one label set, which Prometheus refuses as a result."""
    if len({s.labels for s in vec}) != len(vec):
        raise PromQLError("vector cannot contain metrics with the same labelset")
    return vec


_MIN_INT64, _MAX_INT64 = -(2.0**63), 2.0**63


def _k(param: float, compat: Compat) -> int:
    """topk/bottomk's k, as Prometheus takes it: NaN and what an int64 cannot hold are errors (3 returns nothing
    first for a k below 1, whatever it is)."""
    if compat.k_below_one_first and param < 1:
        return 0
    if math.isnan(param):
        raise PromQLError("Parameter value is NaN" if compat.version >= 3 else "Scalar value NaN overflows int64")
    if not _MIN_INT64 < param < _MAX_INT64:
        raise PromQLError(f"Scalar value {param} overflows int64")
    return int(param)


def _valid_label_name(name: str, utf8: bool) -> bool:
    """Prometheus 3 takes any non-empty UTF-8 name (a parsed string is always UTF-8 here); 2 the legacy grammar."""
    return bool(name) if utf8 else prometheus_names.LABEL_NAME.fullmatch(name) is not None


_TEMPLATE_NAME = re.compile(r"\{(\w+)\}|(\w+)")


def _expand(m: regex.Match, template: str) -> str:
    """label_replace's replacement, as Go's Regexp.ExpandString reads it: $$ is "$"; $name or ${name} a group by
    number (no leading zero) or name, empty when there is none or it did not take part; a $ followed by anything
    else is itself. Backslashes are plain text."""
    out = []
    i = 0
    while (j := template.find("$", i)) >= 0:
        out.append(template[i:j])
        if template.startswith("$", j + 1):
            out.append("$")
            i = j + 2
            continue
        ref = _TEMPLATE_NAME.match(template, j + 1)
        if ref is None:
            out.append("$")
            i = j + 1
            continue
        name = ref.group(1) or ref.group(2)
        i = ref.end()
        number = name.isascii() and name.isdigit() and (name == "0" or name[0] != "0")
        with contextlib.suppress(IndexError):  # no such group: nothing
            out.append(m.group(int(name) if number else name) or "")
    out.append(template[i:])
    return "".join(out)


def _absent_labels(vs: pp.VectorSelector) -> Labels:
    """The labels absent() gives, as Prometheus's createLabelsForAbsentFunction: those of the equality matchers,
    less any label matched also otherwise (twice, or by !=, =~, !~) and any matched to ""."""
    labels: dict[str, str] = {}
    dropped = set()
    for m in vs.matchers.matchers:
        name = m.name
        if name == NAME:
            continue
        if m.op == MATCH_EQUAL and name not in labels:
            labels[name] = m.value
        else:
            dropped.add(name)
    return tuple(sorted((k, v) for k, v in labels.items() if k not in dropped and v))


def _apply(op: str, a: float, b: float) -> tuple[float, bool]:
    """(value, keep): arithmetic gives its value; a comparison keeps the left value where it holds."""
    if op == "+":
        return a + b, True
    if op == "-":
        return a - b, True
    if op == "*":
        return a * b, True
    if op == "/":
        if b == 0:
            if a == 0 or math.isnan(a):
                return math.nan, True
            return math.copysign(math.inf, a) * math.copysign(1.0, b), True
        return a / b, True
    if op == "%":  # Go's math.Mod: NaN for x % 0 and for an infinite or NaN x
        return (math.fmod(a, b) if b != 0 and math.isfinite(a) and not math.isnan(b) else math.nan), True
    if op == "^":  # Go's math.Pow where Python's raises
        try:
            return math.pow(a, b), True
        except ValueError:  # 0 to a negative power (Go: Inf, signed as the 0 for an odd power), or x < 0 to a fraction
            if a == 0:
                return (math.copysign(math.inf, a) if _odd(b) else math.inf), True
            return math.nan, True
        except OverflowError:
            return (-math.inf if a < 0 and _odd(b) else math.inf), True
    if op == "==":
        return a, a == b
    if op == "!=":
        return a, a != b
    if op == ">":
        return a, a > b
    if op == "<":
        return a, a < b
    if op == ">=":
        return a, a >= b
    if op == "<=":
        return a, a <= b
    raise PromQLError(f"the operator {op}")


def _odd(x: float) -> bool:
    """An odd integer, as Go's math.Pow asks (none from 2^53 on)."""
    return abs(x) < 2**53 and x.is_integer() and int(x) % 2 == 1


def _set_op(op: str, lhs: Vector, rhs: Vector, names: list[str], on: bool) -> Vector:
    if op == "and":
        right = {_signature(s.labels, names, on) for s in rhs}
        return [s for s in lhs if _signature(s.labels, names, on) in right]
    if op == "unless":
        right = {_signature(s.labels, names, on) for s in rhs}
        return [s for s in lhs if _signature(s.labels, names, on) not in right]
    left = {_signature(s.labels, names, on) for s in lhs}
    return lhs + [s for s in rhs if _signature(s.labels, names, on) not in left]


def _vector_vector(op: str, lhs: Vector, rhs: Vector, matching: Matching, compat: Compat) -> Vector:
    names, on = matching.names, matching.on
    swapped = matching.card == ONE_TO_MANY
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    one_side: dict[Labels, Sample] = {}
    for s in one:
        sig = _signature(s.labels, names, on)
        if sig in one_side:
            side = "left" if swapped else "right"
            raise PromQLError(f"found duplicate series for the match group {dict(sig)} on the {side} hand side "
                              "of the operation: many-to-many matching not allowed")
        one_side[sig] = s
    one_to_one = matching.card == ONE_TO_ONE
    seen: set[Labels] = set()
    out: Vector = []
    for s in many:
        sig = _signature(s.labels, names, on)
        other = one_side.get(sig)
        if other is None:
            continue
        lv, rv = (other.value, s.value) if swapped else (s.value, other.value)
        value, keep = _apply(op, lv, rv)
        if matching.return_bool:
            value, keep = (1.0 if keep else 0.0), True
        if one_to_one and compat.match_before_filter:
            _match_once(sig, seen)
        if not keep:
            continue
        labels = s.labels
        if op in ARITHMETIC or matching.return_bool:
            labels = drop_name(labels, compat.labels_dropped_with_name)
        if one_to_one:
            labels = tuple(kv for kv in labels if kv[0] in names) if on else tuple(
                kv for kv in labels if kv[0] not in names)
            if not compat.match_before_filter:
                _match_once(sig, seen)
        for name in matching.include:
            labels = with_label(labels, name, get(other.labels, name))
        out.append(Sample(labels, value))
    if not one_to_one:
        keys = [s.labels for s in out]
        if len(set(keys)) != len(keys):
            raise PromQLError("multiple matches for the same label set on the 'one' side: vector cannot contain "
                              "metrics with the same labelset")
    return out


def _match_once(sig: Labels, seen: set[Labels]) -> None:
    """One-to-one matching: a second sample of the many side with this signature is an error."""
    if sig in seen:
        raise PromQLError(f"multiple matches for labels {dict(sig)}: many-to-one matching must be explicit "
                          "(group_left/group_right)")
    seen.add(sig)


def _aggregate_values(op: str, values: list[float], param: float, compat: Compat) -> float:
    n = len(values)
    if op == "sum":
        if compat.compensated_aggregation:
            total = c = 0.0
            for v in values:
                total, c = _kahan(v, total, c, compat)
            return total + c
        total = 0.0  # one by one, neither Kahan nor exactly rounded, as Prometheus 2's sum()
        for v in values:
            total += v
        return total
    if op == "avg":
        return _direct_mean(values, compat) if compat.compensated_aggregation else _running_mean(values)
    if op == "min":
        real = [v for v in values if not math.isnan(v)]
        return min(real) if real else math.nan
    if op == "max":
        real = [v for v in values if not math.isnan(v)]
        return max(real) if real else math.nan
    if op == "count":
        return float(n)
    if op == "group":
        return 1.0
    if op in ("stddev", "stdvar"):  # Welford's, from the first value, as Prometheus's
        mean, aux = values[0], 0.0
        if compat.nan_first_deviation and not math.isfinite(mean):
            aux = math.nan
        for i, v in enumerate(values[1:], 2):
            delta = v - mean
            mean += delta / i
            aux += delta * (v - mean)
        return math.sqrt(aux / n) if op == "stddev" else aux / n
    if op == "quantile":
        return quantile(param, values)
    raise PromQLError(f"the aggregation {op}")


def _running_mean(values: Sequence[float]) -> float:
    """avg() as Prometheus 2's: a running mean (it does not overflow where the sum would); once infinite it stays
    so, unless an infinity of the other sign or a NaN comes."""
    mean = 0.0
    for i, v in enumerate(values, 1):
        if not _stays_infinite(mean, v):
            mean += v / i - mean / i
    return mean


def _direct_mean(values: Sequence[float], compat: Compat) -> float:
    """avg() and avg_over_time() as Prometheus 3's: the Kahan-compensated sum divided by the count, until the sum
    would overflow; from there a compensated running mean."""
    total, c = values[0], 0.0
    mean = 0.0
    incremental = False
    count = 1.0
    for i, v in enumerate(values[1:], 2):
        count = float(i)
        if not incremental:
            new_total, new_c = _kahan(v, total, c, compat)
            if not math.isinf(new_total):
                total, c = new_total, new_c
                continue
            incremental = True
            mean = total / (count - 1)
            c /= count - 1
        q = (count - 1) / count
        mean, c = _kahan(v / count, q * mean, q * c, compat)
    if incremental:
        return mean + c
    return total / count + c / count


def _stays_infinite(mean: float, v: float) -> bool:
    """An infinite mean is kept as it is when v is a number or an infinity of its sign (mean - mean is NaN)."""
    return math.isinf(mean) and (math.isfinite(v) or v == mean)


def _over_time(op: str, values: Sequence[float], compat: Compat) -> float:
    """sum_, avg_, stdvar_ and stddev_over_time as Prometheus's: Kahan-compensated sums (avg_over_time a running
    mean in 2, the direct mean of avg() in 3)."""
    if op == "sum":
        total = c = 0.0
        for v in values:
            total, c = _kahan(v, total, c, compat)
        return total if math.isinf(total) else total + c
    if op == "avg":
        if compat.compensated_aggregation:
            return _direct_mean(values, compat)
        mean = c = 0.0
        for i, v in enumerate(values, 1):
            if not _stays_infinite(mean, v):
                mean, c = _kahan(v / i - mean / i, mean, c, compat)
        return mean if math.isinf(mean) else mean + c
    mean = c_mean = aux = c_aux = 0.0
    for i, v in enumerate(values, 1):
        delta = v - (mean + c_mean)
        mean, c_mean = _kahan(delta / i, mean, c_mean, compat)
        aux, c_aux = _kahan(delta * (v - (mean + c_mean)), aux, c_aux, compat)
    var = (aux + c_aux) / len(values)
    return math.sqrt(var) if op == "stddev" else var


def quantile(q: float, values: Sequence[float]) -> float:
    """Prometheus's quantile: linear interpolation between the closest ranks (phi * (n - 1))."""
    if not values:
        return math.nan
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    # Prometheus sorts NaN before every number (vectorByValueHeap.Less); Python's sorted() leaves a NaN wherever
    # the input put it, so the answer would depend on the order of the series.
    ordered = sorted(values, key=lambda v: (0, 0.0) if math.isnan(v) else (1, v))
    n = len(ordered)
    rank = q * (n - 1)
    lower = max(0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


def _simple_function(name: str, extra: list[float]) -> Callable[[float], float]:
    def safe(fn: Callable[[float], float]) -> Callable[[float], float]:
        def call(v: float) -> float:
            try:
                return fn(v)
            except (ValueError, OverflowError):
                return math.nan if v < 0 or math.isnan(v) else math.inf
        return call

    table: dict[str, Callable[[float], float]] = {
        "abs": abs,
        "ceil": lambda v: float(math.ceil(v)) if math.isfinite(v) else v,
        "floor": lambda v: float(math.floor(v)) if math.isfinite(v) else v,
        "exp": safe(math.exp),
        "ln": safe(lambda v: -math.inf if v == 0 else math.log(v)),
        "log2": safe(lambda v: -math.inf if v == 0 else _log2(v)),
        "log10": safe(lambda v: -math.inf if v == 0 else math.log(v) * _LOG10_E),
        "sqrt": safe(math.sqrt),
        "sgn": lambda v: v if math.isnan(v) else float((v > 0) - (v < 0)),
    }
    if name in table:
        return table[name]
    if name == "round":  # by the inverse, as Prometheus's funcRound: round(1.23, 0.1) is 1.2, not 1.2000000000000002
        inverse = _apply("/", 1.0, extra[0] if extra else 1.0)[0]

        def nearest(v: float) -> float:
            up = v * inverse + 0.5
            return _apply("/", float(math.floor(up)) if math.isfinite(up) else up, inverse)[0]
        return nearest
    if name == "clamp":
        lo, hi = extra
        return lambda v: _go_max(lo, _go_min(hi, v))
    if name == "clamp_min":
        return lambda v: _go_max(extra[0], v)
    if name == "clamp_max":
        return lambda v: _go_min(extra[0], v)
    raise PromQLError(f"the function {name}()")


# Go's math.Log2 and math.Log10 multiply the natural log by these
_LOG2_E = 1.44269504088896340735992468100189213742664595415298593413  # 1 / ln 2
_LOG10_E = 0.43429448190325182765112891891660508229439700580366656611  # 1 / ln 10


def _log2(v: float) -> float:
    """Go's math.Log2: exact at powers of two, else ln(frac) / ln 2 + exp (which rounds unlike C's log2)."""
    frac, exp = math.frexp(v)
    if frac == 0.5:
        return float(exp - 1)
    return math.log(frac) * _LOG2_E + exp


def _go_max(a: float, b: float) -> float:
    """Go's math.Max: +Inf wins over NaN, NaN over every number (Python's max() depends on the order)."""
    if a == math.inf or b == math.inf:
        return math.inf
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return a if a > b or (a == b and not math.copysign(1.0, a) < 0) else b


def _go_min(a: float, b: float) -> float:
    """Go's math.Min: -Inf wins over NaN, NaN over every number."""
    if a == -math.inf or b == -math.inf:
        return -math.inf
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return a if a < b or (a == b and math.copysign(1.0, a) < 0) else b


def _range_function(name: str, times: Sequence[int], values: Sequence[float], window: Window, extra: list[float],
                    compat: Compat) -> float | None:
    n = len(values)
    if name in ("rate", "increase", "delta"):
        return _extrapolated(times, values, window, name != "delta", name == "rate", compat)
    if name in ("irate", "idelta"):
        if n < 2:
            return None
        last, prev = values[-1], values[-2]
        diff = last - prev
        if name == "irate":
            if last < prev:
                diff = last
            dt = (times[-1] - times[-2]) / 1000
            return diff / dt if dt else None
        return diff
    if name in ("deriv", "predict_linear"):
        if n < 2:
            return None
        slope, intercept = _linear_regression(times, values, times[0] if name == "deriv" else window.ts, compat)
        return slope if name == "deriv" else slope * extra[0] + intercept
    if name == "changes":
        return float(sum(1 for a, b in itertools.pairwise(values) if a != b and not (math.isnan(a) and math.isnan(b))))
    if name == "resets":
        return float(sum(1 for a, b in itertools.pairwise(values) if b < a))
    if name == "last_over_time":
        return values[-1]
    if name == "present_over_time":
        return 1.0
    if name in ("sum_over_time", "avg_over_time", "stdvar_over_time", "stddev_over_time"):
        return _over_time(name[: -len("_over_time")], values, compat)
    if name.endswith("_over_time"):  # the aggregation of the same name, over time instead of over series
        return _aggregate_values(name[: -len("_over_time")], list(values), extra[0] if extra else 0.0, compat)
    raise PromQLError(f"the function {name}()")


def _extrapolated(times: Sequence[int], values: Sequence[float], window: Window, is_counter: bool,
                  is_rate: bool, compat: Compat) -> float | None:
    """Prometheus's extrapolatedRate: the change over the window, extrapolated to its edges: a gap to an edge
    longer than 1.1 sample intervals is taken as half an interval, and a counter's gap to the start is cut where it
    would have been zero (before the first rule in 2.42, after it from 2.51 on: `zero_cut_after_gap`)."""
    n = len(values)
    if n < 2:
        return None
    result = values[-1] - values[0]
    if is_counter:
        last = 0.0
        for v in values:
            if v < last:
                result += last
            last = v
    to_start = (times[0] - window.start) / 1000
    to_end = (window.end - times[-1]) / 1000
    sampled = (times[-1] - times[0]) / 1000
    average = sampled / (n - 1)
    threshold = average * 1.1
    if compat.zero_cut_after_gap and to_start >= threshold:
        to_start = average / 2
    if is_counter and result > 0 and values[0] >= 0:
        to_start = min(to_start, sampled * (values[0] / result))
    if not compat.zero_cut_after_gap and to_start >= threshold:
        to_start = average / 2
    if to_end >= threshold:
        to_end = average / 2
    factor = (sampled + to_start + to_end) / sampled
    if is_rate:
        factor /= window.range_s
    return result * factor


def _kahan(inc: float, total: float, c: float, compat: Compat) -> tuple[float, float]:
    """Prometheus's Kahan-Neumaier step: the new sum and its compensation."""
    t = total + inc
    if compat.kahan_forgets_at_infinity and math.isinf(t):
        c = 0.0
    elif abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def _linear_regression(times: Sequence[int], values: Sequence[float], intercept_time: int,
                       compat: Compat) -> tuple[float, float]:
    init = values[0]
    if all(v == init for v in values):
        return (math.nan, math.nan) if math.isinf(init) else (0.0, init)
    n = float(len(values))
    sx = cx = sy = cy = sxy = cxy = sx2 = cx2 = 0.0
    for t, v in zip(times, values):
        x = (t - intercept_time) / 1000
        sx, cx = _kahan(x, sx, cx, compat)
        sy, cy = _kahan(v, sy, cy, compat)
        sxy, cxy = _kahan(x * v, sxy, cxy, compat)
        sx2, cx2 = _kahan(x * x, sx2, cx2, compat)
    sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
    cov = sxy - sx * sy / n
    var = sx2 - sx * sx / n
    slope = cov / var if var else math.nan
    return slope, sy / n - slope * sx / n


def _histogram_quantile(q: float, vec: Vector, drop: Callable[[Labels], Labels]) -> Vector:
    groups: dict[Labels, list[tuple[float, float]]] = {}
    for s in vec:
        le = get(s.labels, "le")
        if not le:
            continue
        try:
            bound = float(le)
        except ValueError:
            continue
        # grouped with the name, as Prometheus groups: two histograms of one label set are two results (which
        # _unique then refuses), not one merged histogram
        key = tuple(kv for kv in s.labels if kv[0] != "le")
        groups.setdefault(key, []).append((bound, s.value))
    return [Sample(drop(key), bucket_quantile(q, buckets)) for key, buckets in groups.items()]


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's bucketQuantile over (upper bound, cumulative count) pairs: its checks of q and the buckets here,
    the interpolation in metrics.quantile.bucket_value (what reports and summaries print from classic buckets)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: dict[float, float] = {}
    for bound, count in buckets:
        merged[bound] = merged.get(bound, 0.0) + count
    ordered = sorted(merged.items())
    if not ordered or not math.isinf(ordered[-1][0]):
        return math.nan
    counts = [c for _, c in ordered]
    top = -math.inf
    for i, c in enumerate(counts):  # ensureMonotonic, as Prometheus's: raised to the largest count before it
        if c > top:
            top = c
        elif c < top:
            counts[i] = top
    if len(ordered) < 2:
        return math.nan
    observations = counts[-1]
    if observations == 0:
        return math.nan
    return bucket_value(q * observations, [bound for bound, _ in ordered], counts)


__all__ = ["Evaluator", "PromQLError", "Sample", "Vector", "check", "parse", "selectors"]
