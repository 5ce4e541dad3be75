"""The hot path's bookkeeping, value by value: a thread's cells and owner set together, an ended thread's cells taken
by the next new thread, the publisher folding retired cells beyond SPARE_CELLS (and keeping what it folded), twins
published as one, gauges' and set counters' shared cell, and the logging that never waits for a lock."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from outrider.hook.series import SPARE_CELLS, Counter, Dropped, Gauge, NoopSeries, drain_logs, log_aside


def counter() -> tuple[Counter, Dropped]:
    drop = Dropped()
    return Counter("c_total", {}, 1, drop), drop


def in_threads(n: int, work: Callable[[], None]) -> None:
    """`work` in n threads alive at once (so none can take another's cells), all ended on return."""
    together = threading.Barrier(n)

    def run() -> None:
        work()
        together.wait()

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    del threads


def test_zero_and_fractions_are_counted_and_only_negatives_and_nan_dropped() -> None:
    c, drop = counter()
    c.inc(0)
    c.inc(0.5)
    assert c.total() == [0.5] and drop.counts == {}
    assert c.has_data() is True


def test_a_new_series_has_no_data_until_something_is_recorded() -> None:
    c, _ = counter()
    assert c.has_data() is False
    c.set_total(0.0)
    assert c.has_data() is True and c.total() == [0.0]


def test_a_set_total_replaces_the_shared_count_beside_the_threads_increments() -> None:
    c, _ = counter()
    c.inc(2)
    c.set_total(10)
    c.set_total(7)
    assert c.total() == [9.0]


def test_a_gauge_is_one_shared_cell_set_and_added_from_any_thread() -> None:
    drop = Dropped()
    g = Gauge("g", {}, 1, drop)
    assert g.has_data() is False
    g.add(2.5)
    assert g.has_data() is True and g.total() == [2.5]
    in_threads(3, lambda: g.add(1.0))
    assert g.total() == [5.5] and g.cell_lists() == 0, "no thread cells: one shared value"
    g.set(4)
    g.add(-1.5)
    assert g.total() == [2.5]
    g.add("one")  # type: ignore[arg-type]
    assert drop.counts == {"bad_value": 1} and g.total() == [2.5]
    fresh = Gauge("h", {}, 1, Dropped())
    fresh.set(0)
    assert fresh.has_data() is True


def test_dropped_counts_by_reason_and_clears() -> None:
    drop = Dropped()
    drop("bad_value")
    drop("bad_value", 3)
    drop("series_limit")
    assert drop.counts == {"bad_value": 4, "series_limit": 1}
    drop.clear()
    assert drop.counts == {}
    drop("bad_value")
    assert drop.counts == {"bad_value": 1}


def test_a_refused_series_keeps_its_name() -> None:
    assert NoopSeries("shop_requests_total").name == "shop_requests_total"


def test_a_threads_cells_and_owner_are_set_together_and_registered_under_it() -> None:
    c, _ = counter()
    c.inc()
    local = c._local.__dict__
    assert set(local) == {"c", "o"}
    assert [cells for cells in c._live.values()] == [local["c"]]
    assert [ref() for ref in c._live] == [local["o"]], "registered under the owner the local holds"


def test_a_new_thread_takes_an_ended_threads_cells_and_counts_them_once() -> None:
    c, _ = counter()
    for _ in range(5):  # one after another: each new thread takes the last one's cells
        t = threading.Thread(target=lambda: c.inc(2))
        t.start()
        t.join()
        del t
    assert c.cell_lists() == 1 and c.total() == [10.0]


def test_threads_alive_at_once_each_have_their_own_cells() -> None:
    c, _ = counter()
    in_threads(4, lambda: c.inc(1))
    assert c.cell_lists() == 4 and c.total() == [4.0]


def test_the_publisher_folds_the_retired_cells_beyond_the_spares_and_keeps_what_it_folded() -> None:
    assert SPARE_CELLS == 64
    c, _ = counter()
    in_threads(SPARE_CELLS + 10, lambda: c.inc(1))
    assert c.cell_lists() == SPARE_CELLS + 10
    assert c.total() == [SPARE_CELLS + 10.0]
    assert c.cell_lists() == SPARE_CELLS, "ten folded into the base and freed"
    in_threads(SPARE_CELLS + 20, lambda: c.inc(1))  # the 64 spares taken, 20 new lists, 20 beyond the spares
    assert c.total() == [2 * SPARE_CELLS + 30.0], "the new fold added to the base, not over it"
    assert c.cell_lists() == SPARE_CELLS
    assert c.total() == [2 * SPARE_CELLS + 30.0], "a fold with nothing beyond the spares changes nothing"


def test_a_fold_after_a_reset_forgets_the_parents_retired_cells() -> None:
    c, _ = counter()
    in_threads(SPARE_CELLS + 5, lambda: c.inc(1))
    retired = list(c._retired)
    c.reset_after_fork()
    c._retired.extend(retired)  # owners that die after the reset (the parent's threads' locals, in the child)
    assert c.total() == [0.0] and c.cell_lists() == 0


def test_twins_are_published_as_one() -> None:
    a, _ = counter()
    b, _ = counter()
    a.twins.append(b)
    b.inc(3)
    assert a.has_data() is True, "its twin recorded"
    a.inc(2)
    assert a.total() == [5.0]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, str, str, bool]] = []
        self.done = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        thread = threading.current_thread()
        self.seen.append((record.levelno, record.getMessage(), thread.name, thread.daemon))
        self.done.set()


