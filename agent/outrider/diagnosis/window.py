"""The bottleneck verdict over a sliding window of sweeps: what the diagnosis collector reports and what a run
records, each with a window of its own.

Until a window begins with the job at work (steps or requests already counted at its start), a busy process is
starting (the interpreter, imports, loading a model or a dataset, the first batch): there is nothing to diagnose
yet, so no verdict is given (idle excepted); a window that holds the job's first steps and the start before them
is not judged either (its first second once read input_bound on a checkpoint-heavy loop): `not_judged` where an
idle window came before it, so that idle never speaks for a window with steps or requests in it. Once the job has
been active, every window gets one, `not_judged` where the evidence its rule needs is missing.

A window is judged from the oldest of its sweeps that already had every measurement the newest one has (per-thread
CPU, operations counted, the loop's stack samples): the hook publishes those from its first step on, and a counter
that appears mid-window holds time from before the window. So the first windows of a run are shorter, not blind:
a 40 s job is judged from its first seconds, not called "balanced" for its first 30."""

from __future__ import annotations

import collections
import time

from outrider.diagnosis.bottleneck import NOT_JUDGED, Verdict, classify
from outrider.diagnosis.signals import signals, snapshot
from outrider.metrics.family import Family

# Cumulative measurements a window must have at both ends to use them (diagnosis/signals.py keys)
NEEDED = ("cpu_main", "autograd_ops", "prof_total")
FIRST_STEPS = "the job's first steps or requests, in a window that began before them (its start)"


class VerdictWindow:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._snaps: collections.deque[tuple[float, dict[str, float]]] = collections.deque()
        self.verdict: Verdict | None = None
        self.active_seen = False

    def add(self, families: list[Family], now: float | None = None) -> Verdict | None:
        """Take a sweep; the verdict between the oldest usable sweep still in the window and this one."""
        now = time.monotonic() if now is None else now
        self._snaps.append((now, snapshot(families)))
        while len(self._snaps) > 2 and now - self._snaps[1][0] >= self.window_s:
            self._snaps.popleft()
        if len(self._snaps) >= 2:
            (t0, old), (t1, new) = self.start(), self._snaps[-1]
            s = signals(old, new, t1 - t0)
            verdict = classify(s)
            active = s.steps_per_s > 0 or s.requests_per_s > 0 or bool(s.requests_in_flight)
            had_work = bool(old.get("step_count", 0) or old.get("requests", 0) or old.get("in_flight", 0))
            if active and not self.active_seen and not had_work:
                # the job's first steps: this window still begins before them (the imports, the first batch,
                # the workers' start); judged from the next sweep on, a window that begins with the job at work.
                # Not judged rather than no verdict once one was given: the time before it may have been idle,
                # this window's was not
                if self.verdict is not None:
                    self.verdict = Verdict(NOT_JUDGED, verdict.evidence, FIRST_STEPS, verdict.frames)
                return self.verdict
            self.active_seen = self.active_seen or active or had_work
            if self.active_seen or verdict.cls == "idle":
                self.verdict = verdict
        return self.verdict

    def start(self) -> tuple[float, dict[str, float]]:
        """The oldest sweep but the newest that has every NEEDED key the newest has; the oldest when none has."""
        new = self._snaps[-1][1]
        needed = [k for k in NEEDED if k in new]
        for t, snap in list(self._snaps)[:-1]:
            if all(k in snap for k in needed):
                return t, snap
        return self._snaps[0]
