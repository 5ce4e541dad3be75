"""A/B comparison of two runs: for each KPI, the ratio of means of run B to run A with a 95% bootstrap confidence
interval (percentile method, seeded), and a verdict only when the interval excludes no change."""

from __future__ import annotations

import random
from dataclasses import dataclass

from outrider.runs.store import RunRecord

# KPI -> (label, unit, higher is better)
KPIS = {
    "step_time_s": ("step time", "s", False),
    "samples_per_s": ("throughput", "samples/s", True),
    "latency_p99_s": ("p99 latency", "s", False),
    "latency_p50_s": ("p50 latency", "s", False),
    "requests_per_s": ("request rate", "req/s", True),
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

    @property
    def significant(self) -> bool:
        return not (self.low <= 1.0 <= self.high)

    def sentence(self) -> str:
        label, unit, higher_better = KPIS[self.kpi]
        ci = f"95% CI {100 * (self.low - 1):+.0f}% to {100 * (self.high - 1):+.0f}%"
        head = f"{label}: A {self.mean_a:.4g} {unit}, B {self.mean_b:.4g} {unit}"
        if not self.significant:
            return f"{head}: no significant difference ({ci}; n={self.n_a}/{self.n_b})"
        change = abs(self.ratio - 1)
        better = (self.ratio > 1) == higher_better
        if label in ("step time", "p99 latency", "p50 latency"):
            word = "faster" if better else "slower"
            lo, hi = sorted((abs(1 - self.low), abs(1 - self.high)))
        else:
            word = "higher" if self.ratio > 1 else "lower"
            lo, hi = sorted((abs(self.low - 1), abs(self.high - 1)))
        return f"{head}: B is {100 * change:.0f}% {word} (95% CI {100 * lo:.0f}-{100 * hi:.0f}%)"


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


def compare(a: RunRecord, b: RunRecord, warmup_fraction: float = 0.1) -> list[Comparison]:
    """Every KPI both runs have at least 5 samples of, after dropping each run's first 10% (warm-up)."""
    out = []
    for kpi in KPIS:
        xa, xb = _steady(a.values(kpi), warmup_fraction), _steady(b.values(kpi), warmup_fraction)
        if len(xa) < 5 or len(xb) < 5 or not sum(xa):
            continue
        ratio, low, high = bootstrap_ratio(xa, xb)
        out.append(Comparison(kpi, sum(xa) / len(xa), sum(xb) / len(xb), ratio, low, high, len(xa), len(xb)))
    return out


def _steady(values: list[float], warmup_fraction: float) -> list[float]:
    values = [v for v in values if v == v and v > 0]
    return values[int(len(values) * warmup_fraction):]
