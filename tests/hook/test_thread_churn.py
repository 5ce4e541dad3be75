"""Bounded hook state whatever the threading model: the cells of threads (and gevent greenlets) that ended are
folded into the totals and freed at the next flush, and every update is counted exactly once (hook/series.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.ground.config import Config
from outrider.hook.runtime import Hook
from outrider.hook.series import DURATION_BOUNDS, SPARE_CELLS, Counter, Dropped, Histogram
from outrider.hook.settings import HookSettings
from outrider.metrics.exposition import render
from tests.helpers import samples, value

REPO = Path(__file__).resolve().parents[2]


def test_50k_short_threads_keep_a_bounded_number_of_cell_lists_and_exact_totals(tmp_path: Path) -> None:
    """A thread-per-request service: 50,000 real threads, up to 8 alive at once, each recording one request, and a
    flush every 1,000 threads: the hook holds about as many cell lists as threads alive at once, and the agent sees
    every request once."""
    hook = Hook(HookSettings(spool_dir=str(tmp_path), standalone=False))
    lat = hook.series("histogram", "req_seconds", {"route": "/a"})
    reqs = hook.series("counter", "req_total", {"route": "/a"})
    n, batch, per_flush = 50_000, 8, 1000
    held = []

    def request(i: int) -> None:
        lat.observe(0.001 * (i % 7))
        reqs.inc()

    for start in range(0, n, batch):
        threads = [threading.Thread(target=request, args=(i,)) for i in range(start, min(n, start + batch))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if (start + batch) % per_flush == 0:
            held.append(lat.cell_lists() + reqs.cell_lists())
            hook.flush()
    hook.flush()
    # a new thread takes an ended one's cells: about as many lists as threads alive at once
    assert max(held) <= 2 * (batch + 1), f"cells of ended threads are kept: {max(held)}"
    assert lat.cell_lists() <= batch + 1 and reqs.cell_lists() <= batch + 1
    total = lat.total()
    assert sum(total[:-1]) == n  # every observation in exactly one bucket
    assert total[-1] == pytest.approx(sum(0.001 * (i % 7) for i in range(n)))
    collector = HookCollector(CollectorContext(Config(spool_dir=str(tmp_path))))
    parsed = samples(render(collector.collect()).decode())
    assert value(parsed, "req_total", route="/a", rank="") == n
    assert value(parsed, "req_seconds_count", route="/a", rank="") == n


def test_a_live_thread_keeps_its_cells_and_an_ended_threads_cells_go_to_the_next_thread() -> None:
    c = Counter("c_total", {}, 1, Dropped())
    go, done = threading.Event(), threading.Event()

    def worker() -> None:
        c.inc(2)
        go.wait()
        c.inc(3)  # written after a fold: the live thread's cells are still its own
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    while c.cell_lists() == 0:
        pass
    assert c.total() == [2.0] and c.cell_lists() == 1, "a live thread's cells are summed, not folded"
    go.set()
    done.wait()
    t.join()
    assert c.total() == [5.0]
    assert c.cell_lists() == 1, "the ended thread's cells are kept spare"
    c.inc(1)  # the main thread's first update: it takes them
    assert c.cell_lists() == 1
    assert c.total() == [6.0] and c.total() == [6.0], "counted once: a second total adds nothing"


def test_a_burst_of_threads_is_folded_down_to_the_spare_cells_and_counted_once() -> None:
    """2,000 threads alive at once, then none: the next flush folds all but SPARE_CELLS lists into the base and
    frees them; threads after that take the spare ones."""
    c = Counter("c_total", {}, 1, Dropped())
    release = threading.Event()

    def worker() -> None:
        c.inc(1)
        release.wait()

    burst = [threading.Thread(target=worker) for _ in range(2000)]
    for t in burst:
        t.start()
    assert c.total() == [2000.0] and c.cell_lists() == 2000
    release.set()
    for t in burst:
        t.join()
    del burst, t
    assert c.total() == [2000.0]
    assert c.cell_lists() == SPARE_CELLS
    for _ in range(3):
        t = threading.Thread(target=c.inc, args=(2,))
        t.start()
        t.join()
    assert c.total() == [2006.0] and c.cell_lists() == SPARE_CELLS


def test_histogram_folds_keep_buckets_and_sum() -> None:
    h = Histogram("h_seconds", {}, len(DURATION_BOUNDS) + 2, Dropped(), DURATION_BOUNDS)
    values = [0.0001, 0.001, 0.3, 7.0, 1e4]
    for v in values:
        t = threading.Thread(target=h.observe, args=(v,))
        t.start()
        t.join()
    h.observe(0.3)
    total = h.total()
    assert total[0] == 1 and total[DURATION_BOUNDS.index(0.001)] == 1 and total[DURATION_BOUNDS.index(0.3)] == 2
    assert total[DURATION_BOUNDS.index(10.0)] == 1 and total[-2] == 1
    assert total[-1] == pytest.approx(sum(values) + 0.3)
    assert h.cell_lists() == 1, "only the live (main) thread's cells remain"


GEVENT_WORKLOAD = textwrap.dedent("""
    from gevent import monkey
    monkey.patch_all()
    import json, sys
    import gevent
    from outrider.hook.series import DURATION_BOUNDS, SPARE_CELLS, Counter, Dropped, Histogram

    h = Histogram("h_seconds", {}, len(DURATION_BOUNDS) + 2, Dropped(), DURATION_BOUNDS)
    c = Counter("c_total", {}, 1, Dropped())

    def request(i):
        h.observe(0.01)
        gevent.sleep(0)  # a request that yields to the loop in the middle, as an I/O-bound one does
        c.inc(i % 3)

    n, held = int(sys.argv[1]), []
    for start in range(0, n, 500):
        gevent.joinall([gevent.spawn(request, i) for i in range(start, start + 500)])
        gevent.sleep(0)
        held.append(h.cell_lists() + c.cell_lists())
        h.total(), c.total()
    total = h.total()
    print(json.dumps({"held": max(held), "left": h.cell_lists() + c.cell_lists(), "count": sum(total[:-1]),
                      "sum": total[-1], "c": c.total()[0]}))
""")


def test_gevent_greenlets_are_folded_like_threads(tmp_path: Path) -> None:
    """gevent's patched threading.local is per greenlet: each greenlet gets its own cells, and the mechanism that
    folds an ended thread's cells folds an ended greenlet's."""
    pytest.importorskip("gevent")  # installed by the dev extra (.ci/run); a skip here means it was not
    script = tmp_path / "gevent_workload.py"
    script.write_text(GEVENT_WORKLOAD)
    n = 20_000
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "agent"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(script), str(n)], capture_output=True, text=True, env=env,
                         timeout=600, check=True)
    got = json.loads(out.stdout)
    assert got["held"] <= 2 * (500 + SPARE_CELLS), f"cells of ended greenlets are kept: {got}"
    assert got["left"] <= 2 * SPARE_CELLS
    assert got["count"] == n and got["sum"] == pytest.approx(0.01 * n)
    assert got["c"] == sum(i % 3 for i in range(n))
