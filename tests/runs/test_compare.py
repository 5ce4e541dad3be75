"""The A/B statistics on synthetic runs with known differences: the right verdict, and calibrated intervals."""

from __future__ import annotations

import random
import re
from statistics import NormalDist

from outrider.runs.compare import bootstrap_ratio, compare, compare_all, steady
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


def test_every_kpi_is_compared_in_human_units_with_its_sample_counts() -> None:
    a, b = exact("a", 0.100, seed=1), exact("b", 0.088, seed=2)
    for rec, rss, p99 in ((a, 700 * 2**20, 0.0040), (b, 760 * 2**20, 0.0041)):
        rec.samples["rss_bytes"] = [(float(i), rss + 2**20 * (i % 3 - 1)) for i in range(60)]
        rec.samples["latency_p99_s"] = [(float(i), p99) for i in range(3)]  # too few sweeps to compare
        rec.samples["server_errors_per_s"] = [(float(i), 0.0) for i in range(60)]  # zero in both: left out
    done, skipped = compare_all(a, b)
    text = {r.kpi: r.sentence() for r in done}
    assert text["rss_bytes"].startswith("job memory (RSS): A 700 MiB, B 760 MiB: B is 8.6% higher (worse) (95% CI")
    assert re.match(r"step time: A 100 ms, B 8[78](\.\d)? ms: B is 12% faster", text["step_time_s"])
    assert all(s.endswith(f"; n = {r.n_a}/{r.n_b} sweeps)") for r, s in zip(done, text.values()))
    assert [s.sentence() for s in skipped] == [
        "p99 latency: too few sweeps to compare (at least 5 each after warm-up) (n = 3/3 sweeps)"]
    assert "server_errors_per_s" not in text


def test_training_kpis_count_only_the_sweeps_with_steps() -> None:
    """A run that trains, then serves: its throughput is judged on its training sweeps, not diluted by zeros."""
    rec = RunRecord("a", ["job.py"], 0.0, 100.0, 0, {})
    rec.samples["steps_per_s"] = [(float(i), 10.0 if i < 50 else 0.0) for i in range(100)]
    rec.samples["samples_per_s"] = [(float(i), 320.0 if i < 50 else 0.0) for i in range(100)]
    rec.samples["requests_per_s"] = [(float(i), 0.0 if i < 50 else 5.0) for i in range(100)]
    rec.samples["process_cpu_cores"] = [(float(i), 1.0) for i in range(100)]
    assert steady(rec, "samples_per_s") == [320.0] * 45
    assert len(steady(rec, "process_cpu_cores")) == 90  # active in either phase: all 100, less the warm-up
