"""The bottleneck verdict over a sliding window of sweeps: what the diagnosis collector reports and what a run
records, each with a window of its own.

Until the first window with steps or requests, a busy process is starting (the interpreter, imports, loading a
model or a dataset): there is nothing to diagnose yet, so no verdict is given (idle excepted). Once the job has
been active, every window gets one."""

from __future__ import annotations

import collections
import time

from outrider.diagnosis.bottleneck import Verdict, classify
from outrider.diagnosis.signals import signals, snapshot
from outrider.metrics.family import Family


class VerdictWindow:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._snaps: collections.deque[tuple[float, dict[str, float]]] = collections.deque()
        self.verdict: Verdict | None = None
        self.active_seen = False

    def add(self, families: list[Family], now: float | None = None) -> Verdict | None:
        """Take a sweep; the verdict between the oldest sweep still in the window and this one."""
        now = time.monotonic() if now is None else now
        self._snaps.append((now, snapshot(families)))
        while len(self._snaps) > 2 and now - self._snaps[1][0] >= self.window_s:
            self._snaps.popleft()
        if len(self._snaps) >= 2:
            (t0, old), (t1, new) = self._snaps[0], self._snaps[-1]
            s = signals(old, new, t1 - t0)
            verdict = classify(s)
            self.active_seen = self.active_seen or s.steps_per_s > 0 or s.requests_per_s > 0
            if self.active_seen or verdict.cls == "idle":
                self.verdict = verdict
        return self.verdict
