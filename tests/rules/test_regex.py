"""Rule and configuration regexes match in linear time (RE2, as Prometheus) and a pattern RE2 refuses is refused
when it loads, naming where it came from (#23 item 8): a backtracking pattern can no longer freeze the agent or the
workload it runs in."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from outrider import regex
from outrider.config import Config, ConfigError, load
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
