"""The statistics `outrider compare` judges with (runs/stats.py): the distribution functions against reference
values, the bootstrap's statistics against the sketch's own, and the coverage of every interval: over seeded
repetitions with a known truth, a 95% interval covers it about 95% of the time (at least that where the sketch's
resolution is added on purpose), never far less."""

from __future__ import annotations

import math
import random
from bisect import bisect_right

import pytest

from outrider.runs import stats
from outrider.runs.compare import compare_all, compare_distribution
from outrider.runs.store import RunRecord
from outrider.shared.sketch import Sketch
from tests.runs.jobs import histogram

# Reference values: scipy.stats 1.17 (t.ppf, binomtest(...).proportion_ci(method="exact")) and scipy.special.betainc.
T_QUANTILES = [(0.975, 1, 12.706204736174694), (0.975, 4, 2.7764451051977934), (0.975, 7.3, 2.345066736547703),
               (0.975, 30, 2.0422724563012378), (0.995, 3, 5.840909309733355)]
CLOPPER_PEARSON = [(20, 30, 0.4718799552101195, 0.8271257784739607), (1, 50, 0.0005062279831152354,
                                                                     0.10646954571150097),
                   (900, 2000, 0.42803365593928305, 0.47211314192026055)]
BETAINC = [(2.5, 0.5, 0.3, 0.018927124071945658), (1e4, 3e4, 0.25, 0.5007677677977396),
           (0.5, 0.5, 0.999, 0.9798649583666235)]


@pytest.mark.parametrize(("p", "df", "want"), T_QUANTILES)
def test_t_quantiles_match_the_reference(p: float, df: float, want: float) -> None:
    assert stats.t_quantile(p, df) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(("a", "b", "x", "want"), BETAINC)
def test_the_incomplete_beta_matches_the_reference(a: float, b: float, x: float, want: float) -> None:
    assert stats.betainc(a, b, x) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(("k", "n", "low", "high"), CLOPPER_PEARSON)
def test_the_poisson_ratio_interval_is_clopper_pearson_on_the_conditional_binomial(k: int, n: int, low: float,
                                                                                    high: float) -> None:
    """k of n events in B, n - k in A, equal exposures: p = k / n, the ratio p / (1 - p)."""
    got = stats.poisson_ratio_interval(n - k, 1.0, k, 1.0)
    assert got.low == pytest.approx(low / (1 - low), rel=1e-9)
    assert got.high == pytest.approx(high / (1 - high), rel=1e-9)
    assert got.ratio == pytest.approx(k / (n - k))


def test_errors_where_a_had_none_have_an_infinite_ratio_and_a_low_end_that_says_how_many_more() -> None:
    got = stats.poisson_ratio_interval(0, 10.0, 57, 10.0)
    assert got.ratio == math.inf and got.high == math.inf and got.significant
    assert got.low == pytest.approx(0.9373325190855151 / (1 - 0.9373325190855151), rel=1e-9)
    assert not stats.poisson_ratio_interval(0, 10.0, 3, 10.0).significant, "3 against none: could be chance"


def test_the_statistics_of_the_points_are_the_sketchs_own() -> None:
    rng = random.Random(3)
    values = [rng.lognormvariate(-4.0, 0.6) for _ in range(5000)]
    sketch = Sketch.of_values(values)
    got = stats.of_points(sketch.points(), [0.5, 0.9, 0.99, stats.MEAN])
    assert got is not None
    assert got[:3] == [sketch.quantile(0.5), sketch.quantile(0.9), sketch.quantile(0.99)]
    assert got[3] == pytest.approx(sketch.mean())


@pytest.mark.parametrize("values", [[0.0, 0.0, 1.0, 2.0], [1.0, 1.0, 2.0, 4.0, 4.0], [3.0], [0.0], [0.5, 8.0]])
def test_a_quantile_of_the_points_is_the_sketchs_at_every_rank_edge(values: list[float]) -> None:
    """At q on and either side of each item's rank (ceil(q * count): sketch.quantile_rank), the zero bucket
    included: the bootstrap's statistic is the value Sketch.quantile reads, not its neighbour."""
    sketch = Sketch.of_values(values)
    n = len(values)
    qs = sorted({min(1.0, max(0.0, k / n + d)) for k in range(n + 1) for d in (-1e-9, 0.0, 1e-9)})
    assert stats.of_points(sketch.points(), qs) == [sketch.quantile(q) for q in qs]


def _coverage(n: int, sigma: float, truth: float, reps: int, stat: float | str) -> float:
    """How often compare's interval for `stat` of lognormal steps (B's median `truth` times A's) covers the true
    ratio, over seeded repetitions of two runs of n steps."""
    covered = 0
    for r in range(reps):
        rng = random.Random(r)
        a = [rng.lognormvariate(-4.6, sigma) for _ in range(n)]
        b = [rng.lognormvariate(-4.6 + math.log(truth), sigma) for _ in range(n)]
        done, _ = compare_distribution(histogram(a), histogram(b), "step_time", "step time", "steps", [stat],
                                       resamples=400, seed=2 * r)
        covered += done[0].low <= truth <= done[0].high
    return covered / reps


