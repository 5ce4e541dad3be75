"""The clocks a component reads, passed in: production gets the system's, a test its own (never patched into the
time module, which every other module and thread shares)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    monotonic: Callable[[], float] = time.monotonic  # intervals, deadlines: seconds, never jumps
    wall: Callable[[], float] = time.time  # timestamps: seconds since the epoch, may jump
    wall_ns: Callable[[], int] = time.time_ns  # the same in nanoseconds (the spool's heartbeats)


SYSTEM = Clock()


class ManualClock:
    """A clock a test moves: `now` seconds on the monotonic clock, `epoch + now` on the wall clock."""

    def __init__(self, now: float = 0.0, epoch: float = 1_000_000_000.0) -> None:
        self.now = now
        self.epoch = epoch

    def clock(self) -> Clock:
        return Clock(monotonic=lambda: self.now, wall=lambda: self.epoch + self.now,
                     wall_ns=lambda: int((self.epoch + self.now) * 1e9))
