"""A training process's progress: steps done, declared long phases, and whether it is stalled.

Stalled means: no step for max(stall_factor x the median of the last 32 steps, stall_floor_s); or, for a training
process, no first step within first_step_timeout_s of instrument(); or a declared phase (`outrider.phase(
"checkpoint")`) open for longer than phase_timeout_s. Time inside a declared phase never counts towards a step
stall: a synchronous checkpoint or evaluation is expected to be long.

Written by the publisher thread (steps, drained from the hot path's ring) and by whichever thread opens or closes a
phase; read by the publisher thread. Single stores and dict operations under the GIL: no lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from time import perf_counter

RECENT = 32
MAX_PHASES = 100  # phase names are user input: more distinct ones are timed only while open


@dataclass(frozen=True)
class Stall:
    newly: bool  # this check found it (dump the stacks now)
    message: str


class Progress:
    def __init__(self, stall_factor: float = 10.0, stall_floor_s: float = 300.0, first_step_timeout_s: float = 1800.0,
                 phase_timeout_s: float = 3600.0, role: str = "", training_hint: bool = False) -> None:
        self.stall_factor = stall_factor
        self.stall_floor_s = stall_floor_s
        self.first_step_timeout_s = first_step_timeout_s
        self.phase_timeout_s = phase_timeout_s
        self.role = role
        self.training_hint = training_hint  # e.g. started by torchrun
        self.reset()

    def reset(self) -> None:
        """At start, and in a forked child (its parent's progress is the parent's)."""
        self.started_perf = perf_counter()
        self.steps = 0
        self.last_step_perf = 0.0
        self.recent = [0.0] * RECENT
        self._recent_at = 0
        self.open_phases: dict[str, float] = {}  # name -> perf_counter when opened
        self.phase_totals: dict[str, float] = {}  # name -> seconds in closed phases
        self.last_phase_end_perf = 0.0
        self.stalled_since_ns = 0
        self.stalls = 0
        self.training_seen = False  # a training API was used (step, data loader, phase)
        self.serving_seen = False  # a request was recorded

    # --- writers ---------------------------------------------------------------------------------------------
    def record_steps(self, count: int, last_end_perf: float, durations: list[float]) -> None:
        """Steps drained from the hot path's ring: the count is exact, durations may be the most recent only."""
        if count <= 0:
            return
        for d in durations[-RECENT:]:
            self.recent[self._recent_at % RECENT] = d
            self._recent_at += 1
        self.steps += count
        self.last_step_perf = last_end_perf

    def open_phase(self, name: str) -> None:
        self.training_seen = True
        self.open_phases.setdefault(name, perf_counter())

    def close_phase(self, name: str) -> None:
        since = self.open_phases.pop(name, None)
        if since is not None:
            now = perf_counter()
            if name in self.phase_totals or len(self.phase_totals) < MAX_PHASES:
                self.phase_totals[name] = self.phase_totals.get(name, 0.0) + (now - since)
            self.last_phase_end_perf = now

    # --- readers (the publisher) -----------------------------------------------------------------------------
    @property
    def training(self) -> bool:
        if self.role:
            return self.role == "training"
        return self.steps > 0 or self.training_seen or (self.training_hint and not self.serving_seen)

    @property
    def first_step_pending(self) -> bool:
        return self.training and self.steps == 0

    def phase_seconds(self) -> dict[str, tuple[float, bool]]:
        """Seconds spent in each declared phase so far (open ones included), and whether it is open now."""
        now = perf_counter()
        out = {name: (total, False) for name, total in self.phase_totals.items()}
        for name, since in list(self.open_phases.items()):
            out[name] = (out.get(name, (0.0, False))[0] + now - since, True)
        return out

    def last_step_wall_ns(self) -> int:
        """Wall time of the last step, derived here so the hot path reads one clock only."""
        if not self.steps:
            return 0
        return time.time_ns() - int((perf_counter() - self.last_step_perf) * 1e9)

    def check(self) -> Stall | None:
        """None while progressing; a Stall while stalled (newly set on the check that finds it)."""
        now = perf_counter()
        waited, threshold, what = self._wait(now)
        if waited <= threshold:
            self.stalled_since_ns = 0  # progress again
            return None
        newly = not self.stalled_since_ns
        if newly:
            self.stalled_since_ns = time.time_ns()
            self.stalls += 1
        return Stall(newly, f"{what} for {waited:.1f} s (threshold {threshold:.1f} s)")

    def _wait(self, now: float) -> tuple[float, float, str]:
        """How long this process has waited for progress, the threshold, and what it waits for."""
        phases = list(self.open_phases.items())
        if phases:
            name, since = min(phases, key=lambda p: p[1])
            return now - since, self.phase_timeout_s, f"declared phase {name!r} still open"
        if not self.steps:
            if not self.training:
                return 0.0, 1.0, ""
            since = max(self.started_perf, self.last_phase_end_perf)
            return now - since, self.first_step_timeout_s, "no first step"
        recent = sorted(d for d in self.recent if d > 0)
        median = recent[len(recent) // 2] if recent else 0.0
        threshold = max(self.stall_factor * median, self.stall_floor_s)
        since = max(self.last_step_perf, self.last_phase_end_perf)
        return now - since, threshold, f"no step completed after {self.steps} steps"
