"""A/B comparison of two runs, step by step and request by request: for every statistic both runs recorded, B's
value over A's with a 95% interval (runs/stats.py), which run is better and by how much ("step time p50: A 8.07
ms, B 3.7 ms: B is 54% faster (-54% [-56%, -52%]; 400/400 steps)"), "no significant difference" only when the
interval covers no change, and "not enough data" only when there truly are too few steps, requests or counter
updates.

- Distributions (step time p50, mean, p99; data-loader wait p50 and mean; request latency p50, p90, p99 and mean,
  per route too where both runs served several; time to first token and inter-token latency p50 and p99): from
  the run's own distributions (runs/distributions.py, their steady part: the warm-up dropped), resampled item by
  item from their sketches. A percentile is its sketch's, within 1.08% of the true one, so the ratio of two is
  known to within a factor BASE (2.2%): its interval is widened by that much, and a difference the sketches
  cannot resolve is never called. The mean is the exact one (the histogram's sum over its count); its interval is
  the bootstrap's, moved onto it.
- Rates and shares (step rate, throughput, token throughput, request rate, the data wait's share of the loop):
  the counters' growth over the run (their running totals every sweep, from the first update to the last, the
  first 10% of that span dropped), with the ratio-of-sums interval over the intervals between their updates
  (Student's t), so a run of 30 s read every 5 s compares.
- Errors (4xx, 5xx): counted events, per second and per request, with the exact interval of a ratio of Poisson
  rates: more errors is worse, and errors in B where A had none is a finding, not "zero throughout A".
- Everything else the record samples per sweep (job CPU, memory, GPU): the mean of the steady sweeps (those with
  steps for a training KPI, with requests for an inference one, the first 10% dropped), bootstrapped by sweep.

A change whose interval excludes no change but reaches within NOISE (2%) of it is said with "perhaps by no more
than noise": the difference is there, perhaps too small to act on (Criterion's noise threshold). Records whose
histograms had no sketch compare a distribution's mean by counts and its percentiles per sweep; records made before
runs kept their distributions and counters compare per sweep, as Outrider did then; each such line says so."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from outrider.metrics import units
from outrider.metrics.family import HistogramValue
from outrider.metrics.rate import intervals
from outrider.runs import stats
from outrider.runs.distributions import RUN, STEADY, WARMUP
from outrider.runs.kpis import ACTIVITY, DISTRIBUTIONS, KPIS, Distribution, Kpi
from outrider.runs.stats import MEAN, Interval, Statistic
from outrider.runs.store import RunRecord
from outrider.shared.sketch import BASE

NOISE = 0.02
MIN_ITEMS = 30  # steps (requests, waits) each run needs for its distribution to be compared
TAIL_ITEMS = 3  # items each run needs beyond a quantile for it to be compared: p99 needs 300
MIN_SWEEPS = 5
MIN_INTERVALS = 2  # intervals between a counter's updates (a t interval needs two)

# KPIs taken from the job's counters (runs/recorder.py keeps their running totals): (the counter, the one it is a
# share of, or "" for a rate per second), and what the counter counts
FROM_COUNTERS: dict[str, tuple[str, str, str]] = {
    "steps_per_s": ("steps_total", "", "steps"), "samples_per_s": ("samples_total", "", "samples"),
    "tokens_per_s": ("tokens_total", "", "tokens"), "data_wait_fraction": (
        "data_wait_seconds_total", "loop_seconds_total", "s waited"),
    "mfu": ("flops_peak_seconds_total", "flops_timed_seconds_total", "s at the peak"),
    "requests_per_s": ("requests_total", "", "requests"),
}
ERROR_KPIS = {"client_errors_per_s": "client_errors_total", "server_errors_per_s": "server_errors_total"}
SHARE_OF_REQUESTS = {"client_errors_per_s": Kpi("client_error_share", "client errors (4xx) per request", "ratio",
                                                better="lower", phase="inference"),
                     "server_errors_per_s": Kpi("server_error_share", "server errors (5xx) per request", "ratio",
                                                better="lower", phase="inference")}
PER_SWEEP_NOTE = "per sweep, each sweep weighing the same: {who} recorded before runs kept {what}"
CLASSIC_NOTE = "per sweep, from classic buckets, which are coarse: the record has no sketch"


@dataclass(frozen=True)
class Comparison:
    kpi: str  # what was compared: a KPI key, or a distribution's key and statistic (step_time p50)
    kind: Kpi  # its label, unit and which way is better
    value_a: float
    value_b: float
    interval: Interval  # of value_b / value_a
    counted: str  # what each value stands on: 360/360 steps, 5/5 intervals, 40/41 sweeps
    note: str = ""  # how it was compared, where not as it should be (an older record)

    @property
    def ratio(self) -> float:
        return self.interval.ratio

    @property
    def low(self) -> float:
        return self.interval.low

    @property
    def high(self) -> float:
        return self.interval.high

    @property
    def significant(self) -> bool:
        return self.interval.significant

    @property
    def within_noise(self) -> bool:
        """Significant, but the interval reaches within NOISE of no change: the change may be that small."""
        return self.significant and self.low < 1.0 + NOISE and self.high > 1.0 / (1.0 + NOISE)

    @property
    def up(self) -> bool:
        """Significant, and B's the higher: the interval lies above no change (the way it says, whatever the point
        estimate: a bootstrap's ratio of exactly 1 may have an interval all above it)."""
        return self.low > 1.0

    @property
    def verdict(self) -> str:
        """same (no significant difference), noise (significant, perhaps within NOISE), better, worse, or higher /
        lower (a number that does not judge)."""
        if not self.significant:
            return "same"
        if self.within_noise:
            return "noise"
        if self.kind.better:
            return "better" if self.up == (self.kind.better == "higher") else "worse"
        return "higher" if self.up else "lower"

    def sentence(self) -> str:
        k = self.kind
        head = f"{k.label}: A {k.format(self.value_a)}, B {k.format(self.value_b)}"
        tail = f"({_change(self.interval)}; {self.counted}{'; ' + self.note if self.note else ''})"
        if not self.significant:
            return f"{head}: no significant difference {tail}"
        judged = f", {self.verdict}" if self.verdict in ("better", "worse") else ""
        noise = f", perhaps by no more than noise ({units.percent(NOISE)})" if self.within_noise else ""
        if math.isinf(self.ratio):  # none in A
            return f"{head}: B is higher{judged}, at least {units.number(self.low)}x{noise} {tail}"
        if k.kind == "seconds" and k.better == "lower":
            word = "slower" if self.up else "faster"
        else:
            word = ("higher" if self.up else "lower") + judged
        return f"{head}: B is {units.percent(abs(self.ratio - 1.0))} {word}{noise} {tail}"


