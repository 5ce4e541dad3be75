"""Records a run as it goes, into the run store: KPIs per sweep (rates and the data-wait share from the job's
counters over time, metrics/rate.py, whose running totals it keeps too, errors by class included; the rest from the
difference with the previous sweep), the run's duration distributions (step time, data wait, request latency:
what their histograms recorded from the run's first sweep to its latest, runs/distributions.py, kept current, with
their running count and sum in every sweep's KPIs), the verdict timeline and the run's verdict so far
(runs/verdict.py), alert transitions from the agent's own rule evaluation, and events (stalls). It also keeps what
the final sweep cannot say of processes that never stepped (their gauges go with them): which ranks waited for a
first step and which of those stalled, so the summary and the verdict can say the job hung before its first step
rather than that it was idle.

It is a sweep listener (`__call__`) and an alert listener (`on_alert`, wired by the runner in front of the
notifiers); both may be called from the sampler's thread and from the runner's final sweep, hence the lock. A
store that fails is logged once and the run goes on: the record is a convenience, the workload is not.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from outrider.diagnosis.bottleneck import Verdict, nothing_ran
from outrider.diagnosis.signals import Signals, signals, snapshot
from outrider.diagnosis.window import VerdictWindow
from outrider.ground.clock import SYSTEM, Clock
from outrider.metrics.family import Family, HistogramValue, merged_histogram
from outrider.metrics.quantile import quantile
from outrider.metrics.rate import CounterHistory, family_samples
from outrider.rules.notification import Notification
from outrider.runs.distributions import RunDistributions
from outrider.runs.measured import Waiting
from outrider.runs.store import AlertRecord, RunStore
from outrider.runs.verdict import HUNG, IDLE, RunVerdict, Segment, VerdictTally

LOG = logging.getLogger("outrider.runs")
HISTOGRAMS = ("outrider_train_step_duration_seconds", "outrider_request_duration_seconds")
# The job's counters a record keeps as running totals every sweep (the name in the record -> the metric and the
# labels its series must have), and the rates and shares taken from them over the time between the hook's
# publications seen by two sweeps (metrics/rate.py), never over the time between the sweeps: a sweep between two
# of the hook's flushes sees none, the next one two.
TOTALS = {"steps_total": ("outrider_train_steps_total", {}), "samples_total": ("outrider_samples_total", {}),
          "tokens_total": ("outrider_tokens_total", {}), "requests_total": ("outrider_requests_total", {}),
          "loop_seconds_total": ("outrider_train_loop_seconds_total", {}),
          "data_wait_seconds_total": ("outrider_train_loop_seconds_total", {"part": "data_wait"}),
          # MFU: the time the steps' FLOPs would take at the peak, over the loop's time of the same steps
          "flops_peak_seconds_total": ("outrider_train_flops_peak_seconds_total", {}),
          "flops_timed_seconds_total": ("outrider_train_flops_timed_seconds_total", {})}
# Counted for their rates only: finished requests by error kind
ERRORS = {"client_errors": ("outrider_requests_total", {"status_class": "4xx"}),
          "server_errors": ("outrider_requests_total", {"status_class": "5xx"})}
RATES = {"steps_per_s": "steps_total", "samples_per_s": "samples_total", "tokens_per_s": "tokens_total",
         "requests_per_s": "requests_total", "client_errors_per_s": "client_errors",
         "server_errors_per_s": "server_errors"}
SHARES = {"data_wait_fraction": ("data_wait_seconds_total", "loop_seconds_total"),
          "mfu": ("flops_peak_seconds_total", "flops_timed_seconds_total")}
WORKED_UNSEEN = ("the job stepped or served, but no window saw it at work (its steps or requests fell between two "
                 "of the agent's sweeps; every window judged was idle)")
KEPT_READS = 64  # sweeps of counters kept: a window spans one sweep, or a few where the sweeps outpace the hook
# finished requests by error class, kept as running totals in the record once the job serves (compare's counts)
ERROR_TOTALS = {kind: f"{kind}_total" for kind in ERRORS}


def _delta(new: HistogramValue | None, old: HistogramValue | None) -> HistogramValue | None:
    return None if new is None else new.since(old)


RESTED = "nothing ran since the previous sweep: no step or request completed, none in flight, no CPU or GPU use"


def nothing_ran_since(s: Signals, rates: dict[str, float | None], families: list[Family]) -> bool:
    """Whether nothing ran between the previous sweep and this one (`s`: the two sweeps' signals): the time a run's
    verdict does not count as active, whatever its window says (a window of diagnosis_window_s still holds the work
    before a stop). Steps and requests from the job's counters between the hook's publications (`rates`, from
    metrics/rate.py: a sweep between two flushes sees none of a running job's), the CPU and GPUs from the sweeps; a
    request still in flight is work."""
    published = {key: rate for key, rate in rates.items() if rate is not None}
    s = replace(s, steps_per_s=published.get("steps_per_s", s.steps_per_s),
                requests_per_s=published.get("requests_per_s", s.requests_per_s))
    in_flight = sum(v for _, _, v in family_samples(families, ("outrider_requests_in_flight",)))
    return in_flight == 0 and nothing_ran(s)


# What a sweep keeps for the next: its monotonic and wall times, its signals' snapshot, its histograms
_Swept = tuple[float, float, dict[str, float], dict[str, HistogramValue | None]]


class RunRecorder:
    def __init__(self, store: RunStore | None, run_id: str, window_s: float = 30.0, clock: Clock = SYSTEM) -> None:
        self.store = store
        self.clock = clock
        self.run_id = run_id
        self.window = VerdictWindow(window_s)
        self.tally = VerdictTally()
        self.alerts: list[AlertRecord] = []  # every time an alert fired during the run, for the summary
        self._open: dict[str, int] = {}  # fingerprint -> its entry in alerts while it fires
        self._prev: _Swept | None = None
        self._last_verdict = ""
        self._stalled: set[str] = set()
        self.hooked = False  # some hooked process published during the run
        self.stepped = False  # some step completed during the run
        self.served = False  # some request finished during the run
        self._waiting: dict[str, float] = {}  # rank -> longest time it waited for a first step
        self._first_step_stalled: set[str] = set()  # ranks stalled while waiting for a first step
        self._lock = threading.Lock()
        self._store_failed = False
        self.counters = CounterHistory({**TOTALS, **ERRORS}, keep=KEPT_READS)
        self.distributions = RunDistributions()

    def __call__(self, families: list[Family]) -> None:
        with self._lock:
            self._sweep(families)

    def _sweep(self, families: list[Family]) -> None:
        now, t = self.clock.monotonic(), self.clock.wall()
        snap = snapshot(families)
        hists = {name: merged_histogram(families, name) for name in HISTOGRAMS}
        prev, self._prev = self._prev, (now, t, snap, hists)
        kpis: dict[str, float] = {}
        self._rss_and_stalls(families, t, kpis)
        self._first_steps(families, t)
        grown = self._add_counters(families, now, kpis)
        self._distributions(families, kpis)
        rates = self._rates(prev is not None, kpis)
        rested = prev is not None and self._since_previous(prev, now, snap, hists, rates, families, kpis)
        if kpis:
            self._write(RunStore.add_samples, t, kpis)
        verdict = self.window.add(families, now)
        if verdict is None or prev is None:
            return
        self._record_verdict(verdict, rested, prev[1], t, grown)

    def _rss_and_stalls(self, families: list[Family], t: float, kpis: dict[str, float]) -> None:
        """The watched tree's RSS into the KPIs; stalls and resumes as events."""
        for f in families:
            if f.defn.name == "outrider_watched_memory_rss_bytes" and f.samples:
                kpis["rss_bytes"] = float(f.samples[0][1])  # type: ignore[arg-type]
            if f.defn.name == "outrider_hook_stalled":
                self._stalls(f, t)

    def _add_counters(self, families: list[Family], now: float, kpis: dict[str, float]) -> dict[str, float]:
        """The job's counters added to their running totals, which go into the KPIs (the error totals too, once
        the job serves); returns what each total grew by in this sweep."""
        before = {name: self.counters.total(name) for name in TOTALS}
        self.counters.add(now, family_samples(families, self.counters.metrics))
        grown = {name: self.counters.total(name) - before[name] for name in TOTALS}
        kpis.update({name: self.counters.total(name) for name in TOTALS if self.counters.total(name)})
        if self.counters.total("requests_total"):  # zero errors too, once serving: a record that counts them
            kpis.update({name: self.counters.total(kind) for kind, name in ERROR_TOTALS.items()})
        return grown

    def _rates(self, swept_before: bool, kpis: dict[str, float]) -> dict[str, float | None]:
        """The counters' rates and shares into the KPIs; returns the rates (None: not measured yet)."""
        rates = {kpi: self.counters.rate(name) for kpi, name in RATES.items()}
        for kpi, rate in rates.items():
            # not measured yet is no sample; a counter that no process publishes (a training job's requests) is 0
            if rate is not None or (swept_before and not self.counters.published(RATES[kpi])):
                kpis[kpi] = rate or 0.0
        for kpi, (part, whole) in SHARES.items():
            share = self.counters.ratio(part, whole)
            if share is not None:
                kpis[kpi] = share
        return rates

    @staticmethod
    def _since_previous(prev: _Swept, now: float, snap: dict[str, float], hists: dict[str, HistogramValue | None],
                        rates: dict[str, float | None], families: list[Family], kpis: dict[str, float]) -> bool:
        """The KPIs taken from the difference with the previous sweep (its signals, the step time and latency
        percentiles of what the histograms recorded since); returns whether nothing ran in between."""
        s = signals(prev[2], snap, now - prev[0])
        kpis["process_cpu_cores"] = s.process_cpu_cores
        for key in ("step_time_s", "gpu_util", "gpu_mem_ratio", "host_cpu_util"):
            value = getattr(s, key)
            if value is not None:
                kpis[key] = value
        for hist, kpi in zip(HISTOGRAMS, ("step", "latency")):
            since = _delta(hists[hist], prev[3][hist])
            if since is not None and since.count:
                kpis[f"{kpi}_p50_s"] = quantile(0.5, since) or 0.0
                kpis[f"{kpi}_p99_s"] = quantile(0.99, since) or 0.0
        return nothing_ran_since(s, rates, families)

    def _record_verdict(self, verdict: Verdict, rested: bool, since: float, t: float, grown: dict[str, float]) -> None:
        """This window's verdict speaks for the time since the previous sweep (`since`): that is where its segment
        starts; unless nothing ran in that time (the window still holds the work before it)."""
        cls, reason, evidence, frames = verdict.cls, verdict.reason, verdict.evidence, verdict.frames
        if rested and cls != IDLE:
            cls, reason, evidence, frames = IDLE, RESTED, {}, ()
        self.tally.add(cls, reason, evidence, since, t, frames, grown)
        if cls != self._last_verdict:
            self._last_verdict = cls
            self._write(RunStore.add_verdict, since, cls, reason, evidence)
        self._write(RunStore.set_run_verdict, self.tally.result())

    def _distributions(self, families: list[Family], kpis: dict[str, float]) -> None:
        """The run's distributions so far into the store (those that grew), and the running count and sum of each
        (all routes merged) into this sweep's KPIs: a mean over any stretch of the run, by counts."""
        self.distributions.add(families)
        for key, whole, steady in self.distributions.changed():
            self._write(RunStore.set_distribution, key, whole, steady)
        for key, total in self.distributions.totals.items():
            if ":" not in key:
                kpis[f"{key}_count"] = float(total.count)
                kpis[f"{key}_sum_s"] = total.sum

    def _stalls(self, fam: Family, t: float) -> None:
        for labels, v in fam.samples:
            rank = labels[0] or "-"
            if v and rank not in self._stalled:
                self._stalled.add(rank)
                self._write(RunStore.add_event, t, "stall", f"rank {rank} stalled")
            elif not v and rank in self._stalled:
                self._stalled.discard(rank)
                self._write(RunStore.add_event, t, "resume", f"rank {rank} resumed")

    def _first_steps(self, families: list[Family], t: float) -> None:
        """Ranks waiting for a first step in this sweep, how long so far, and whether they are stalled."""
        by_name = {f.defn.name: f for f in families}
        processes = by_name.get("outrider_hook_processes")
        if processes is not None and any(v for _, v in processes.samples):
            self.hooked = True
        steps = by_name.get("outrider_train_steps_total")
        if steps is not None and any(v for _, v in steps.samples):
            self.stepped = True
        requests = by_name.get("outrider_requests_total")
        if requests is not None and any(v for _, v in requests.samples):
            self.served = True
        pending = by_name.get("outrider_train_first_step_pending")
        if pending is None:
            return
        rank_at = pending.defn.label_names.index("rank")
        started = _by_rank(by_name.get("outrider_train_start_timestamp_seconds"))
        stalled = _by_rank(by_name.get("outrider_hook_stalled"))
        for labels, v in pending.samples:
            if v != 1:
                continue
            rank = labels[rank_at] or "-"
            since = started.get(rank)
            self._waiting[rank] = max(self._waiting.get(rank, 0.0), t - since if since else 0.0)
            if stalled.get(rank):
                self._first_step_stalled.add(rank)

    def waiting(self) -> Waiting | None:
        """The ranks that waited for a first step, when no step completed in the whole run."""
        with self._lock:
            if self.stepped or not self._waiting:
                return None
            return Waiting(sorted(self._waiting), sorted(self._first_step_stalled), max(self._waiting.values()))

    def on_alert(self, n: Notification) -> None:
        """An alert transition from the agent's rule engine (firing or resolved); never raises into the engine.
        Heartbeats (the Watchdog, always firing) are not the run's news: not kept."""
        if n.heartbeat:
            return
        try:
            with self._lock:
                summary = n.annotations.get("summary", "") or n.annotations.get("description", "")
                if n.event == "firing":
                    self._open[n.fingerprint] = len(self.alerts)
                    self.alerts.append(AlertRecord(n.alertname, dict(n.labels), summary, n.firing_since, None,
                                                   n.starts_at))
                    self._write(RunStore.alert_fired, n.fingerprint, dict(n.labels), summary, n.firing_since,
                                n.starts_at)
                elif n.event == "resolved":
                    ended = n.ends_at or self.clock.wall()
                    at = self._open.pop(n.fingerprint, None)
                    if at is None:  # it fired before this run (the agent's saved state)
                        self.alerts.append(AlertRecord(n.alertname, dict(n.labels), summary, n.firing_since, ended,
                                                       n.starts_at))
                    else:  # keeps the summary it fired with
                        self.alerts[at] = replace(self.alerts[at], resolved=ended)
                    self._write(RunStore.alert_resolved, n.fingerprint, dict(n.labels), summary, n.firing_since,
                                ended, n.starts_at)
        except Exception:
            LOG.exception("recording an alert transition failed")

    def verdict(self) -> RunVerdict:
        """The tally's verdict; a run in which no step completed and a rank stalled waiting for its first is
        `hung_before_first_step` whatever its windows said (they saw no steps: idle, mostly); a run whose windows
        were all idle though it stepped or served (its work fell between two sweeps) has none: never idle above
        the steps and requests its summary counts."""
        with self._lock:
            result = self.tally.result()
            if result.cls == IDLE and (self.stepped or self.served):
                return RunVerdict("", WORKED_UNSEEN, {}, dict(result.seconds))
            if self.stepped or not self._first_step_stalled:
                return result
            ranks = sorted(self._first_step_stalled)
            who = "the training process" if ranks == ["-"] else f"rank {', '.join(ranks)}"
            reason = (f"{who} completed no step within the first-step timeout, and none completed later "
                      f"(its Python stacks are in the stall's page and beside its shard in the spool)")
            evidence = {"first_step_wait_s": round(max(self._waiting.values(), default=0.0), 1)}
            return RunVerdict(HUNG, reason, evidence, dict(result.seconds))

    def timeline(self) -> list[Segment]:
        with self._lock:
            return list(self.tally.segments)

    def _write(self, method: Callable[..., None], *args: Any) -> None:
        """store.method(run_id, *args), unless the store is gone."""
        if self.store is None:
            return
        try:
            method(self.store, self.run_id, *args)
        except Exception as e:
            if not self._store_failed:
                LOG.warning("the run record stopped taking writes (%s): the run goes on without it", e)
            self._store_failed = True


def _by_rank(fam: Family | None) -> dict[str, float]:
    """A per-rank gauge's values by rank ("-": none), the largest where several training jobs share a rank."""
    if fam is None:
        return {}
    at = fam.defn.label_names.index("rank")
    out: dict[str, float] = {}
    for labels, v in fam.samples:
        if isinstance(v, float):
            rank = labels[at] or "-"
            out[rank] = max(out.get(rank, v), v)
    return out
