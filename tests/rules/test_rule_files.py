"""Rule files the agent must refuse with one clear line, and those it must take: Prometheus's own `promtool check
rules` is the oracle (every file refused here is refused by it too, every file taken here is taken by it), and
every refusal names the file, the group and the rule (by name, or by position where it has none) and the field.
The same error reaches `outrider rules check`, `outrider config check` and the agent's start, each exiting 2."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from outrider.rules import promql
from outrider.rules.files import load_rules
from outrider.rules.promql import Evaluator
from outrider.rules.rule import AlertingRule, Rule, RuleLoadError, load_groups, parse_groups, retention
from outrider.rules.store import SeriesStore, make_labels
from tests.conftest import need_binary
from tests.helpers import free_port, outrider_cmd

DEEP = {  # 3,000 levels in three shapes; 5,000 `up + up + ...` terms killed the process (SIGSEGV in the parser)
    "parentheses": "(" * 3000 + "up" + ")" * 3000,
    "calls": "abs(" * 3000 + "up" + ")" * 3000,
    "operators": " + ".join(["up"] * 5000),
}


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("shape", list(DEEP))
def test_an_expression_nested_3000_deep_is_one_clear_line_in_every_command(tmp_path: Path, shape: str) -> None:
    rules = tmp_path / "deep.rules.yaml"
    rules.write_text(f"groups:\n- name: deep\n  rules:\n  - alert: TooDeep\n    expr: '{DEEP[shape]}'\n")
    config = tmp_path / "outrider.yaml"
    config.write_text(f"rule_files: [{rules}]\nstate_dir: {tmp_path / 'state'}\n")
    expected = f"{rules}: group 'deep', alert 'TooDeep': an expression nested more than 100 levels deep"
    runs = {
        "rules check": outrider_cmd("rules", "check", str(rules)),
        "config check": outrider_cmd("config", "check", str(config)),
        "agent start": outrider_cmd("agent", "--config", str(config), "--listen", f"127.0.0.1:{free_port()}",
                                    "--no-collector.gpu"),
    }
    for what, cmd in runs.items():
        # A timeout, not a speed bound: an agent that took the file would serve until stopped.
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, f"{what}: exit {r.returncode}\n{r.stderr[-2000:]}"
        assert expected in one_line(r.stderr), f"{what}: {r.stderr}"
        assert "still works in Prometheus" in r.stderr, what
    promtool = subprocess.run([need_binary("promtool"), "check", "rules", str(rules)], capture_output=True, text=True)
    assert promtool.returncode == 0, "Prometheus takes it: the refusal is the embedded evaluator's limit"


def test_the_catalog_nests_far_inside_the_limit() -> None:
    catalog = load_rules()
    deepest = max(promql.nesting(r["expr"]) for g in catalog["groups"] for r in g["rules"])
    assert deepest <= promql.MAX_DEPTH // 4, f"the catalog nests {deepest} deep: raise MAX_DEPTH with care"



@pytest.mark.parametrize("shape", ["calls", "parentheses", "operators", "aggregations"])
def test_the_deepest_expression_taken_evaluates(shape: str) -> None:
    """Just inside the limit, each shape loads, and checks, evaluates and is walked for its selectors without a
    RecursionError: the limit is low enough for the evaluator's recursion."""
    n = promql.MAX_DEPTH - 3
    expr = {"calls": "abs(" * n + "up" + ")" * n, "parentheses": "(" * n + "up" + ")" * n,
            "operators": " + ".join(["up"] * (n + 1)), "aggregations": "sum(" * n + "up" + ")" * n}[shape]
    assert promql.nesting(expr) <= promql.MAX_DEPTH
    groups = parse_groups({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": expr}]}]}, "deep")
    store = SeriesStore(None)
    store.add(make_labels("up", [("job", "j")]), 0, 1.0)
    vector = Evaluator(store).vector(groups[0].rules[0].expr, 1000)
    assert [s.value for s in vector] == [{"operators": n + 1.0}.get(shape, 1.0)]
    assert list(retention(groups, 15_000)) == ["up"]


def write(tmp_path: Path, text: str, name: str = "r.rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def promtool_check(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([need_binary("promtool"), "check", "rules", *map(str, paths)], capture_output=True,
                          text=True)


def test_repeated_group_names_are_refused_as_prometheus_refuses_them(tmp_path: Path) -> None:
    rules = write(tmp_path, "groups:\n- name: gpu\n  rules: [{alert: A, expr: up}]\n"
                            "- name: gpu\n  rules: [{alert: B, expr: up}]\n")
    assert promtool_check(rules).returncode == 1
    with pytest.raises(RuleLoadError) as e:
        load_groups([rules])
    assert f"{rules}: group 'gpu' is repeated in the same file" in str(e.value)
    r = subprocess.run(outrider_cmd("rules", "check", str(rules)), capture_output=True, text=True)
    assert r.returncode == 2 and "group 'gpu' is repeated" in one_line(r.stderr)
    # The same name in two files is two groups, for Prometheus and for the agent.
    other = write(tmp_path, "groups:\n- name: gpu\n  rules: [{alert: C, expr: up}]\n", "other.rules.yaml")
    first = write(tmp_path, "groups:\n- name: gpu\n  rules: [{alert: A, expr: up}]\n")
    assert promtool_check(first, other).returncode == 0
    assert [(g.file, g.name) for g in load_groups([first, other])] == [(str(first), "gpu"), (str(other), "gpu")]


# (file text, what the error must say after "{file}: "); promtool refuses every one of them too.
REFUSED = [
    ("groups: [{name: true, rules: 1}]", "group 'true': rules: expected a list of rules, got the int 1"),
    ("groups: [{name: g, rules: abc}]", "group 'g': rules: expected a list of rules, got the str 'abc'"),
    ("groups: [{name: g, rules: {a: 1}}]", "group 'g': rules: expected a list of rules, got a mapping"),
    ("groups: [{name: g, rules: [5]}]", "group 'g', rule 1: expected a mapping"),
    ("groups: [{name: g, rules: [{alert: A, expr: up}, [x]]}]", "group 'g', rule 2: expected a mapping"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, labels: [1]}]}]",
     "group 'g', alert 'A': labels: expected a mapping of names to values, got a list"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, labels: x}]}]", "group 'g', alert 'A': labels: expected a"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, labels: {a: {b: 1}}}]}]",
     "group 'g', alert 'A': labels.a: expected text, got a mapping"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, annotations: [1]}]}]",
     "group 'g', alert 'A': annotations: expected a mapping"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, for: [1]}]}]", "group 'g', alert 'A': for: expected text"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, for: 1e308}]}]",
     "group 'g', alert 'A': for: '1e308' is not a Prometheus duration"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, for: 5}]}]", "for: '5' is not a Prometheus duration"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, for: -5m}]}]", "for: '-5m' is not a Prometheus duration"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, keep_firing_for: 5m1h}]}]",
     "group 'g', alert 'A': keep_firing_for: '5m1h' is not a Prometheus duration"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, for: 99999999999y}]}]", "for: '99999999999y' is longer"),
    ("groups: [{name: g, interval: [1], rules: []}]", "group 'g': interval: expected text, got a list"),
    ("groups: [{name: g, interval: 1.5, rules: []}]", "group 'g': interval: '1.5' is not a Prometheus duration"),
    ("groups: [{name: g, rules: [{alert: [x], expr: up}]}]", "group 'g', rule 1: alert: expected text, got a list"),
    ("groups: [{name: g, rules: [{alert: '', expr: up}]}]", "group 'g', rule 1: needs one of 'alert' or 'record'"),
    ("groups: [{name: g, rules: [{alert: A, record: b, expr: up}]}]", "group 'g', rule 1: has both 'alert'"),
    ("groups: [{name: g, rules: [{alert: A, expr: [up]}]}]", "group 'g', alert 'A': expr: expected text"),
    ("groups: [{name: g, rules: [{alert: A}]}]", "group 'g', alert 'A': no expr"),
    ("groups: [{name: g, rules: [{record: 'not a name', expr: up}]}]",
     "group 'g', recording rule 'not a name': 'not a name' is not a valid metric name"),
    ("groups: [{name: g, rules: [{record: r, expr: up, for: 5m}]}]",
     "group 'g', recording rule 'r': a recording rule has no 'for'"),
    ("groups: [{name: g, rules: [{record: r, expr: up, annotations: {a: b}}]}]",
     "group 'g', recording rule 'r': a recording rule has no 'annotations'"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, labels: {'bad name': x}}]}]",
     "group 'g', alert 'A': labels: 'bad name' is not a valid name"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, labels: {__name__: x}}]}]",
     "group 'g', alert 'A': labels: '__name__' is reserved"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, annotations: {5: a}}]}]",
     "group 'g', alert 'A': annotations: '5' is not a valid name"),
    ("groups: [{name: g, rules: [{alert: A, expr: up, lables: {a: b}}]}]",
     "group 'g', alert 'A': unknown field 'lables'"),
    ("groups: [{name: g, extra: 1, rules: []}]", "group 'g': unknown field 'extra'"),
    ("groups: [{name: g, limit: x, rules: []}]", "group 'g': limit: expected a whole number"),
    ("groups: [{name: [g], rules: []}]", "group 1: name: expected text, got a list"),
    ("groups: [{name: a, rules: []}, {name: '', rules: []}]", "group 2: the group has no name"),
    ("groups: [{name: a, rules: []}, {rules: []}]", "group 2: the group has no name"),
    ("groups: [5]", "group 1: expected a mapping with 'name' and 'rules', got the int 5"),
    ("groups: 5", "groups: expected a list of groups, got the int 5"),
    ("extra: 1\ngroups: []", "unknown field 'extra'"),
    ("groups: [{name: g, rules: [{alert: A, expr: 'up +'}]}]", "group 'g', alert 'A': cannot parse"),
]