@dataclass(frozen=True)
class Skipped:
    kpi: str
    label: str
    why: str
    counted: str = ""

    def sentence(self) -> str:
        return f"{self.label}: {self.why}" + (f" ({self.counted})" if self.counted else "")


def _change(i: Interval) -> str:
    return f"{_signed(i.ratio - 1.0)} [{_signed(i.low - 1.0)}, {_signed(i.high - 1.0)}]"


def _signed(x: float) -> str:
    if math.isinf(x):
        return "+∞"
    return ("+" if x >= 0 else "-") + units.percent(abs(x))


def _name(stat: Statistic) -> str:
    return MEAN if stat == MEAN else f"p{round(100 * float(stat)):d}"


def needed(stat: Statistic) -> int:
    """The items each run needs for this statistic to be compared."""
    return MIN_ITEMS if stat == MEAN else max(MIN_ITEMS, math.ceil(TAIL_ITEMS / (1.0 - float(stat)) - 1e-9))


# --- distributions ---------------------------------------------------------------------------------------------

def compare_distribution(ha: HistogramValue, hb: HistogramValue, key: str, label: str, items: str,
                         wanted: Sequence[Statistic], resamples: int = stats.RESAMPLES, seed: int = stats.SEED,
                         warmup: tuple[int, int] = (0, 0)) -> tuple[list[Comparison], list[Skipped]]:
    """Each wanted statistic of two runs' distributions (both with sketches), B over A, from resamples of their
    items (runs/stats.bootstrap); `warmup`: the items each run's record dropped before them, to be said."""
    assert ha.sketch is not None and hb.sketch is not None
    na, nb = ha.count, hb.count
    counted = f"{units.count(na)}/{units.count(nb)} {items}"
    if any(warmup):
        counted += f" after {units.count(warmup[0])}/{units.count(warmup[1])} of warm-up"
    done: list[Comparison] = []
    skipped: list[Skipped] = []
    kept = []
    for stat in wanted:
        if min(na, nb) < needed(stat):
            skipped.append(Skipped(f"{key} {_name(stat)}", f"{label} {_name(stat)}",
                                   f"not enough data (at least {units.count(needed(stat))} {items} each)", counted))
        else:
            kept.append(stat)
    if not kept:
        return done, skipped
    pa, pb = ha.sketch.points(), hb.sketch.points()
    va, vb = stats.of_points(pa, kept), stats.of_points(pb, kept)
    ra = stats.bootstrap(pa, kept, resamples, seed)
    rb = stats.bootstrap(pb, kept, resamples, seed + 1)
    assert va is not None and vb is not None
    for stat, a, b, sa, sb in zip(kept, va, vb, ra, rb):
        kind = Kpi(f"{key} {_name(stat)}", f"{label} {_name(stat)}", "seconds", better="lower")
        if a <= 0 or b <= 0:
            skipped.append(Skipped(kind.key, kind.label, f"A {units.seconds(a)}, B {units.seconds(b)}: a ratio "
                                                         "needs both above 0", counted))
            continue
        low, high = stats.percentile_interval(sa, sb)
        if stat == MEAN:  # the exact means (sum over count); the bootstrap's spread moved onto their ratio
            exact_a, exact_b = ha.sum / na, hb.sum / nb
            move = (exact_b / exact_a) / (b / a)
            a, b, low, high = exact_a, exact_b, low * move, high * move
        else:  # each percentile is within RELATIVE_ERROR of the true one: their ratio within a factor BASE
            low, high = low / BASE, high * BASE
        done.append(Comparison(kind.key, kind, a, b, Interval(b / a, low, high), counted))
    return done, skipped


