"""A hooked training loop whose steps take known, distinct durations, timed by the loop itself: in every four steps,
three of 10 ms and one of 20 ms (slept to 2 ms before the end, then busy-waited to it on perf_counter), so any window
of a few steps has its median at 10 ms and its 99th percentile at 20 ms. Each step's own duration is appended to a
file (argv[1]) as the step ends, in order; it stops when a file (argv[2]) appears."""

from __future__ import annotations

import pathlib
import sys
import time

import outrider

PATTERN = (0.010, 0.010, 0.010, 0.020)
SPIN_S = 0.002  # the last part of each step is busy-waited: a sleep may end late, a spin ends on time

timed, hold = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
outrider.instrument()
with timed.open("a") as out:
    i = 0
    while not hold.exists():
        outrider.step_begin()
        start = time.perf_counter()
        deadline = start + PATTERN[i % len(PATTERN)]
        time.sleep(max(0.0, deadline - SPIN_S - start))
        while time.perf_counter() < deadline:
            pass
        took = time.perf_counter() - start
        outrider.step_end()
        out.write(f"{took!r}\n")
        out.flush()
        i += 1
