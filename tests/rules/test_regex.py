"""Rule and configuration regexes match in linear time (RE2, as Prometheus) and a pattern RE2 refuses is refused
when it loads, naming where it came from (#23 item 8): a backtracking pattern can no longer freeze the agent or the
workload it runs in."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from outrider.ground import regex
from outrider.ground.config import Config, ConfigError, load
from outrider.notify.base import NotifyConfigError
from outrider.notify.dispatcher import parse_receivers
from outrider.rules import promql
from outrider.rules.rule import RuleLoadError, parse_groups

BACKTRACKS = "([a-z_]+)+_slow"  # exponential in Python's re on a value that almost matches


def test_matchers_and_label_replace_compile_with_re2() -> None:
    assert regex.ENGINE == "re2"
    pattern = regex.compile(BACKTRACKS, dotall=True)
    assert type(pattern).__module__.split(".")[0] == "re2"
    assert pattern.fullmatch("gpu_slow") and not pattern.fullmatch("gpu_fast")
    assert regex.compile("a.b", dotall=True).fullmatch("a\nb")  # Prometheus matchers: (?s)
    assert not regex.compile("a.b").fullmatch("a\nb")
    # label_replace's $1 template through RE2's match
    rules = parse_groups({"groups": [{"name": "g", "rules": [{"record": "r", "expr":
                          'label_replace(x, "short", "$1", "long", "(.*)-[0-9]+")'}]}]}, "t.yaml")
    assert rules[0].rules[0].name == "r"


def test_a_backtracking_matcher_runs_in_linear_time(tmp_path: Path) -> None:
    """The rule engine evaluates `=~"([a-z_]+)+_slow"` against a 60-character label value; with a backtracking
    engine that is ~2^60 steps (centuries), with RE2 a few microseconds. Run in a subprocess under a generous
    timeout (no wall-clock assertion): it either completes, with the right answer, or the test fails on the
    timeout."""
    script = tmp_path / "slow_regex.py"
    script.write_text(textwrap.dedent(f"""
        from outrider.metrics.catalog import Label, MetricDef
        from outrider.metrics.family import Family
        from outrider.rules.engine import RuleEngine
        from outrider.rules.rule import parse_groups

        defn = MetricDef("test_latency", "test.latency", "s", "gauge", "t", (Label("name", "name"),), "self")
        rules = parse_groups({{"groups": [{{"name": "g", "interval": "1s", "rules": [
            {{"alert": "Slow", "expr": 'test_latency{{name=~"{BACKTRACKS}"}} > 0'}},
            {{"alert": "NotSlow", "expr": 'test_latency{{name!~"{BACKTRACKS}"}} > 0'}}]}}]}}, "t.yaml")
        fired = []
        engine = RuleEngine(rules, 1.0, None, notify=fired.append, clock=lambda: 1_700_000_000_000)
        f = Family(defn)
        f.add(1.0, "a" * 60 + "!")   # almost matches: the backtracking worst case
        f.add(1.0, "checkpoint_slow")
        engine.ingest([f], 1_700_000_000_000)
        engine.evaluate(1_700_000_000_000)
        print(sorted((n.alertname, n.labels["name"]) for n in fired))
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(sorted([("NotSlow", "a" * 60 + "!"), ("Slow", "checkpoint_slow")]))


@pytest.mark.parametrize("pattern", [r"(?=x)y", r"(a)\\1", r"(?<!x)y"])  # as PromQL strings write them
def test_a_pattern_re2_refuses_is_refused_at_load_naming_the_rule(pattern: str) -> None:
    expr = f'label_replace(x, "dst", "$1", "src", "{pattern}")'
    with pytest.raises(RuleLoadError) as e:
        parse_groups({"groups": [{"name": "g", "rules": [{"alert": "Relabelled", "expr": expr}]}]}, "team.rules.yaml")
    text = str(e.value)
    assert "team.rules.yaml" in text and "'Relabelled'" in text and "RE2" in text, text
    assert "still works in Prometheus" not in text  # Prometheus refuses it too
    with pytest.raises(promql.PromQLRegexError):
        promql.check(promql.parse(expr))


def test_config_and_receivers_refuse_what_re2_refuses(tmp_path: Path) -> None:
    cfg = tmp_path / "outrider.yaml"
    cfg.write_text("network_exclude: '(?!eth0).*'\n")
    with pytest.raises(ConfigError, match=r"network_exclude.*RE2"):
        load(str(cfg), env={})
    assert regex.compile(Config().disk_exclude).match("loop0")  # the defaults are RE2 patterns
    with pytest.raises(NotifyConfigError, match=r"receivers.yaml: receiver 'oncall': match_re severity: .*RE2"):
        parse_receivers({"receivers": [{"name": "oncall", "type": "log", "match_re": {"severity": r"(crit)\1"}}]},
                        "receivers.yaml")
    routes = parse_receivers({"receivers": [{"name": "oncall", "type": "log",
                                             "match_re": {"severity": "critical|warning"}}]}, "receivers.yaml")
    assert routes[0][1].match_re["severity"].fullmatch("warning")