@pytest.mark.parametrize(("text", "says"), REFUSED, ids=[t for t, _ in REFUSED])
def test_a_rule_file_prometheus_refuses_is_one_error_naming_file_group_rule_and_field(
        tmp_path: Path, text: str, says: str) -> None:
    rules = write(tmp_path, text + "\n")
    assert promtool_check(rules).returncode == 1, "the oracle refuses it"
    with pytest.raises(RuleLoadError) as e:  # never a TypeError, AttributeError or OverflowError
        load_groups([rules])
    assert str(e.value).startswith(f"{rules}: ") and says in str(e.value), str(e.value)
    r = subprocess.run(outrider_cmd("rules", "check", str(rules)), capture_output=True, text=True)
    assert r.returncode == 2 and says in one_line(r.stderr)


# Files Prometheus takes, and what the agent loads from them: scalars are text (`name: 5` is the group "5"),
# empty items and fields are nothing, `for: 0` and `interval: 0` are the defaults.
TAKEN = [
    ("", []),
    ("{}", []),
    ("groups: null", []),
    ("groups: [null, {name: g}, {name: h, rules: null}]", [("g", []), ("h", [])]),
    ("groups: [{name: 5, interval: 0, rules: [null, {alert: 7, expr: 5, for: 0, labels: {a: 1, b: null}}]}]",
     [("5", [("7", "5", {"a": "1", "b": ""})])]),
    ("groups: [{name: g, interval: 1m30s, rules: [{record: 'job:up:sum', expr: sum(up), annotations: {}}]}]",
     [("g", [("job:up:sum", "sum(up)", {})])]),
]


