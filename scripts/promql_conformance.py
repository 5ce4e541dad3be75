"""Runs Prometheus's own PromQL test files (promql/promqltest/testdata/*.test) through the agent's embedded
evaluator, and counts per file what it runs, passes, fails and skips as outside the supported subset.

The files are read at run time from a Prometheus git repository (a clone, or a bare mirror), never copied into
this one:

    python3 scripts/promql_conformance.py --repo PROMETHEUS_GIT_DIR --tag v2.53.5 --compat 2
    python3 scripts/promql_conformance.py --repo PROMETHEUS_GIT_DIR --tag v3.14.0 --compat 3 --failures
    python3 scripts/promql_conformance.py --repo ... --tag v3.14.0 --compat 3 --file functions.test --failures

A case is one `eval` command. It is run when its expression is inside the subset the agent takes (rules/promql.py:
`check`), its data is floats (a native histogram, `{{...}}` or `load_with_nhcb`, is skipped), and it asks for an
instant vector, a scalar or a string; a range query is evaluated as the instant queries at each of its steps, as
Prometheus evaluates it. Values compare as Prometheus's harness compares them (util/almost.Equal, relative
epsilon 1e-6, NaN equal to NaN); an `expect fail` case passes when the evaluator refuses it (the message text is
not compared); `expect warn` / `info` lines are not checked (the agent's evaluator has no annotations). What the
harness adds to every instant case (the same query again under `@` and in range mode) is not repeated: `@` is
outside the subset, and the evaluator has no range mode of its own.

The counts are in docs/alerting.md (PromQL conformance); this script is not a test, since CI cannot fetch the
Prometheus repository.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "agent"))

import promql_parser as pp  # noqa: E402

from outrider.rules import promql  # noqa: E402
from outrider.rules.promtest import PromTestError, expand_values  # noqa: E402
from outrider.rules.rule import parse_duration  # noqa: E402
from outrider.rules.store import STALE, Labels, SeriesStore  # noqa: E402

TESTDATA = "promql/promqltest/testdata"
TESTDATA_BEFORE_2_52 = "promql/testdata"
EPSILON = 1e-6  # the harness's defaultEpsilon
MIN_NORMAL = 2.2250738585072014e-308

_LOAD = re.compile(r"^load(?:_(with_nhcb))?\s+(.+?)$")
_EVAL_INSTANT = re.compile(r"^eval(?:_(fail|warn|ordered|info))?\s+instant\s+(?:at\s+(.+?))?\s+(.+)$")
_EVAL_RANGE = re.compile(r"^eval(?:_(fail|warn|info))?\s+range\s+from\s+(.+)\s+to\s+(.+)\s+step\s+(.+?)\s+(.+)$")
_EXPECT = re.compile(r"^expect\s+(ordered|fail|warn|no_warn|info|no_info)(?:\s+(regex|msg):(.+))?$")


# What the harness runs with feature flags Prometheus leaves off by default (promqltest.NewTestEngine): results a
# Prometheus 3 on its defaults does not give. The delayed removal of the name keeps __name__ (and __type__,
# __unit__) through an expression and drops it at the end, so that label_replace(rate(x[5m]), ...) can read it
# and `(x + 1) and y` still matches on __type__; without the flag rate() drops it at once.
_DELAYED = "promql-delayed-name-removal (off by default; the test harness turns it on)"
FEATURE_FLAG_FILES = {"name_label_dropping.test": _DELAYED}
FEATURE_FLAG_CASES = {
    ("type_and_unit.test", '(http_requests_total{group="canary"} + 1) and http_requests_total{instance="0"}'): _DELAYED,
    ("type_and_unit.test", '(http_requests_total{group="canary"} + 1) or http_requests_total{instance="1"}'): _DELAYED,
}


class Unsupported(Exception):
    """A case outside what the embedded evaluator takes; the message says what."""


@dataclass
class Eval:
    line: int
    expr: str
    start_ms: int
    end_ms: int
    step_ms: int
    is_range: bool
    fail: bool = False
    ordered: bool = False
    scalar: float | None = None
    string: str | None = None
    # labels -> (position, values at each step; None where a step has no sample)
    series: dict[Labels, tuple[int, list[float | None]]] = field(default_factory=dict)
    unsupported: str = ""


@dataclass
class Outcome:
    line: int
    expr: str
    verdict: str  # passed, failed, skipped
    why: str = ""


# --- reading the test files -------------------------------------------------------------------------------------

def _duration(text: str) -> int:
    text = text.strip()
    if text == "0":
        return 0
    return parse_duration(text)


def split_series(line: str) -> tuple[str, str]:
    """A series description (`metric{a="b"} 1 2+3x4`) as its selector and its values: the selector ends at the
    brace that closes its labels (quotes respected), or at the first blank when it has none."""
    i, n = 0, len(line)
    while i < n and not line[i].isspace() and line[i] != "{":
        i += 1
    if i < n and line[i] == "{":
        quote = ""
        while i < n:
            c = line[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = ""
            elif c in "\"'`":
                quote = c
            elif c == "}":
                i += 1
                break
            i += 1
    return line[:i].strip(), line[i:].strip()


def series_labels(selector: str) -> Labels:
    if selector.replace(" ", "") == "{}":
        return ()
    try:
        node = pp.parse(selector)
    except Exception as e:
        raise Unsupported(f"the parser does not read the series {selector!r} ({e})") from None
    if not isinstance(node, pp.VectorSelector):
        raise Unsupported(f"{selector!r} is not a series")
    out = {str(m.name): str(m.value) for m in node.matchers.matchers if str(m.value) != ""}
    if node.name:
        out["__name__"] = str(node.name)
    return tuple(sorted(out.items()))


def series_values(text: str) -> list[float | None]:
    if "{{" in text:
        raise Unsupported("native histogram samples")
    try:
        return expand_values(text)
    except (PromTestError, ValueError) as e:
        raise Unsupported(f"series values {text!r}: {e}") from None


def _number(text: str) -> float | None:
    """A line that is only a number (the harness's parseNumber: Go's ParseInt with base prefixes, then
    ParseFloat)."""
    text = text.strip()
    try:
        return float(int(text, 0))
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


@dataclass
class Load:
    line: int
    interval_ms: int
    series: list[tuple[Labels, list[float | None]]]
    histogram_names: set[str]
    unsupported: str = ""


Command = Load | Eval | str  # "clear"


def parse_file(text: str) -> list[Command]:
    lines = [("" if raw.strip().startswith("#") else raw.strip()) for raw in text.split("\n")]
    out: list[Command] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line:
            i += 1
            continue
        word = re.split(r"[\t ]+", line, maxsplit=1)[0].lower()
        if word == "clear":
            out.append("clear")
            i += 1
        elif word.startswith("load"):
            i = _parse_load(lines, i, out)
        elif word.startswith("eval"):
            i = _parse_eval(lines, i, out)
        else:
            raise ValueError(f"line {i + 1}: unknown command {line!r}")
    return out


def _block(lines: list[str], i: int) -> Iterator[tuple[int, str]]:
    j = i + 1
    while j < len(lines) and lines[j]:
        yield j, lines[j]
        j += 1


def _parse_load(lines: list[str], i: int, out: list[Command]) -> int:
    m = _LOAD.match(lines[i])
    if m is None:
        raise ValueError(f"line {i + 1}: bad load command")
    load = Load(i + 1, _duration(m.group(2)), [], set())
    end = i + 1
    for j, text in _block(lines, i):
        end = j + 1
        selector, values = split_series(text)
        if selector.endswith("@st"):
            load.unsupported = load.unsupported or "start timestamps (@st)"
            continue
        try:
            labels = series_labels(selector)
        except Unsupported as e:
            load.unsupported = load.unsupported or str(e)
            continue
        name = dict(labels).get("__name__", "")
        if "{{" in values:
            load.histogram_names.add(name)
            continue
        try:
            load.series.append((labels, series_values(values)))
        except Unsupported as e:
            load.unsupported = load.unsupported or str(e)
    if m.group(1):  # load_with_nhcb: the classic buckets also become a native histogram under the base name
        for labels, _ in load.series:
            name = dict(labels).get("__name__", "")
            for suffix in ("_bucket", "_count", "_sum"):
                if name.endswith(suffix):
                    load.histogram_names.add(name[: -len(suffix)])
    out.append(load)
    return end


def _parse_eval(lines: list[str], i: int, out: list[Command]) -> int:
    line = lines[i]
    instant, ranged = _EVAL_INSTANT.match(line), _EVAL_RANGE.match(line)
    if instant is not None:
        mod, at, expr = instant.groups()
        t = _duration(at)
        ev = Eval(i + 1, expr, t, t, 0, False)
    elif ranged is not None:
        mod, start, end, step, expr = ranged.groups()
        ev = Eval(i + 1, expr, _duration(start), _duration(end), _duration(step), True)
    else:
        raise ValueError(f"line {i + 1}: bad eval command {line!r}")
    ev.fail = mod == "fail"
    ev.ordered = mod == "ordered"
    last = i + 1
    position = 0
    for j, text in _block(lines, i):
        last = j + 1
        if ev.fail and text.startswith(("expected_fail_message", "expected_fail_regexp")):
            continue
        if text.startswith("expect range vector"):
            ev.unsupported = "a range vector result"
            continue
        if text.startswith("expect string"):
            ev.string = _unquote(text[len("expect string"):].strip())
            continue
        if text.split(" ")[0] == "expect":
            m = _EXPECT.match(text)
            if m is None:
                raise ValueError(f"line {j + 1}: bad expect line {text!r}")
            if m.group(1) == "fail":
                ev.fail = True
            elif m.group(1) == "ordered":
                ev.ordered = True
            continue  # warn, info, no_warn, no_info: annotations, which the evaluator has none of
        number = _number(text)
        if number is not None:
            ev.scalar = number
            continue
        selector, values = split_series(text)
        position += 1
        try:
            ev.series[series_labels(selector)] = (position, series_values(values))
        except Unsupported as e:
            ev.unsupported = ev.unsupported or f"expected {e}"
    out.append(ev)
    return last


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == "`":
        return text[1:-1]
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return bytes(text[1:-1], "utf-8").decode("unicode_escape")
    raise ValueError(f"expect string: {text!r} is not a quoted string")


# --- running them -----------------------------------------------------------------------------------------------

def almost_equal(a: float, b: float) -> bool:
    """Prometheus's util/almost.Equal with the harness's epsilon."""
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    abs_sum = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or abs_sum < MIN_NORMAL:
        return diff < EPSILON * MIN_NORMAL
    return diff / min(abs_sum, sys.float_info.max) < EPSILON


class Runner:
    def __init__(self, compat: int) -> None:
        self.compat = compat
        self.store = SeriesStore(None)
        self.histogram_names: set[str] = set()
        self.unloadable = ""

    def clear(self) -> None:
        self.store = SeriesStore(None)
        self.histogram_names = set()
        self.unloadable = ""

    def load(self, load: Load) -> None:
        self.histogram_names |= load.histogram_names
        if load.unsupported:
            self.unloadable = self.unloadable or f"data the runner cannot load at line {load.line}: {load.unsupported}"
        for labels, values in load.series:
            for k, v in enumerate(values):
                if v is not None:
                    self.store.add(labels, k * load.interval_ms, STALE if v is STALE else v)

    def run(self, ev: Eval, file: str) -> Outcome:
        flag = FEATURE_FLAG_FILES.get(file) or FEATURE_FLAG_CASES.get((file, ev.expr))
        if flag:
            return Outcome(ev.line, ev.expr, "skipped", f"a feature flag's semantics: {flag}")
        try:
            node = self._supported(ev)
        except promql.PromQLRegexError as e:  # refused when the rule loads: an error, as Prometheus gives
            verdict = "passed" if ev.fail else "failed"
            return Outcome(ev.line, ev.expr, verdict, f"refused: {e}")
        except Unsupported as e:
            return Outcome(ev.line, ev.expr, "skipped", str(e))
        evaluator = promql.Evaluator(self.store, compat=self.compat)
        try:
            got = self._evaluate(evaluator, node, ev)
        except promql.PromQLError as e:
            if ev.fail:
                return Outcome(ev.line, ev.expr, "passed", f"refused: {e}")
            return Outcome(ev.line, ev.expr, "failed", f"error: {e}")
        except (RecursionError, ValueError, TypeError, ZeroDivisionError, OverflowError, IndexError) as e:
            return Outcome(ev.line, ev.expr, "failed", f"crashed: {type(e).__name__}: {e}")
        if ev.fail:
            return Outcome(ev.line, ev.expr, "failed", "expected an error, got a result")
        why = self._compare(ev, got)
        return Outcome(ev.line, ev.expr, "failed" if why else "passed", why)

    def _supported(self, ev: Eval) -> Any:
        if ev.unsupported:
            raise Unsupported(ev.unsupported)
        if self.unloadable:
            raise Unsupported(self.unloadable)
        try:
            node = pp.parse(ev.expr)
        except BaseException as e:  # the parser's panics surface as pyo3's PanicException (a BaseException)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise Unsupported(f"the parser (promql-parser) does not take it: {str(e).splitlines()[0][:100]}") \
                from None
        try:
            promql.check(node)
        except promql.PromQLRegexError:
            raise
        except promql.PromQLError as e:
            raise Unsupported(f"outside the subset: {e}") from None
        inner = node
        while isinstance(inner, pp.ParenExpr):
            inner = inner.expr
        if isinstance(inner, pp.MatrixSelector):
            raise Unsupported("a range vector result")
        if self.histogram_names:
            for vs, _ in promql.selectors(node):
                name = promql.selector_name(vs)
                if name is None or name in self.histogram_names:
                    raise Unsupported("native histogram data")
        return node

    def _evaluate(self, evaluator: promql.Evaluator, node: Any, ev: Eval) -> dict[Labels, list[tuple[int, float]]] \
            | float | str | list[tuple[Labels, float]]:
        if not ev.is_range:
            got = evaluator.instant(node, ev.start_ms)
            if isinstance(got, (float, str)):
                return got
            return [(tuple(sorted(s.labels)), s.value) for s in got]
        points: dict[Labels, list[tuple[int, float]]] = {}
        t = ev.start_ms
        while t <= ev.end_ms:
            got = evaluator.instant(node, t)
            if isinstance(got, str):
                raise promql.PromQLError("a range query of a string")
            if isinstance(got, float):
                got = [promql.Sample((), got)]
            seen: set[Labels] = set()
            for s in got:
                labels = tuple(sorted(s.labels))
                if labels in seen:
                    raise promql.PromQLError("vector cannot contain metrics with the same labelset")
                seen.add(labels)
                points.setdefault(labels, []).append((t, s.value))
            t += ev.step_ms
        return points

    def _compare(self, ev: Eval, got: Any) -> str:
        if ev.string is not None:
            return "" if got == ev.string else f"expected the string {ev.string!r}, got {got!r}"
        if isinstance(got, str):
            return f"expected a vector or scalar, got the string {got!r}"
        if isinstance(got, float):
            if ev.scalar is None:
                return f"expected a vector, got the scalar {got}"
            return "" if almost_equal(ev.scalar, got) else f"expected the scalar {ev.scalar}, got {got}"
        if ev.scalar is not None and not ev.is_range:
            return f"expected the scalar {ev.scalar}, got a vector {got}"
        if ev.is_range:
            return self._compare_matrix(ev, got)
        return self._compare_vector(ev, got)

    def _compare_vector(self, ev: Eval, got: list[tuple[Labels, float]]) -> str:
        labels = [lab for lab, _ in got]
        if len(set(labels)) != len(labels):
            return f"a vector with the same labelset twice: {got}"
        for pos, (lab, value) in enumerate(got, 1):
            want = ev.series.get(lab)
            if want is None:
                return f"unexpected {_show(lab)} {value} in the result"
            position, values = want
            if ev.ordered and position != pos:
                return f"{_show(lab)} at position {pos}, expected at {position}"
            if values[0] is None or not almost_equal(values[0], value):
                return f"{_show(lab)}: expected {values[0]}, got {value}"
        missing = [lab for lab in ev.series if lab not in set(labels)]
        if missing:
            return f"expected {_show(missing[0])} {ev.series[missing[0]][1][0]}, not in the result {got}"
        return ""

    def _compare_matrix(self, ev: Eval, got: dict[Labels, list[tuple[int, float]]]) -> str:
        want: dict[Labels, list[tuple[int, float]]] = {}
        if ev.scalar is not None:
            want[()] = [(ev.start_ms + k * ev.step_ms, ev.scalar) for k in range(1)]
        for lab, (_, values) in ev.series.items():
            want[lab] = [(ev.start_ms + k * ev.step_ms, v) for k, v in enumerate(values) if v is not None]
        for lab, points in got.items():
            expected = want.get(lab)
            if expected is None:
                return f"unexpected {_show(lab)} {points} in the result"
            if [t for t, _ in points] != [t for t, _ in expected]:
                return f"{_show(lab)}: expected points at {[t for t, _ in expected]}, got {points}"
            for (t, v), (_, w) in zip(points, expected):
                if not almost_equal(w, v):
                    return f"{_show(lab)} at {t / 1000:g}s: expected {w}, got {v}"
        missing = [lab for lab in want if lab not in got]
        if missing:
            return f"expected {_show(missing[0])} {want[missing[0]]}, not in the result"
        return ""


def _show(labels: Labels) -> str:
    d = dict(labels)
    name = d.pop("__name__", "")
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in d.items()) + "}"


def run_file(name: str, text: str, compat: int) -> list[Outcome]:
    runner = Runner(compat)
    out = []
    for cmd in parse_file(text):
        if cmd == "clear":
            runner.clear()
        elif isinstance(cmd, Load):
            runner.load(cmd)
        elif isinstance(cmd, Eval):
            out.append(runner.run(cmd, name))
    return out


# --- the files ----------------------------------------------------------------------------------------------------

def test_files(repo: str, tag: str) -> dict[str, str]:
    """name -> text of every PromQL test file of the release, read from the git repository without a work tree
    (promql/promqltest/testdata from 2.52 on, promql/testdata before)."""
    for folder in (TESTDATA, TESTDATA_BEFORE_2_52):
        listed = subprocess.run(["git", "--git-dir", repo, "ls-tree", "--name-only", f"{tag}:{folder}"],
                                capture_output=True, text=True)
        if listed.returncode == 0:
            break
    else:
        raise SystemExit(f"{tag}: neither {TESTDATA} nor {TESTDATA_BEFORE_2_52} in {repo}")
    out = {}
    for name in sorted(n for n in listed.stdout.split() if n.endswith(".test")):
        out[name] = subprocess.run(["git", "--git-dir", repo, "show", f"{tag}:{folder}/{name}"], check=True,
                                   capture_output=True, text=True).stdout
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, help="a Prometheus git directory (a clone's .git, or a bare one)")
    parser.add_argument("--tag", required=True, help="the release, e.g. v2.53.5 or v3.14.0")
    parser.add_argument("--compat", type=int, choices=(2, 3), required=True, help="the evaluator's promql_compat")
    parser.add_argument("--file", action="append", help="only this test file (repeatable)")
    parser.add_argument("--failures", action="store_true", help="list every failed case and why")
    parser.add_argument("--skips", action="store_true", help="count the reasons for skipping")
    args = parser.parse_args(argv)
    files = test_files(args.repo, args.tag)
    if args.file:
        files = {k: v for k, v in files.items() if k in args.file}
    print(f"Prometheus {args.tag}, promql_compat {args.compat}")
    print("| file | cases | run | passed | failed | skipped |\n|---|---:|---:|---:|---:|---:|")
    totals: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    failures: list[tuple[str, Outcome]] = []
    for name, text in files.items():
        outcomes = run_file(name, text, args.compat)
        c = Counter(o.verdict for o in outcomes)
        run = c["passed"] + c["failed"]
        print(f"| {name} | {len(outcomes)} | {run} | {c['passed']} | {c['failed']} | {c['skipped']} |")
        totals.update(c)
        totals["cases"] += len(outcomes)
        failures += [(name, o) for o in outcomes if o.verdict == "failed"]
        reasons.update(_reason(o.why) for o in outcomes if o.verdict == "skipped")
    run = totals["passed"] + totals["failed"]
    print(f"| all | {totals['cases']} | {run} | {totals['passed']} | {totals['failed']} | {totals['skipped']} |")
    if args.skips:
        for why, n in reasons.most_common():
            print(f"{n:6}  {why}")
    if args.failures:
        for name, o in failures:
            print(f"{name}:{o.line}: {o.expr}\n    {o.why}")
    return 1 if failures else 0


def _reason(why: str) -> str:
    why = re.sub(r"\(.*", "", why)
    why = re.sub(r"'.*", "", why)
    return why.strip()[:90]


if __name__ == "__main__":
    sys.exit(main())