# --- the linear subset, matched with Python's re: the same answers as RE2, and linear by construction -----------------

def builtin_patterns() -> list[tuple[str, bool]]:
    """Every regex the agent compiles on its defaults: those of the built-in rules (matchers and label_replace, as
    the rule loader compiles them) and the host collector's default filters."""
    from outrider.rules.files import load_rules

    seen: set[tuple[str, bool]] = {(Config().disk_exclude, False), (Config().network_exclude, False)}
    real = regex.compile

    def spy(pattern: str, *, dotall: bool = False) -> regex.Pattern:
        seen.add((pattern, dotall))
        return real(pattern, dotall=dotall)

    regex.compile = spy  # type: ignore[assignment]
    try:
        parse_groups(load_rules(), "outrider.rules.yaml")
    finally:
        regex.compile = real  # type: ignore[assignment]
    assert len(seen) > 10
    return sorted(seen)


def re2_of(pattern: str, dotall: bool) -> regex.Pattern:
    return regex._re2(pattern, dotall)


@pytest.mark.parametrize(("pattern", "dotall"), builtin_patterns())
def test_every_pattern_of_the_defaults_is_in_the_linear_subset(pattern: str, dotall: bool) -> None:
    compiled = regex.compile(pattern, dotall=dotall)
    assert isinstance(compiled, regex.LinearPattern), pattern


