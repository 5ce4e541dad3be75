"""A/B comparison of two runs: for every KPI both runs recorded (runs/kpis.py), the ratio of means of run B to
run A with a 95% bootstrap confidence interval (percentile method, seeded), a judgement only when the interval
excludes no change, the means in human units and the number of samples behind each.

Rates (steps/s, samples/s, tokens/s, requests/s) and the data-wait share come from the job's counters, which the
record keeps as running totals every sweep: the samples are consecutive intervals of the run, each from one
update of the counter to the next (metrics/rate.intervals), between its first and last update; a rate's mean is
the counter's growth over their time (a share's, the part's growth over the whole's), resampled by whole
intervals. Never per sweep: a sweep between two of the hook's flushes sees nothing and the next one twice
as much, and keeping only the sweeps that saw steps doubled the demo's step rate.

For the other KPIs, which sweeps count: a training KPI only those with steps, an inference KPI only those with
requests, the rest those where the job did either (every sweep, for a command without the hook). Either way each
run's first 10% is dropped as warm-up. Records from before the totals were kept compare their rates per sweep.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from outrider.metrics import units
from outrider.metrics.rate import intervals
from outrider.runs.kpis import ACTIVITY, KPIS
from outrider.runs.store import RunRecord

MIN_SAMPLES = 5


# KPIs taken from the job's counters (runs/recorder.py keeps their running totals): (the counter, the one it is a
# share of, or "" for a rate per second)
FROM_COUNTERS: dict[str, tuple[str, str]] = {
    "steps_per_s": ("steps_total", ""), "samples_per_s": ("samples_total", ""),
    "tokens_per_s": ("tokens_total", ""), "requests_per_s": ("requests_total", ""),
    "data_wait_fraction": ("data_wait_seconds_total", "loop_seconds_total"),
}


@dataclass(frozen=True)
class Comparison:
    kpi: str
    mean_a: float
    mean_b: float
    ratio: float  # mean_b / mean_a
    low: float
    high: float
    n_a: int
    n_b: int
    what: str = "sweeps"  # what the samples are: sweeps, or intervals of the counters

    @property
    def significant(self) -> bool:
        return not (self.low <= 1.0 <= self.high)

    def sentence(self) -> str:
        k = KPIS[self.kpi]
        counts = f"n = {self.n_a}/{self.n_b} {self.what}"
        head = f"{k.label}: A {k.format(self.mean_a)}, B {k.format(self.mean_b)}"
        if not self.significant:
            return (f"{head}: no significant difference (95% CI {_signed(self.low - 1)} to {_signed(self.high - 1)};"
                    f" {counts})")
        lo, hi = sorted((abs(self.low - 1), abs(self.high - 1)))
        if k.kind == "seconds" and k.better == "lower":
            word = "faster" if self.ratio < 1 else "slower"
        else:
            word = "higher" if self.ratio > 1 else "lower"
            if k.better:
                word += " (better)" if (self.ratio > 1) == (k.better == "higher") else " (worse)"
        return (f"{head}: B is {units.percent(abs(self.ratio - 1))} {word} (95% CI {units.percent(lo)} to "
                f"{units.percent(hi)}; {counts})")


@dataclass(frozen=True)
class Skipped:
    kpi: str
    n_a: int
    n_b: int
    why: str
    what: str = "sweeps"

    def sentence(self) -> str:
        return f"{KPIS[self.kpi].label}: {self.why} (n = {self.n_a}/{self.n_b} {self.what})"


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "-") + units.percent(abs(x))


Sample = tuple[float, float]  # (amount, weight): a mean is sum(amounts) / sum(weights)


def bootstrap_ratio(a: list[float], b: list[float], resamples: int = 2000, seed: int = 7,
                    level: float = 0.95) -> tuple[float, float, float]:
    """(ratio of means b/a, low, high) with a percentile bootstrap interval."""
    return bootstrap_weighted([(x, 1.0) for x in a], [(x, 1.0) for x in b], resamples, seed, level)


def bootstrap_weighted(a: list[Sample], b: list[Sample], resamples: int = 2000, seed: int = 7,
                       level: float = 0.95) -> tuple[float, float, float]:
    """bootstrap_ratio of weighted samples (a counter's growth over an interval's seconds): the means are ratios
    of sums, resampled by whole samples."""
    rng = random.Random(seed)
    ratios = []
    na, nb = len(a), len(b)
    for _ in range(resamples):
        ma, mb = _mean(rng.choices(a, k=na)), _mean(rng.choices(b, k=nb))
        if ma:
            ratios.append(mb / ma)
    ratios.sort()
    tail = (1 - level) / 2
    low = ratios[int(tail * (len(ratios) - 1))]
    high = ratios[int((1 - tail) * (len(ratios) - 1))]
    return _mean(b) / _mean(a), low, high


def compare_all(a: RunRecord, b: RunRecord, warmup_fraction: float = 0.1) -> tuple[list[Comparison], list[Skipped]]:
    """Every KPI either run recorded: compared where both have at least MIN_SAMPLES steady samples and A's mean is
    not zero, otherwise said why not."""
    done, skipped = [], []
    for kpi in KPIS:
        if not any(v for _, v in a.samples.get(kpi, [])) and not any(v for _, v in b.samples.get(kpi, [])):
            continue  # not measured, or zero throughout, in both
        counted = from_counters(a, kpi, warmup_fraction) is not None and \
            from_counters(b, kpi, warmup_fraction) is not None
        what = "intervals" if counted else "sweeps"
        xa, xb = samples(a, kpi, warmup_fraction, counted), samples(b, kpi, warmup_fraction, counted)
        if len(xa) < MIN_SAMPLES or len(xb) < MIN_SAMPLES:
            skipped.append(Skipped(kpi, len(xa), len(xb), f"too few {what} to compare (at least {MIN_SAMPLES} "
                                                          "each after warm-up)", what))
        elif not _mean(xa):
            skipped.append(Skipped(kpi, len(xa), len(xb), f"zero throughout A, B {KPIS[kpi].format(_mean(xb))}",
                                   what))
        else:
            ratio, low, high = bootstrap_weighted(xa, xb)
            done.append(Comparison(kpi, _mean(xa), _mean(xb), ratio, low, high, len(xa), len(xb), what))
    return done, skipped


def compare(a: RunRecord, b: RunRecord, warmup_fraction: float = 0.1) -> list[Comparison]:
    return compare_all(a, b, warmup_fraction)[0]


def _mean(xs: list[Sample]) -> float:
    weight = sum(w for _, w in xs)
    return sum(x for x, _ in xs) / weight if weight else 0.0


def samples(rec: RunRecord, kpi: str, warmup_fraction: float = 0.1, counted: bool = True) -> list[Sample]:
    """The KPI's samples: from the counters where the record kept them (and `counted`), else its steady sweeps."""
    found = from_counters(rec, kpi, warmup_fraction) if counted else None
    return found if found is not None else [(v, 1.0) for v in steady(rec, kpi, warmup_fraction)]


def from_counters(rec: RunRecord, kpi: str, warmup_fraction: float = 0.1) -> list[Sample] | None:
    """(growth, seconds or growth of the whole) over the intervals of the run's counters (see the module's
    docstring); None for a KPI not taken from counters, or a record without them."""
    if kpi not in FROM_COUNTERS:
        return None
    part, whole = FROM_COUNTERS[kpi]
    if part not in rec.samples or (whole and whole not in rec.samples):
        return None
    return intervals(rec.samples[part], rec.samples[whole] if whole else None, warmup_fraction)


def steady(rec: RunRecord, kpi: str, warmup_fraction: float = 0.1) -> list[float]:
    """The KPI's values in the sweeps that count (see the module's docstring), warm-up dropped."""
    phase = KPIS[kpi].phase
    signals = [ACTIVITY[phase]] if phase else list(ACTIVITY.values())
    active = {t for name in signals for t, v in rec.samples.get(name, []) if v > 0}
    values = [v for t, v in rec.samples.get(kpi, []) if math.isfinite(v) and (t in active or not active)]
    return values[int(len(values) * warmup_fraction):]