def _sketched(h: HistogramValue | None) -> bool:
    return h is not None and h.sketch is not None and h.sketch.count == h.count


def _steady(rec: RunRecord, key: str) -> HistogramValue | None:
    return rec.distributions.get(key, {}).get(STEADY)


def _warmup(rec: RunRecord, key: str) -> int:
    """The items the record's steady part leaves out."""
    parts = rec.distributions.get(key, {})
    return parts[RUN].count - parts[STEADY].count if RUN in parts and STEADY in parts else 0


def _mean_by_counts(a: RunRecord, b: RunRecord, d: Distribution) -> Comparison | Skipped | None:
    """A distribution's mean from its running count and sum per sweep (a record without sketches): the ratio of
    sums over the intervals between the count's updates, weighted by the items each held."""
    found = [intervals(_totals(r, f"{d.key}_sum_s"), _totals(r, f"{d.key}_count"), WARMUP) for r in (a, b)]
    kind = Kpi(f"{d.key} {MEAN}", f"{d.label} {MEAN}", "seconds", better="lower")
    ra, rb = (stats.sums_ratio(x) for x in found)
    counted = f"{len(found[0])}/{len(found[1])} intervals of {d.items}"
    if ra is None or rb is None:
        return Skipped(kind.key, kind.label, f"not enough data (the count updated at too few sweeps: at least "
                                             f"{MIN_INTERVALS + 1} each)", counted)
    note = "by sweep, weighted by its " + d.items + ": the record has no sketch"
    return Comparison(kind.key, kind, ra.value, rb.value, stats.sums_ratio_interval(ra, rb), counted, note)


class _Outcome:
    """What a comparison found, in the order found, and the per-sweep KPIs already compared another way."""

    def __init__(self) -> None:
        self.done: list[Comparison] = []
        self.skipped: list[Skipped] = []
        self.replaced: set[str] = set()

    def add(self, found: Comparison | Skipped | None) -> None:
        if isinstance(found, Comparison):
            self.done.append(found)
        elif found is not None:
            self.skipped.append(found)