def test_the_agent_on_its_defaults_does_not_load_re2(tmp_path: Path) -> None:
    """RE2 (its binding and libstdc++: 2.5 MiB of RSS) is loaded by the first pattern outside the subset only."""
    script = tmp_path / "defaults.py"
    script.write_text(textwrap.dedent("""
        import sys
        from outrider.collectors.host import NameFilter
        from outrider.ground.config import Config
        from outrider.rules.files import load_rules
        from outrider.rules.rule import parse_groups

        groups = parse_groups(load_rules(), "outrider.rules.yaml")
        assert sum(len(g.rules) for g in groups) > 30
        NameFilter(Config().disk_exclude), NameFilter(Config().network_exclude)
        print("re2" in sys.modules)
        from outrider.ground import regex
        regex.compile("([a-z_]+)+_slow")
        print("re2" in sys.modules)
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]


@pytest.mark.parametrize("pattern", [
    BACKTRACKS,  # a repeated group
    "(a|a)(a|a)(a|a)x",  # groups whose branches start alike, more after them
    "[a-z]+[a-z]+x",  # two repeats that overlap what follows
    ".*a.*a.*b",
    ".*a[a-z]+",  # an overlapping repeat followed by another repeat
    "(.*)-[0-9]+",  # a repeat that overlaps what follows, in a group
    "(a|)b*",  # a group with a branch that matches nothing
    "x(a|ab)(c|bcd)",
    "(?i)abc", "(?P<n>a)", r"a\b", r"\pL", "a*?", "a++", "[[:alpha:]]", r"(a)\1",
])
def test_patterns_outside_the_subset_go_to_re2(pattern: str) -> None:
    assert regex.linear_subset(pattern, True) is None
    assert regex.linear_subset(pattern, False) is None


def test_a_free_repeat_needs_a_tail_that_cannot_fail() -> None:
    assert regex.linear_subset(".*outrider.*", dotall=True) is not None
    assert regex.linear_subset(".*outrider.*", dotall=False) is None, "`.` stops at a newline: the tail can fail"
    assert regex.linear_subset(".*outrider", dotall=False) is not None


ALPHABET = "ab0-\n9:/_`Z"  # with the neighbours of the classes' ends (\d, \w)
ATOMS = ["a", "b", "0", "-", ".", "[ab]", "[^a]", r"\d", r"\w", "[a-]", r"\-"]


def random_pattern(rnd: Any, depth: int = 0) -> str:
    parts = []
    for _ in range(rnd.randint(1, 4)):
        roll = rnd.random()
        if roll < 0.15 and depth < 2:
            branches = [random_pattern(rnd, depth + 1) for _ in range(rnd.randint(1, 3))]
            parts.append(("(" if rnd.random() < 0.7 else "(?:") + "|".join(branches) + ")")
        elif roll < 0.2:
            parts.append(rnd.choice(["^", "$"]))
        else:
            parts.append(rnd.choice(ATOMS) + rnd.choice(["", "", "", "*", "+", "?", "{1,2}", "{2}"]))
    return "".join(parts) if depth else "|".join(
        ["".join(parts)] + ([random_pattern(rnd, 1)] if rnd.random() < 0.3 else []))


def test_the_subset_answers_as_re2_on_generated_patterns_and_texts() -> None:
    """A differential test: patterns generated from the subset's grammar (and beyond it), texts from the same
    small alphabet, every text up to three characters and random longer ones; fullmatch and match, their spans
    and groups, with and without dotall."""
    import itertools
    import random

    rnd = random.Random(20261202)
    texts = ["".join(t) for n in range(4) for t in itertools.product(ALPHABET, repeat=n)]
    linear = 0
    for _ in range(1500):
        pattern, dotall = random_pattern(rnd), rnd.random() < 0.5
        python = regex.linear_subset(pattern, dotall)
        if python is None:
            continue
        linear += 1
        ours, theirs = regex.compile(pattern, dotall=dotall), re2_of(pattern, dotall)
        sample = texts if linear % 10 == 0 else rnd.sample(texts, 60)
        sample = sample + ["".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(5, 12))) for _ in range(20)]
        for text in sample:
            for how in ("fullmatch", "match"):
                a, b = getattr(ours, how)(text), getattr(theirs, how)(text)
                assert (a is None) == (b is None), (pattern, dotall, python, text, how)
                if a is not None:
                    assert a.group(0) == b.group(0) and a.groups() == b.groups(), (pattern, text, how)
        assert ours.search("xx" + sample[-1]) is not None or theirs.search("xx" + sample[-1]) is None
    assert linear > 300, f"the grammar reached the subset {linear} times only"


def test_a_subset_pattern_matches_a_long_value_in_linear_time(tmp_path: Path) -> None:
    """Values of 200,000 characters that almost match, for each shape of the subset (a free repeat, repeats whose
    followers differ, overlapping top-level branches): a backtracking engine on a pattern outside the subset would
    take hours; run in a subprocess under a generous timeout, no wall-clock assertion."""
    script = tmp_path / "long.py"
    script.write_text(textwrap.dedent(r"""
        from outrider.ground import regex
        from outrider.ground.config import Config
        cases = [(".*outrider.*", True, "outride" * 30000), ("[a-z]+[0-9]+x", False, "a" * 100000 + "1" * 100000),
                 (Config().disk_exclude, False, "sd" + "a" * 200000), ("crc_flit|crc_data|crc_.*x", False,
                 "crc_" + "y" * 200000), (Config().network_exclude, False, "veth" + "z" * 200000 + "\n")]
        for pattern, dotall, value in cases:
            p = regex.compile(pattern, dotall=dotall)
            assert isinstance(p, regex.LinearPattern), pattern
            print(p.fullmatch(value) is not None, p.match(value) is not None)
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "False", "False", "False", "False", "False", "False",
                                "False", "False"]


@pytest.mark.parametrize(("pattern", "text"), [
    ("a{01}", "a{01}"),  # RE2 reads a count with a leading zero as text
    (r"\d{04}", "1234"),
    ("a{\u0663}", "aaa"),  # a digit that is not ASCII: text too
    ("a{1,\uff12}", "aa"),
])
def test_counts_re2_reads_as_text_are_left_to_re2(pattern: str, text: str) -> None:
    assert regex.linear_subset(pattern) is None
    ours, theirs = regex.compile(pattern), re2_of(pattern, False)
    assert (ours.fullmatch(text) is None) == (theirs.fullmatch(text) is None)


def test_what_re2_would_refuse_is_refused_at_load_not_matched_by_the_subset() -> None:
    large = r"[^\w\s]{100}\d" * 292  # linear, but past RE2's program size
    assert regex.linear_subset(large) is None
    with pytest.raises(regex.RegexError, match="RE2"):
        regex.compile(large)
    assert regex.linear_subset("a\ud800") is None, "a lone surrogate: RE2 takes UTF-8 only"
    with pytest.raises(regex.RegexError):
        regex.compile("a\ud800")
    at_most = "[a-c]{100}d" * 9 + "[a-c]{91}"  # 1,000 characters written out: MAX_EXPANDED
    assert regex.MAX_EXPANDED == 1000
    assert regex.linear_subset(at_most) is not None
    assert regex.linear_subset(at_most + "d") is None


def test_patterns_past_max_pattern_go_to_re2() -> None:
    longest = "|".join(f"e{i:03d}" for i in range(205))[:regex.MAX_PATTERN]
    assert regex.MAX_PATTERN == 1024 and len(longest) == 1024
    assert regex.linear_subset(longest) is not None
    assert regex.linear_subset(longest + "x") is None
