"""The PromQL corpus (promql_corpus.test.yaml): a few hundred expression tests over small input series, covering
what the embedded evaluator's subset takes (`check()`): selectors and regex matchers, the lookback and staleness,
every range and instant function, every aggregation, every operator with its vector matching, histogram_quantile's
edge cases, label_replace and absent.

promtool is the oracle: its expected values are the ones `promtool test rules` states, and it must still pass the
file (so a value written by hand cannot drift from Prometheus). The embedded evaluator must reproduce every one of
them exactly, in-process and in well under a second, which is what mutation testing runs for each mutant.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from outrider.rules import promql
from outrider.rules.promtest import read_test_file, run_file
from tests.conftest import need_binary

CORPUS = Path(__file__).with_name("promql_corpus.test.yaml")


def test_the_embedded_evaluator_reproduces_every_corpus_case() -> None:
    results = run_file(CORPUS, compat=2)
    failures = [f for r in results for f in r.failures]
    assert failures == [], "\n".join(failures)


def test_every_corpus_expression_is_inside_the_embedded_subset() -> None:
    exprs = [t["expr"] for case in read_test_file(CORPUS)["tests"] for t in case["promql_expr_test"]]
    assert len(exprs) > 300
    for expr in exprs:
        promql.check(promql.parse(expr))


def test_promtool_passes_the_corpus() -> None:
    r = subprocess.run([need_binary("promtool"), "test", "rules", str(CORPUS)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
