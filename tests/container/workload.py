"""The workload of the sidecar pod tests: an instrumented training loop (the hook pip-installed from the agent's
wheel) that runs WORKLOAD_STEPS steps of 8 samples, says which uid it ran as, waits for the test's go-ahead (a
file in /control) and exits 0. The hook's exit handler writes its last values and marks its shard closed.
WORKLOAD_START_DELAY_S: seconds it spends before instrument() (imports, data loading); WORKLOAD_KILLED_AT_ONCE: it
is SIGKILLed before anything (an OOM kill at start, a node's eviction)."""

from __future__ import annotations

import os
import pathlib
import signal
import time

import outrider


def main() -> int:
    control = pathlib.Path("/control")
    if os.environ.get("WORKLOAD_KILLED_AT_ONCE"):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(os.environ.get("WORKLOAD_START_DELAY_S", "0")))
    outrider.instrument()
    for _ in range(int(os.environ.get("WORKLOAD_STEPS", "30"))):
        with outrider.step(samples=8):
            time.sleep(0.02)
    (control / "uid").write_text(str(os.getuid()))
    deadline = time.monotonic() + 300
    while not (control / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
