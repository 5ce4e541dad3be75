"""A run's verdict: the bottleneck class that held longest over the run's active windows, with the evidence
averaged over the time it held, and the timeline of classes beside it.

Each sweep's verdict (diagnosis/window.VerdictWindow: the last window_s of sweeps) speaks for the time since the
sweep before it, so every second of the run is counted once. Idle windows do not vote: a job that loads for a
minute and then trains for ten is judged on the ten. Windows not judged (without the evidence their rule needs,
diagnosis/bottleneck.NOT_JUDGED) do not vote either; their time is shown beside the verdict. A run that was idle
throughout is `idle`; a run shorter than two sweeps, or none of whose windows was judged, has no verdict (""): one
with windows not judged beside idle ones is not idle (a window is not judged only once the job has worked, or while
it uses CPU), and the recorder gives no verdict to a run that stepped or served though every window it judged was
idle (runs/recorder.py): the headline never says idle above the steps and requests the summary counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from outrider.diagnosis.bottleneck import CLASSES, NOT_JUDGED, advice, classify
from outrider.diagnosis.signals import Signals
from outrider.metrics import units
from outrider.runs.kpis import describe, evidence_order, is_count

IDLE = "idle"
NO_VOTE = (IDLE, NOT_JUDGED)  # windows that never decide a run's verdict
HUNG = "hung_before_first_step"  # set by the recorder, not by a window: no step ever, and a rank stalled waiting


@dataclass(frozen=True)
class Segment:
    start: float  # unix seconds
    end: float
    cls: str


@dataclass
class RunVerdict:
    cls: str  # "" when no window was judged
    reason: str  # the reason the diagnosis gave in the latest window of that class
    evidence: dict[str, float]  # time-weighted mean over the windows of that class
    seconds: dict[str, float] = field(default_factory=dict)  # how long each class held, idle included

    @property
    def active_s(self) -> float:
        return sum(s for c, s in self.seconds.items() if c not in NO_VOTE)

    @property
    def share(self) -> float:
        """The share of the active time (of all the time, for an idle run) the verdict held."""
        if self.cls in (IDLE, HUNG):
            return 1.0
        return self.seconds.get(self.cls, 0.0) / self.active_s if self.active_s else 0.0

    @property
    def recommendation(self) -> str:
        if self.cls == HUNG:
            return ("Read the stall's Python stacks: a rendezvous, a barrier or a collective that some rank never "
                    "joined, NCCL or process-group initialisation, or a DataLoader that never yields.")
        return advice(self.cls, Signals.from_evidence(self.evidence)) if self.cls else ""

    def headline(self) -> str:
        """`input_bound, 82% of the 24.1 s the job was active (balanced 18%; idle 3.2 s)`."""
        if not self.cls:
            if self.reason:  # the recorder's: the job worked, though no window saw it at work
                return f"none: {self.reason}"
            unjudged = self.seconds.get(NOT_JUDGED, 0.0)
            if unjudged:
                return (f"none: not judged ({units.seconds(unjudged)} without the measurements the rules need: "
                        "per-thread CPU, operations or steps)")
            return "none: the run ended before the agent had two sweeps to compare"
        if self.cls == IDLE:
            return f"idle: no steps, requests or CPU use in {units.seconds(self.seconds.get(IDLE, 0.0))}"
        if self.cls == HUNG:
            return f"hung before its first step: {self.reason}"
        others = [f"{c} {units.percent(s / self.active_s)}" for c, s in
                  sorted(self.seconds.items(), key=lambda kv: -kv[1]) if c not in (self.cls, *NO_VOTE) and s > 0]
        idle, unjudged = self.seconds.get(IDLE, 0.0), self.seconds.get(NOT_JUDGED, 0.0)
        aside = "; ".join(x for x in (", ".join(others), f"idle {units.seconds(idle)}" if idle else "",
                                      f"not judged {units.seconds(unjudged)}" if unjudged else "") if x)
        return (f"{self.cls}, {units.percent(self.share)} of the {units.seconds(self.active_s)} the job was active"
                + (f" ({aside})" if aside else ""))

    def evidence_rows(self) -> list[tuple[str, str]]:
        """(label, value) in human units; counts, flags and rates that are zero (no GPUs, no retries, no requests
        in a training job) left out, internal flags never shown."""
        where = {k: v for k, v in self.evidence.items() if k.startswith("in_") and k.endswith("_fraction")}
        keys = [k for k in evidence_order(list(self.evidence)) if k not in where and k not in HIDDEN
                and (self.evidence[k] or not (is_count(k) or k.endswith("_per_s")))]
        rows = [_describe(k, self.evidence[k]) for k in keys]
        if where:  # the loop thread's stack samples (hook/profiler.py), one row: the largest share first
            rows.append(("where the loop thread is (samples)", ", ".join(
                f"{k[3:-9]} {units.percent(v)}" for k, v in sorted(where.items(), key=lambda kv: -kv[1]) if v)))
        return rows

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunVerdict:
        return cls(str(data.get("cls", "")), str(data.get("reason", "")),
                   {str(k): float(v) for k, v in dict(data.get("evidence", {})).items()},
                   {str(k): float(v) for k, v in dict(data.get("seconds", {})).items()})


# Diagnosis evidence (diagnosis/signals.Signals) that is bookkeeping, not a number to read; and the data wait on
# the loop's own time, which decides input_bound on a crowded machine and which the reason then states beside the
# one data wait shown everywhere (the loop's time in the DataLoader over its wall time)
HIDDEN = ("ops_counted", "torch_cpu_only", "loop_samples", "data_wait_alone_fraction")
def _threads_worth(v: float) -> str:
    return f"{units.number(v)} threads' worth"


# Human names and units for the diagnosis's own signals (runs/kpis.py names the KPIs)
LABELS: dict[str, tuple[str, Callable[[float], str]]] = {
    "main_thread_busy": ("main thread busy (CPU + waiting for one)", units.percent),
    "main_thread_cpu": ("main thread CPU", units.cores),
    "intra_op_busy": ("intra-op pool busy", _threads_worth),
    "intra_op_threads": ("intra-op threads", units.count),
    "main_cpu_us_per_op": ("main-thread CPU per operation", lambda v: units.seconds(v / 1e6)),
    "ops_per_step": ("operations per step", units.count),
    "data_workers_cpu_cores": ("DataLoader workers' CPU", units.cores),
    "data_worker_busy": ("each DataLoader worker busy", units.percent),
    "storage_read_bytes_per_s": ("read from storage", lambda v: units.bytes_iec(v) + "/s"),
    "io_pressure_fraction": ("host I/O pressure", units.percent),
    "run_delay_fraction": ("waiting for a CPU (run delay)", units.percent),
    "step_fraction": ("step work", units.percent),
    "other_fraction": ("outside data, step and checkpoints", units.percent),
    "checkpoint_fraction": ("in checkpoints", units.percent),
    "container_mem_ratio": ("container memory used (of its limit)", units.percent),
    "starved_data_wait_fraction": ("starved rank's data wait", units.percent),
    "collective_fraction": ("in collectives", units.percent),
    "collective_wait_fraction": ("blocked in collectives", units.percent),
    "straggler_rank": ("straggler rank", lambda v: f"{v:g}"),
    "starved_rank": ("starved rank", lambda v: f"{v:g}"),
    "straggler_compute_ratio": ("slowest rank's compute", lambda v: f"{v:.1f}x the others'"),
    "others_wait_fraction": ("other ranks waiting in collectives", units.percent),
    "gpu_busy_ratio": ("GPU busy per step", units.percent),
    "data_workers_delay_cores": ("DataLoader workers waiting for a CPU", units.cores),
    "data_worker_delay_fraction": ("each DataLoader worker waiting for a CPU", units.percent),
    "other_threads_busy": ("other threads busy (CPU + waiting for one)", _threads_worth),
    "loop_waiting_fraction": ("loop thread waiting outside the process", units.percent),
    "request_latency_s": ("request latency (mean)", units.seconds),
    "request_queue_s": ("queued per request", units.seconds),
    "request_cpu_s": ("CPU per request", units.seconds),
    "request_cpu_wait_s": ("waiting for a CPU per request", units.seconds),
    "demand_per_process": ("threads' demand per process (CPU + waiting for one)", units.cores),
    "request_waiting_fraction": ("requests' time waiting outside the process", units.percent),
}


def _describe(key: str, value: float) -> tuple[str, str]:
    if key in LABELS:
        label, fmt = LABELS[key]
        return label, fmt(value)
    return describe(key, value)


# Evidence that names something (a rank) rather than measures it: the latest window's, never a mean
IDENTIFIERS = ("straggler_rank", "starved_rank")
# Shares the run's evidence takes from the job's counters over the time the class held (the growth of each in the
# sweeps it held), not as a mean of its windows' shares: the summary's data wait over the whole run is the same
# ratio of the same counters, so the two agree wherever the class held throughout.
COUNTED_SHARES = {"data_wait_fraction": ("data_wait_seconds_total", "loop_seconds_total")}


class VerdictTally:
    """Adds up window verdicts as a run goes; `result()` is the run's verdict so far, `segments` its timeline."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}
        self._weighted: dict[str, dict[str, float]] = {}  # class -> evidence key -> sum of value x seconds
        self._weight: dict[str, dict[str, float]] = {}  # class -> evidence key -> seconds it was present
        self._latest: dict[str, dict[str, float]] = {}  # class -> identifier -> the latest window's value
        self._counted: dict[str, dict[str, float]] = {}  # class -> counter -> its growth while the class held
        self._frames: dict[str, dict[tuple[str, str], float]] = {}  # class -> frame -> sum of share x seconds
        self._reason: dict[str, str] = {}
        self.segments: list[Segment] = []

    def add(self, cls: str, reason: str, evidence: dict[str, float], start: float, end: float,
            frames: Iterable[tuple[str, str, float]] = (), counted: dict[str, float] | None = None) -> None:
        """One window's verdict, speaking for [start, end): its evidence, the loop's top frames in it, and how
        much the job's counters (COUNTED_SHARES) grew in that time."""
        dt = max(0.0, end - start)
        self._seconds[cls] = self._seconds.get(cls, 0.0) + dt
        self._reason[cls] = reason
        sums, weights = self._weighted.setdefault(cls, {}), self._weight.setdefault(cls, {})
        for key, value in evidence.items():
            if key in IDENTIFIERS:
                self._latest.setdefault(cls, {})[key] = value
                continue
            sums[key] = sums.get(key, 0.0) + value * dt
            weights[key] = weights.get(key, 0.0) + dt
        grown = self._counted.setdefault(cls, {})
        for key, value in (counted or {}).items():
            grown[key] = grown.get(key, 0.0) + value
        shares = self._frames.setdefault(cls, {})
        for where, frame, share in frames:
            shares[(where, frame)] = shares.get((where, frame), 0.0) + share * dt
        if self.segments and self.segments[-1].cls == cls and self.segments[-1].end == start:
            self.segments[-1] = Segment(self.segments[-1].start, end, cls)
        else:
            self.segments.append(Segment(start, end, cls))

    def result(self) -> RunVerdict:
        """The run's verdict so far, explained from its own evidence (the reason's numbers are the evidence's)
        where that evidence gives the same class; else with the reason of the class's latest window."""
        active = {c: s for c, s in self._seconds.items() if c not in NO_VOTE and s > 0}
        if active:
            cls = max(active, key=lambda c: (active[c], -_rank(c)))
        elif self._seconds.get(IDLE) and not self._seconds.get(NOT_JUDGED):  # a window not judged was not idle
            cls = IDLE
        else:
            return RunVerdict("", "", {}, dict(self._seconds))
        # every class with seconds was add()ed, which set each of its tables; one that held has held > 0 s
        sums, weights = self._weighted[cls], self._weight[cls]
        evidence = {k: round(sums[k] / weights[k], 4) if weights[k] else sums[k] for k in sums}
        evidence.update(self._latest.get(cls, {}))
        grown = self._counted[cls]
        for key, (part, whole) in COUNTED_SHARES.items():
            if grown.get(whole, 0.0) > 0:
                evidence[key] = round(grown.get(part, 0.0) / grown[whole], 4)
        held = self._seconds[cls]
        frames = [(w, f, n / held) for (w, f), n in self._frames[cls].items()]
        reason = self._reason[cls]
        explained = classify(Signals.from_evidence(evidence, frames))
        if explained.cls == cls:
            reason = explained.reason
        return RunVerdict(cls, reason, evidence, dict(self._seconds))


def _rank(cls: str) -> int:
    return CLASSES.index(cls) if cls in CLASSES else len(CLASSES)


def from_timeline(changes: Sequence[tuple[float, str, str, dict[str, float]]], end: float) -> VerdictTally:
    """The tally of a record that kept only its verdict changes (each class holding until the next change, the
    last until `end`): for records written before runs kept their verdict, or cut short."""
    tally = VerdictTally()
    for i, (t, cls, reason, evidence) in enumerate(changes):
        until = changes[i + 1][0] if i + 1 < len(changes) else max(end, t)
        tally.add(cls, reason, evidence, t, until)
    return tally


def timeline_text(segments: Iterable[Segment], t0: float, most: int = 6) -> str:
    """`0:00-0:05 idle · 0:05-0:21 input_bound`, run time from t0; the longest `most` segments when there are more."""
    segs = list(segments)
    shown = segs if len(segs) <= most else sorted(sorted(segs, key=lambda s: s.start - s.end)[:most],
                                                  key=lambda s: s.start)
    text = " · ".join(f"{units.run_time(s.start - t0)}-{units.run_time(s.end - t0)} {s.cls}" for s in shown)
    return text + (f" (and {len(segs) - most} shorter)" if len(segs) > most else "")