def label_texts(rule: Rule) -> dict[str, str]:
    if isinstance(rule, AlertingRule):
        return {k: t.text for k, t in rule.labels.items()}
    return dict(rule.labels)


@pytest.mark.parametrize(("text", "loaded"), TAKEN, ids=[t or "empty" for t, _ in TAKEN])
def test_a_rule_file_prometheus_takes_loads_as_it_reads_it(tmp_path: Path, text: str, loaded: list[object]) -> None:
    rules = write(tmp_path, text + "\n")
    assert promtool_check(rules).returncode == 0
    groups = load_groups([rules], default_interval_ms=15_000)
    assert [(g.name, [(r.name, r.expr_text, label_texts(r)) for r in g.rules]) for g in groups] == loaded
    assert all(g.interval_ms == (90_000 if "1m30s" in text else 15_000) for g in groups)


@pytest.mark.parametrize(("content", "says"), [
    (b"groups: [\xff]\n", "not UTF-8 text"),
    (b"groups: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
    (b"groups: [\n", "not valid YAML"),
])
def test_an_unreadable_rule_file_is_one_clear_line(tmp_path: Path, content: bytes, says: str) -> None:
    rules = tmp_path / "r.rules.yaml"
    rules.write_bytes(content)
    r = subprocess.run(outrider_cmd("rules", "check", str(rules)), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and str(rules) in r.stderr and says in one_line(r.stderr)


def test_a_fifo_as_a_rule_file_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "r.rules.yaml"
    os.mkfifo(fifo)
    config = write(tmp_path, f"rule_files: [{fifo}]\n", "outrider.yaml")
    for cmd in (outrider_cmd("rules", "check", str(fifo)), outrider_cmd("config", "check", str(config))):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)  # it read the FIFO forever before
        assert r.returncode == 2 and f"{fifo}: not a regular file" in one_line(r.stderr)


def test_a_regular_expression_the_evaluator_cannot_compile_is_refused_at_load(tmp_path: Path) -> None:
    rules = write(tmp_path, "groups: [{name: g, rules: [{alert: A, expr: 'label_replace(up, \"a\", \"$1\", \"b\", "
                            "\"(\")'}]}]\n")
    with pytest.raises(RuleLoadError, match=r"group 'g', alert 'A': the pattern '\(' is not a regular expression RE2 "):
        load_groups([rules])


def test_the_groups_limit_is_refused_rather_than_ignored(tmp_path: Path) -> None:
    rules = write(tmp_path, "groups: [{name: g, limit: 3, rules: [{alert: A, expr: up}]}]\n")
    assert promtool_check(rules).returncode == 0
    with pytest.raises(RuleLoadError, match="group 'g': the group's 'limit' is not applied by the agent's"):
        load_groups([rules])


def test_rules_export_of_a_file_without_tunables_beside_it(tmp_path: Path) -> None:
    rules = write(tmp_path, "groups: [{name: g, rules: [{alert: A, expr: up, for: 5m}]}]\n")
    r = subprocess.run(outrider_cmd("rules", "export", "--rules", str(rules), "--set", "A.for=1m"),
                       capture_output=True, text=True)
    assert r.returncode == 0 and "for: 1m" in r.stdout, r.stderr  # FileNotFoundError: tunables.yaml before
    r = subprocess.run(outrider_cmd("rules", "export", "--rules", str(rules), "--set", "A.threshold=3"),
                       capture_output=True, text=True)
    assert r.returncode == 2 and "A has no tunable 'threshold'" in one_line(r.stderr)


def test_rules_test_with_an_unusable_test_file_or_rule_file_is_one_clear_line(tmp_path: Path) -> None:
    wrong = write(tmp_path, "groups: [{name: true, rules: 1}]\n")
    fifo = tmp_path / "fifo.test.yaml"
    os.mkfifo(fifo)
    cases = {
        write(tmp_path, f"rule_files: [{wrong.name}]\ntests: [{{input_series: []}}]\n", "a.test.yaml"):
            f"{wrong.name}: group 'true': rules: expected a list of rules",
        write(tmp_path, "tests: 5\n", "b.test.yaml"): "tests: expected a list of test cases",
        fifo: f"{fifo}: not a regular file",
        tmp_path / "absent.test.yaml": "cannot read: No such file or directory",
    }
    for path, says in cases.items():
        r = subprocess.run(outrider_cmd("rules", "test", str(path)), capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and says in one_line(r.stderr), r.stderr
