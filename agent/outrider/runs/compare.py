"""A/B comparison of two runs: for every KPI both runs recorded (runs/kpis.py), the ratio of means of run B to
run A with a 95% bootstrap confidence interval (percentile method, seeded), a judgement only when the interval
excludes no change, the means in human units and the number of sweeps behind each.

Which sweeps count: a training KPI only those with steps, an inference KPI only those with requests, the rest
those where the job did either (every sweep, for a command without the hook); then each run's first 10% of them
is dropped as warm-up.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from outrider.metrics import units
from outrider.runs.kpis import ACTIVITY, KPIS
from outrider.runs.store import RunRecord

MIN_SAMPLES = 5


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

    @property
    def significant(self) -> bool:
        return not (self.low <= 1.0 <= self.high)

    def sentence(self) -> str:
        k = KPIS[self.kpi]
        counts = f"n = {self.n_a}/{self.n_b} sweeps"
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

    def sentence(self) -> str:
        return f"{KPIS[self.kpi].label}: {self.why} (n = {self.n_a}/{self.n_b} sweeps)"


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "-") + units.percent(abs(x))


def bootstrap_ratio(a: list[float], b: list[float], resamples: int = 2000, seed: int = 7,
                    level: float = 0.95) -> tuple[float, float, float]:
    """(ratio of means b/a, low, high) with a percentile bootstrap interval."""
    rng = random.Random(seed)
    ratios = []
    na, nb = len(a), len(b)
    for _ in range(resamples):
        ma = sum(rng.choices(a, k=na)) / na
        mb = sum(rng.choices(b, k=nb)) / nb
        if ma:
            ratios.append(mb / ma)
    ratios.sort()
    tail = (1 - level) / 2
    low = ratios[int(tail * (len(ratios) - 1))]
    high = ratios[int((1 - tail) * (len(ratios) - 1))]
    return (sum(b) / nb) / (sum(a) / na), low, high


def compare_all(a: RunRecord, b: RunRecord, warmup_fraction: float = 0.1) -> tuple[list[Comparison], list[Skipped]]:
    """Every KPI either run recorded: compared where both have at least MIN_SAMPLES steady sweeps and A's mean is
    not zero, otherwise said why not."""
    done, skipped = [], []
    for kpi in KPIS:
        xa, xb = steady(a, kpi, warmup_fraction), steady(b, kpi, warmup_fraction)
        if not any(v for _, v in a.samples.get(kpi, [])) and not any(v for _, v in b.samples.get(kpi, [])):
            continue  # not measured, or zero throughout, in both
        if len(xa) < MIN_SAMPLES or len(xb) < MIN_SAMPLES:
            skipped.append(Skipped(kpi, len(xa), len(xb), f"too few sweeps to compare (at least {MIN_SAMPLES} "
                                                          "each after warm-up)"))
        elif not sum(xa):
            skipped.append(Skipped(kpi, len(xa), len(xb), f"zero throughout A, B {KPIS[kpi].format(_mean(xb))}"))
        else:
            ratio, low, high = bootstrap_ratio(xa, xb)
            done.append(Comparison(kpi, _mean(xa), _mean(xb), ratio, low, high, len(xa), len(xb)))
    return done, skipped


def compare(a: RunRecord, b: RunRecord, warmup_fraction: float = 0.1) -> list[Comparison]:
    return compare_all(a, b, warmup_fraction)[0]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def steady(rec: RunRecord, kpi: str, warmup_fraction: float = 0.1) -> list[float]:
    """The KPI's values in the sweeps that count (see the module's docstring), warm-up dropped."""
    phase = KPIS[kpi].phase
    signals = [ACTIVITY[phase]] if phase else list(ACTIVITY.values())
    active = {t for name in signals for t, v in rec.samples.get(name, []) if v > 0}
    values = [v for t, v in rec.samples.get(kpi, []) if math.isfinite(v) and (t in active or not active)]
    return values[int(len(values) * warmup_fraction):]
