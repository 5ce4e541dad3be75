"""Publishes 500 series through the hook (10 metrics x 50 label sets, under PREFIX) plus a request-id label
explosion, then waits for a file to appear. Twenty of these give the agent 10,000 hook series."""

from __future__ import annotations

import pathlib
import sys
import time

import outrider

hold, prefix = pathlib.Path(sys.argv[1]), sys.argv[2]
outrider.instrument()
for m in range(10):
    for i in range(50):
        outrider.counter(f"load_{prefix}_{m}", {"shard": str(i)}).inc(i + 1)
for request_id in range(500):  # a request id used as a label: capped per metric, counted
    outrider.counter("requests_by_id", {"request_id": f"req-{request_id}"}).inc()
while not hold.exists():
    time.sleep(0.05)
outrider.shutdown()
