"""A workload that times itself, for `outrider compare`'s end-to-end tests: a training loop whose steps sleep
STEP_S each, or a service whose requests do, under outrider.instrument(); it writes the durations it timed itself
(between the hook's step begin and end, or around each request) to OUT as JSON, for the test to judge the
comparison against.

    python timed_loop.py train STEP_S N OUT
    python timed_loop.py serve STEP_S N [ERROR_EVERY] OUT   (every ERROR_EVERY-th request answers 500)
"""

from __future__ import annotations

import json
import sys
import time

import outrider


def main() -> None:
    kind, seconds, n, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[-1]
    error_every = int(sys.argv[4]) if len(sys.argv) > 5 else 0
    outrider.instrument()
    timed = []
    for i in range(n):
        if kind == "train":
            outrider.step_begin()
            t0 = time.perf_counter()
            time.sleep(seconds)
            timed.append(time.perf_counter() - t0)
            outrider.step_end(samples=32)
        else:
            t0 = time.perf_counter()
            time.sleep(seconds)
            took = time.perf_counter() - t0
            timed.append(took)
            outrider.record_request(took, route="/predict", status=500 if error_every and i % error_every == 0 else 200,
                                    method="POST")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(timed, fh)


if __name__ == "__main__":
    main()