@pytest.mark.parametrize(("sigma", "stat", "least", "most"), [
    (0.3, stats.MEAN, 0.88, 0.99),  # measured 0.94 (200 repetitions, 1,000 resamples: 0.945)
    (0.3, 0.5, 0.93, 1.0),  # measured 0.99; without the sketch's resolution, 0.94
    (0.05, 0.5, 0.93, 1.0),  # a tight distribution (sleep-like steps): without the resolution, 0.74
    (0.3, 0.99, 0.90, 1.0),  # 360 steps: p99 rests on 4 steps; measured 0.98
])
def test_the_intervals_of_distributions_cover_the_true_ratio(sigma: float, stat: float | str, least: float,
                                                             most: float) -> None:
    """B 1.9x A (a ratio off the sketch's bucket grid, so the quantisation does not cancel), 360 steps each (400
    less a warm-up), 100 seeded repetitions."""
    got = _coverage(360, sigma, 1.9, 100, stat)
    assert least <= got <= most, f"{stat}: covered the true ratio in {got:.0%} of the repetitions"


def _counter(rate: float, duration_s: float, sweep_s: float, rng: random.Random) -> list[tuple[float, float]]:
    """A counter of steps with lognormal durations (CV 0.3) at `rate` for `duration_s`, flushed every second and
    read every sweep, and once more after the job's closing flush: (sweep time, running total)."""
    ends, t = [], rng.uniform(0.0, 1.0)
    while t < duration_s:
        t += rng.lognormvariate(math.log(1.0 / rate) - 0.045, 0.3)
        ends.append(t)
    phase = rng.uniform(0.0, 1.0)
    reads = [(now, math.floor(now - phase) + phase) for now in (i * sweep_s for i in range(int(t / sweep_s) + 1))]
    return [(now, float(bisect_right(ends, published))) for now, published in [*reads, (t + 0.1, t)]]


def test_the_interval_of_a_ratio_of_rates_covers_the_truth_in_runs_of_30_s() -> None:
    """Two jobs at 50 and 100 steps/s, read every 5 s for 30 s and once after their closing flush (4 intervals after
    warm-up), as compare takes them from the record, 300 repetitions: measured 95% covered, the interval +-3%."""
    covered, widths = 0, []
    reps = 300
    for r in range(reps):
        rng = random.Random(r)
        records = []
        for rate in (50.0, 100.0):
            rec = RunRecord(f"{rate}", ["job.py"], 0.0, 40.0, 0, {})
            rec.samples["steps_total"] = [(t, v) for t, v in _counter(rate, 30.0, 5.0, rng) if v > 0]
            records.append(rec)
        got = {c.kpi: c for c in compare_all(*records)[0]}["steps_per_s"]
        covered += got.low <= 2.0 <= got.high
        widths.append(got.high / got.low)
    assert 0.9 <= covered / reps <= 0.99, f"covered the true ratio in {covered}/{reps} repetitions"
    assert sorted(widths)[reps // 2] < 1.1, "the median interval within +-5%"


def test_the_interval_of_a_ratio_of_error_rates_covers_the_truth() -> None:
    """Errors as independent events at 0.5/s and 1.5/s for 60 s, 400 repetitions."""
    covered = 0
    reps = 400
    for r in range(reps):
        rng = random.Random(r)
        na = sum(1 for _ in range(6000) if rng.random() < 0.5 * 60 / 6000)
        nb = sum(1 for _ in range(6000) if rng.random() < 1.5 * 60 / 6000)
        got = stats.poisson_ratio_interval(na, 60.0, nb, 60.0)
        covered += got.low <= 3.0 <= got.high
    assert 0.93 <= covered / reps <= 0.995, f"covered the true ratio in {covered}/{reps} repetitions"


def test_a_bootstrap_costs_a_draw_per_bucket_whatever_the_steps() -> None:
    """100,000 steps in a few dozen buckets resample as fast as 400 would: each resample draws one count per
    bucket (measured here: 2,000 resamples of two runs of 100,000 steps, 0.25 s on one core)."""
    rng = random.Random(5)
    sketch = Sketch.of_values([rng.lognormvariate(-4.6, 0.3) for _ in range(100_000)])
    buckets = stats._Buckets(sketch.points())
    assert len(buckets.counts) < 150
    assert sum(t is None for t in buckets.tables) > 10, "the large buckets drawn from the normal approximation"
    drawn = buckets.draw(random.Random(1))
    assert len(drawn) == len(buckets.counts)
    assert sum(drawn) == pytest.approx(100_000, rel=0.02), "a resample holds as many steps, give or take sqrt(n)"