@pytest.fixture
def records() -> Iterator[tuple[logging.Logger, Records]]:
    logger = logging.getLogger("outrider.test_series_cells")
    handler = Records()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)


def test_log_aside_queues_and_the_drain_logs_in_order_on_the_draining_thread(
        records: tuple[logging.Logger, Records], monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller (a flush holding the hook's lock, a signal handler) never takes a logging lock and never starts a
    thread; whoever drains (the hook's thread, outside its locks; the exit path) logs."""
    logger, handler = records
    started: list[threading.Thread] = []
    real = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (started.append(self), real(self))[1])
    log_aside(logger, logging.WARNING, "dropped %d series of %s", 3, "shop")
    log_aside(logger, logging.ERROR, "at exit: %s", "flushed")
    assert handler.seen == [] and started == [], "nothing logged, nothing started by the caller"
    drain_logs()
    me = threading.current_thread()
    assert handler.seen == [(logging.WARNING, "dropped 3 series of shop", me.name, me.daemon),
                            (logging.ERROR, "at exit: flushed", me.name, me.daemon)]
    drain_logs()
    assert len(handler.seen) == 2, "each line once"


def test_log_aside_queues_nothing_for_a_level_not_logged(records: tuple[logging.Logger, Records]) -> None:
    logger, handler = records
    log_aside(logger, logging.DEBUG, "not logged")
    drain_logs()
    assert handler.seen == []


def test_a_hook_that_cannot_log_keeps_its_latest_lines_only(records: tuple[logging.Logger, Records]) -> None:
    logger, handler = records
    for i in range(1000):
        log_aside(logger, logging.INFO, "line %d", i)
    drain_logs()
    assert [m for _, m, _, _ in handler.seen] == [f"line {i}" for i in range(1000 - 256, 1000)]


class _TakenMeanwhile(collections.deque):  # type: ignore[type-arg]
    """A retired deque that new threads empty while the publisher folds: after `left` pops it is empty."""

    def __init__(self, items: list[object], left: int) -> None:
        super().__init__(items)
        self.left = left

    def popleft(self) -> object:
        if self.left == 0:
            self.clear()  # the rest taken by new threads (each keeps its list registered)
            raise IndexError("pop from an empty deque")
        self.left -= 1
        return super().popleft()


def test_a_fold_cut_short_by_new_threads_keeps_what_it_had_folded() -> None:
    c, _ = counter()
    in_threads(SPARE_CELLS + 10, lambda: c.inc(1))
    c._retired = _TakenMeanwhile(list(c._retired), left=3)
    assert c.total() == [SPARE_CELLS + 10.0], "the 3 folded into the base, the others still registered"
    assert c.cell_lists() == SPARE_CELLS + 7