def _distributions(a: RunRecord, b: RunRecord, d: Distribution, out: _Outcome) -> None:
    """One distribution of both runs: step by step where both have sketches; the mean by counts and the
    percentiles per sweep where the record has classic buckets only; per sweep, as then, where a record is older
    than distributions. Said so on every line that is not step by step."""
    out.replaced.update(kpi for _, kpi in d.per_sweep)
    older = _lacking(a, b, lambda r: bool(r.distributions))
    if older:
        note = PER_SWEEP_NOTE.format(who=older, what="their distributions")
        for _, kpi in d.per_sweep:
            out.add(_per_sweep(a, b, kpi, note))
        return
    ha, hb = _steady(a, d.key), _steady(b, d.key)
    if ha is None or hb is None:
        if ha is not None or hb is not None:
            out.add(Skipped(d.key, d.label, f"recorded in {'A' if hb is None else 'B'} only"))
        return
    if _sketched(ha) and _sketched(hb):
        got, missed = compare_distribution(ha, hb, d.key, d.label, d.items, d.stats,
                                           warmup=(_warmup(a, d.key), _warmup(b, d.key)))
        out.done.extend(got)
        out.skipped.extend(missed)
        if d.by_route:
            _routes(a, b, d, out)
        return
    if MEAN in d.stats:
        out.add(_mean_by_counts(a, b, d))
    for stat, kpi in d.per_sweep:
        if stat != MEAN:
            out.add(_per_sweep(a, b, kpi, CLASSIC_NOTE))


def _routes(a: RunRecord, b: RunRecord, d: Distribution, out: _Outcome) -> None:
    """Per route, where both runs served more than one route."""
    prefix = d.key + ":"
    routes = sorted(k for k in a.distributions if k.startswith(prefix) and k in b.distributions)
    if len(routes) < 2:
        return
    for key in routes:
        ha, hb = _steady(a, key), _steady(b, key)
        if _sketched(ha) and _sketched(hb):
            assert ha is not None and hb is not None
            got, missed = compare_distribution(ha, hb, key, f"{d.label} {key[len(prefix):] or '(no route)'}",
                                               d.items, (0.5, 0.99), warmup=(_warmup(a, key), _warmup(b, key)))
            out.done.extend(got)
            out.skipped.extend(missed)


# --- counters: rates, shares, errors ---------------------------------------------------------------------------

def from_counters(rec: RunRecord, kpi: str, warmup_fraction: float = WARMUP) -> list[tuple[float, float]] | None:
    """(growth, seconds or growth of the whole) over the intervals between the counter's updates, the first
    `warmup_fraction` of their span dropped (metrics/rate.intervals); None for a KPI not taken from counters, or a
    record without them."""
    if kpi not in FROM_COUNTERS:
        return None
    part, whole, _ = FROM_COUNTERS[kpi]
    if part not in rec.samples or (whole and whole not in rec.samples):
        return None
    if whole:  # a share: both counters move at the same publications, whatever the reads' lag
        return intervals(_totals(rec, part), _totals(rec, whole), warmup_fraction)
    return _timed(intervals(_totals(rec, part), None, warmup_fraction))


