"""The A/B statistics on synthetic runs with known differences: the right verdict, and calibrated intervals."""

from __future__ import annotations

import random
from statistics import NormalDist

from outrider.runs.compare import bootstrap_ratio, compare
from outrider.runs.store import RunRecord


def run(name: str, mean: float, n: int = 60, sd: float = 0.05, seed: int = 1) -> RunRecord:
    rng = random.Random(seed)
    rec = RunRecord(name, ["train.py"], 0.0, float(n), 0, {})
    rec.samples["step_time_s"] = [(float(i), max(1e-6, rng.gauss(mean, sd * mean))) for i in range(n)]
    rec.samples["samples_per_s"] = [(float(i), 32 / v) for i, v in rec.samples["step_time_s"]]
    return rec


def exact(name: str, mean: float, n: int = 60, sd: float = 0.05, seed: int = 1) -> RunRecord:
    """Samples whose mean and spread are exactly the given ones: normal quantiles, shuffled."""
    quantiles = [NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)]
    random.Random(seed).shuffle(quantiles)
    rec = RunRecord(name, ["train.py"], 0.0, float(n), 0, {})
    rec.samples["step_time_s"] = [(float(i), mean * (1 + sd * z)) for i, z in enumerate(quantiles)]
    rec.samples["samples_per_s"] = [(float(i), 32 / v) for i, v in rec.samples["step_time_s"]]
    return rec


def test_a_twelve_percent_faster_run_is_reported_with_its_interval() -> None:
    results = {r.kpi: r for r in compare(exact("a", 0.100, seed=1), exact("b", 0.088, seed=2))}
    step = results["step_time_s"]
    assert step.significant and 0.86 < step.ratio < 0.90
    assert step.low < 0.88 < step.high
    assert "B is 12% faster (95% CI" in step.sentence()
    assert results["samples_per_s"].sentence().startswith("throughput") and "higher" in results[
        "samples_per_s"].sentence()


def test_equal_runs_are_no_significant_difference_most_of_the_time() -> None:
    false_alarms = 0
    for seed in range(60):
        r = compare(run("a", 0.1, seed=seed), run("b", 0.1, seed=1000 + seed))[0]
        false_alarms += r.significant
        if not r.significant:
            assert "no significant difference" in r.sentence()
    assert false_alarms <= 8, f"{false_alarms}/60 false alarms for a 95% interval"


def test_interval_coverage_is_calibrated() -> None:
    covered = 0
    trials = 60
    for seed in range(trials):
        rng = random.Random(seed)
        a = [rng.gauss(10.0, 1.0) for _ in range(40)]
        b = [rng.gauss(9.0, 1.0) for _ in range(40)]
        _, low, high = bootstrap_ratio(a, b, resamples=800, seed=seed)
        covered += low <= 0.9 <= high
    assert covered >= 0.85 * trials, f"95% intervals covered the true ratio in {covered}/{trials} trials"


def test_too_few_samples_are_not_compared() -> None:
    assert compare(run("a", 0.1, n=4), run("b", 0.1, n=4)) == [], "fewer than 5 samples after warm-up"
