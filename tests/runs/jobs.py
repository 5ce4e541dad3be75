"""Jobs whose every step and request is known, recorded through the real RunRecorder into a real RunStore on a
test's clock: each sweep sees what the job's hook had published by then (a flush every FLUSH_S: the cumulative
histograms, with or without their sketches, and the counters), the final sweep everything (the hook's closing
flush), as `outrider run` records a real job. The tests judge `outrider compare` against the job's own numbers."""

from __future__ import annotations

import itertools
import math
import re
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from outrider.ground.clock import ManualClock
from outrider.hook.series import DURATION_BOUNDS
from outrider.metrics.family import Family, HistogramValue
from outrider.runs.recorder import RunRecorder
from outrider.runs.store import RunRecord, RunStore
from outrider.shared.sketch import Sketch

FLUSH_S = 1.0


def histogram(values: Sequence[float], sketch: bool = True) -> HistogramValue:
    """The histogram the hook publishes of these values: classic buckets (le), sum, and the sketch."""
    counts = [0] * (len(DURATION_BOUNDS) + 1)
    for v in values:
        counts[bisect_left(DURATION_BOUNDS, v)] += 1
    return HistogramValue(DURATION_BOUNDS, tuple(counts), math.fsum(values),
                          Sketch.of_values(values) if sketch else None)


def own_quantile(values: Sequence[float], q: float) -> float:
    """The value of rank ceil(q * n), as the comparison reads a quantile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@dataclass
class Job:
    """A training loop (steps back to back, each after its data wait) and a service (requests back to back), both
    starting `start_s` after the run's first sweep."""

    steps: Sequence[float] = ()
    waits: Sequence[float] = ()  # the data wait before each step; none if empty
    requests: Sequence[float] = ()
    statuses: Sequence[int] = ()  # each request's status; 200 if empty
    routes: Sequence[str] = ()  # each request's route; /predict if empty
    samples_per_step: int = 32
    sketches: bool = True
    start_s: float = 0.3
    _step_ends: list[float] = field(default_factory=list)
    _request_ends: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        waits = self.waits or [0.0] * len(self.steps)
        self._step_ends = [self.start_s + t for t in itertools.accumulate(w + s for w, s in zip(waits, self.steps))]
        self._request_ends = [self.start_s + t for t in itertools.accumulate(self.requests)]

    @property
    def end_s(self) -> float:
        return max([self.start_s, *self._step_ends[-1:], *self._request_ends[-1:]])

    def families(self, published_s: float) -> list[Family]:
        """What a sweep sees when the hook last flushed at `published_s`."""
        fams = []
        n = bisect_right(self._step_ends, published_s)
        if n:
            steps = list(self.steps[:n])
            waits = list(self.waits[:n]) if self.waits else []
            fams += [Family("outrider_train_step_duration_seconds").add(histogram(steps, self.sketches), "0", ""),
                     Family("outrider_train_steps_total").add(float(n), "0", ""),
                     Family("outrider_samples_total").add(float(n * self.samples_per_step), "0", ""),
                     Family("outrider_train_loop_seconds_total").add(math.fsum(steps), "0", "", "step")
                                                                .add(math.fsum(waits), "0", "", "data_wait")]
            if waits:
                fams.append(Family("outrider_train_data_wait_seconds").add(histogram(waits, self.sketches), "0", ""))
        n = bisect_right(self._request_ends, published_s)
        if n:
            by: dict[tuple[str, int], list[float]] = {}
            for i in range(n):
                key = (self.routes[i] if self.routes else "/predict", self.statuses[i] if self.statuses else 200)
                by.setdefault(key, []).append(self.requests[i])
            durations, finished = (Family("outrider_request_duration_seconds"), Family("outrider_requests_total"))
            for (route, status), values in sorted(by.items()):
                labels = (route, "POST", "http", str(status), f"{status // 100}xx", "0", "")
                durations.add(histogram(values, self.sketches), *labels)
                finished.add(float(len(values)), *labels)
            fams += [durations, finished]
        return fams


def heartbeat(published_s: float) -> Family:
    """When the job's process last published, as the hook collector reports it (rates are timed by it)."""
    return Family("outrider_hook_last_heartbeat_timestamp_seconds").add(published_s, "0", "", "4242")


def record(store: RunStore, clock: ManualClock, job: Job, sweep_s: float = 5.0,
           before: Sequence[Family] = ()) -> RunRecord:
    """The job under `outrider run`: a sweep at the run's start and every sweep_s while it works, then the final
    sweep after its closing flush. `before`: families a process that started before the run adds to every sweep."""
    run_id = store.start_run(["job.py"])
    recorder = RunRecorder(store, run_id, window_s=4 * sweep_s, clock=clock.clock())
    base = clock.now
    t = 0.0
    while t < job.end_s:
        clock.now = base + t
        published = math.floor(t / FLUSH_S) * FLUSH_S
        recorder([*before, *job.families(published), heartbeat(base + published)])
        t += sweep_s
    clock.now = base + job.end_s + 0.1
    recorder([*before, *job.families(math.inf), heartbeat(base + job.end_s)])  # the closing flush
    clock.now += sweep_s  # the next run starts later
    return store.load(run_id)


def assert_printed_in_human_units(shown: str) -> None:
    """Every comparison: its label, A's and B's values, then no change or which is better and by how much, and
    the change with its interval and what it stands on; then what was not compared, and why."""
    compared, _, skipped = shown.partition("\nnot compared:\n")
    lines = [line.strip() for line in compared.splitlines() if line.startswith("  ")]
    assert lines, shown
    for line in lines:
        assert re.fullmatch(r"[^:]+: A [^:]+, B [^:]+: (no significant difference|B is .+?) \(([+-]<?[\d.]+%|\+∞) "
                            r"\[[+-][<\d.]+%, ([+-][<\d.]+%|\+∞)\]; [^)]+\)", line), line
    for line in skipped.splitlines():
        assert re.fullmatch(r"  [^:]+: .+", line), line