def _timed(found: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intervals of a counter over seconds, less a last one much shorter than the others: the final sweep reads
    the job's closing flush at once, while every other read lags the hook's last flush by up to its interval, so
    that interval's seconds are short of the work it counted (measured: 48 steps "in 0.11 s" of a job at 50/s;
    kept, it widened the interval of two 30-s runs' ratio of rates from +-3% to +-10%)."""
    if len(found) > 2:
        usual = sorted(s for _, s in found[:-1])[(len(found) - 1) // 2]
        if found[-1][1] < usual / 2:
            return found[:-1]
    return found


def _totals(rec: RunRecord, name: str) -> list[tuple[float, float]]:
    """A running total's points, from 0 at the run's start: the record keeps a total from the first sweep at which
    it is above 0 (it starts at 0 at the run's first sweep), so that first point is an update of the counter too."""
    points = rec.samples.get(name, [])
    return [(rec.started, 0.0), *points] if points and points[0][1] > 0 and points[0][0] > rec.started else points


def _has_totals(rec: RunRecord) -> bool:
    """Whether the record kept the job's counters as running totals (records since the rates from counters)."""
    return any(name in rec.samples for name, _, _ in FROM_COUNTERS.values())


def _rate(a: RunRecord, b: RunRecord, kpi: str) -> Comparison | Skipped | None:
    part, _, what = FROM_COUNTERS[kpi]
    total_a, total_b = (max((v for _, v in r.samples.get(part, [])), default=0.0) for r in (a, b))
    if not total_a and not total_b:
        return None
    k = KPIS[kpi]
    ia, ib = from_counters(a, kpi) or [], from_counters(b, kpi) or []
    if what.startswith("s "):
        amounts = f"{units.seconds(total_a)}/{units.seconds(total_b)}{what[1:]}"
    else:
        amounts = f"{units.count(round(total_a))}/{units.count(round(total_b))} {what}"
    counted = f"{amounts}, {len(ia)}/{len(ib)} intervals"
    if not total_a or not total_b:
        return Skipped(kpi, k.label, f"{'B' if total_a else 'A'} did none", counted)
    ra, rb = stats.sums_ratio(ia), stats.sums_ratio(ib)
    if ra is None or rb is None:
        return Skipped(kpi, k.label, f"not enough data (the counter updated at too few sweeps: at least "
                                     f"{MIN_INTERVALS + 1} each, 15 s at the default 5-s sweeps)", counted)
    return Comparison(kpi, k, ra.value, rb.value, stats.sums_ratio_interval(ra, rb), counted)


def _errors(a: RunRecord, b: RunRecord, kpi: str) -> list[Comparison | Skipped]:
    """Errors of a class per second and per request, over the span of the requests' counter."""
    name = ERROR_KPIS[kpi]
    seen = []
    for rec in (a, b):
        requests = _totals(rec, "requests_total")
        spans = _timed(intervals(requests, None, WARMUP))
        errors = intervals(_totals(rec, name), requests, WARMUP)[:len(spans)]
        seen.append((sum(x for x, _ in errors), sum(n for n, _ in spans), sum(s for _, s in spans)))
    (ea, qa, sa), (eb, qb, sb) = seen
    if not ea and not eb:
        return []
    out: list[Comparison | Skipped] = []
    k, share = KPIS[kpi], SHARE_OF_REQUESTS[kpi]
    if not sa or not sb:
        return [Skipped(kpi, k.label, f"{'A' if not sa else 'B'} served no request")]
    counted = f"{units.count(ea)}/{units.count(eb)} errors in {units.seconds(sa)}/{units.seconds(sb)}"
    out.append(Comparison(kpi, k, ea / sa, eb / sb, stats.poisson_ratio_interval(ea, sa, eb, sb), counted))
    counted = f"{units.count(ea)}/{units.count(eb)} errors in {units.count(qa)}/{units.count(qb)} requests"
    out.append(Comparison(share.key, share, ea / qa, eb / qb, stats.poisson_ratio_interval(ea, qa, eb, qb), counted))
    return out


# --- per sweep: gauges, and records made before the above --------------------------------------------------------

def _per_sweep(a: RunRecord, b: RunRecord, kpi: str, note: str) -> Comparison | Skipped | None:
    """The mean of the KPI's steady sweeps, bootstrapped by sweep."""
    xa, xb = steady(a, kpi), steady(b, kpi)
    if not any(xa) and not any(xb):
        return None  # not measured, or zero throughout, in both
    k = KPIS[kpi]
    counted = f"{len(xa)}/{len(xb)} sweeps"
    if len(xa) < MIN_SWEEPS or len(xb) < MIN_SWEEPS:
        return Skipped(kpi, k.label, f"not enough data (at least {MIN_SWEEPS} sweeps each after warm-up)", counted)
    mean_a, mean_b = sum(xa) / len(xa), sum(xb) / len(xb)
    if not mean_a:
        return Skipped(kpi, k.label, f"zero throughout A, B {k.format(mean_b)}", counted)
    ratio, low, high = bootstrap_ratio(xa, xb)
    return Comparison(kpi, k, mean_a, mean_b, Interval(ratio, low, high), counted, note)


def bootstrap_ratio(a: list[float], b: list[float], resamples: int = stats.RESAMPLES, seed: int = stats.SEED,
                    level: float = stats.LEVEL) -> tuple[float, float, float]:
    """(ratio of means b/a, low, high) with a percentile bootstrap interval, resampling whole samples (sweeps)."""
    rng = random.Random(seed)
    ma, mb = [], []
    for _ in range(resamples):
        ma.append(sum(rng.choices(a, k=len(a))) / len(a))
        mb.append(sum(rng.choices(b, k=len(b))) / len(b))
    low, high = stats.percentile_interval(ma, mb, level)
    return (sum(b) / len(b)) / (sum(a) / len(a)), low, high


def steady(rec: RunRecord, kpi: str, warmup_fraction: float = WARMUP) -> list[float]:
    """The KPI's values in the sweeps that count (a training KPI those with steps, an inference KPI those with
    requests, the rest those where the job did either, or all for a command without the hook), warm-up dropped."""
    phase = KPIS[kpi].phase
    signals = [ACTIVITY[phase]] if phase else list(ACTIVITY.values())
    active = {t for name in signals for t, v in rec.samples.get(name, []) if v > 0}
    values = [v for t, v in rec.samples.get(kpi, []) if math.isfinite(v) and (t in active or not active)]
    return values[int(len(values) * warmup_fraction):]


# --- the whole comparison -----------------------------------------------------------------------------------------

def _lacking(a: RunRecord, b: RunRecord, has: Callable[[RunRecord], bool]) -> str:
    """Which of the two records lacks something: A, B, or A and B."""
    return " and ".join(name for name, rec in (("A", a), ("B", b)) if not has(rec))


def _errors_kept(rec: RunRecord) -> bool:
    """Whether the record counted its errors by class as running totals (or served nothing to count them of)."""
    return "requests_total" not in rec.samples or any(name in rec.samples for name in ERROR_KPIS.values())


def compare_all(a: RunRecord, b: RunRecord) -> tuple[list[Comparison], list[Skipped]]:
    """Every statistic either run recorded, in the order a person reads them (training, serving, the machine):
    compared, or said why not."""
    out = _Outcome()
    counted = _has_totals(a) and _has_totals(b)

    def rate(kpi: str) -> None:
        if counted:
            out.add(_rate(a, b, kpi))
            out.replaced.add(kpi)

    _distributions(a, b, DISTRIBUTIONS["step_time"], out)
    for kpi in ("steps_per_s", "samples_per_s", "tokens_per_s"):
        rate(kpi)
    _distributions(a, b, DISTRIBUTIONS["data_wait"], out)
    rate("data_wait_fraction")
    rate("mfu")
    for key in ("latency", "ttft", "inter_token"):
        _distributions(a, b, DISTRIBUTIONS[key], out)
    rate("requests_per_s")
    if counted and _errors_kept(a) and _errors_kept(b):
        for kpi in ERROR_KPIS:
            for found in _errors(a, b, kpi):
                out.add(found)
            out.replaced.add(kpi)
    for kpi in KPIS:  # the rest per sweep: gauges, and what an older record kept no better
        if kpi in out.replaced:
            continue
        note = ""
        if kpi in FROM_COUNTERS:
            note = PER_SWEEP_NOTE.format(who=_lacking(a, b, _has_totals), what="their counters")
        elif kpi in ERROR_KPIS:
            note = PER_SWEEP_NOTE.format(who=_lacking(a, b, lambda r: _has_totals(r) and _errors_kept(r)),
                                         what="their error counts")
        out.add(_per_sweep(a, b, kpi, note))
    return out.done, out.skipped


def compare(a: RunRecord, b: RunRecord) -> list[Comparison]:
    return compare_all(a, b)[0]
