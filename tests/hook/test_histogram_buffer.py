"""The histogram's buffered recording (hook/series.Histogram), value by value: observe() appends to its thread's
buffer; the hook's thread counts what is new at every flush without touching it; a thread that fills its buffer
counts it itself (its fold generation odd meanwhile); retired threads' buffers are counted when their cells are
folded; durations also go to the log-bucketed sketch. Every count exact, every value counted once."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import pytest

from outrider.hook import series
from outrider.hook.series import BUFFER, DURATION_BOUNDS, SIZE_BOUNDS, SPARE_CELLS, Dropped, Histogram
from outrider.shared import sketch
from outrider.shared.sketch import Sketch


def histogram(bounds: tuple[float, ...] = DURATION_BOUNDS, sketched: bool = True) -> tuple[Histogram, Dropped]:
    drop = Dropped()
    return Histogram("h", {}, len(bounds) + 2, drop, bounds, sketched=sketched), drop


def classic(values: list[float], bounds: tuple[float, ...] = DURATION_BOUNDS) -> list[float]:
    """What the classic cells must hold: per-bucket counts (le), the +Inf bucket, the sum."""
    out = [0.0] * (len(bounds) + 2)
    for v in values:
        out[next((i for i, b in enumerate(bounds) if v <= b), len(bounds))] += 1
    out[-1] = math.fsum(values)
    return out


def sketched(h: Histogram) -> Sketch:
    counted = h.counts()
    assert counted.sketch is not None
    return Sketch.of(counted.zero, counted.sketch)


def in_thread(fn: Callable[[], None]) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join()


VALUES = [0.0, 1e-12, 0.00025, 0.0002500001, 0.01, 0.01, 0.0100001, 0.75, 1.0, 599.9, 600.0, 600.1, 5e6, -0.5]


def test_every_value_counts_once_in_the_classic_buckets_the_sum_and_the_sketch() -> None:
    h, drop = histogram()
    for v in VALUES:
        h.observe(v)
    cells = h.counts().cells
    assert cells[:-1] == classic(VALUES)[:-1] and cells[-1] == pytest.approx(math.fsum(VALUES))
    assert sketched(h) == Sketch.of_values(VALUES), "zero bucket: 0, 1e-12 and -0.5; the top one: 5e6"
    assert sketched(h).zero == 3 and sketched(h).buckets[sketch.MAX_INDEX] == 1
    assert drop.counts == {}


def test_a_value_one_float_above_the_first_buckets_bound_is_counted_not_looped_on() -> None:
    """log2 of this value rounds down into the first bucket, whose clamp once skipped the boundary check: the
    fold then found no value under that bucket's bound and looped for ever, in the workload's thread. The fold runs
    in a thread given a minute (it takes microseconds) so that a regression fails here instead of hanging the run."""
    first = sketch.upper_bound(sketch.MIN_INDEX)
    values = [first, math.nextafter(first, math.inf), math.nextafter(first, math.inf), 0.01]
    h, drop = histogram()
    done = threading.Event()

    def record() -> None:
        for v in values:
            h.observe(v)
        h.counts()
        done.set()

    threading.Thread(target=record, daemon=True).start()
    assert done.wait(60), "the fold did not end"
    assert sketched(h).buckets == {sketch.MIN_INDEX: 1, sketch.MIN_INDEX + 1: 2, sketch.index(0.01): 1}
    assert drop.counts == {}


def test_the_hook_threads_counts_leave_the_buffer_and_count_each_value_once_however_often_it_looks() -> None:
    h, _ = histogram()
    for v in VALUES[:5]:
        h.observe(v)
    first = h.counts()
    assert sum(first.cells[:-1]) == 5
    for v in VALUES[5:]:
        h.observe(v)
    for _ in range(3):  # every flush: what is new only, the earlier part remembered
        assert h.counts().cells[:-1] == classic(VALUES)[:-1]
    c = h._local.c
    assert len(c[h._buf]) == len(VALUES), "the hook's thread never empties a thread's buffer"
    assert c[:h.width] == [0.0] * h.width, "nor writes its cells"


def test_a_full_buffer_is_counted_by_its_own_thread_into_its_cells_and_replaced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(series, "BUFFER", 4)
    h, _ = histogram()
    values = [0.001 * (i + 1) for i in range(10)]
    seen_buffers = []
    for v in values:
        h.observe(v)
        seen_buffers.append(h._local.b)
    c = h._local.c
    assert sum(c[:h.width - 1]) == 10 - len(c[h._buf]), "folded values are in the thread's own cells"
    assert len(c[h._buf]) <= 4 and c[h._gen] % 2 == 0 and c[h._gen] > 0
    assert h._local.b is c[h._buf], "the thread appends to the buffer its cells hold"
    assert len({id(b) for b in seen_buffers}) > 1, "a full buffer is replaced, not emptied"
    assert h.counts().cells[:-1] == classic(values)[:-1]
    assert sketched(h) == Sketch.of_values(values)


def test_the_hook_thread_reads_a_thread_only_between_two_equal_even_generations(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fold under way (generation odd) is waited for; one that happened while the hook's thread was reading
    (generation changed) is read again: no value twice, none lost."""
    monkeypatch.setattr(series, "BUFFER", 4)
    h, _ = histogram()
    for v in (0.001, 0.002, 0.003):
        h.observe(v)
    c = h._local.c
    c[h._gen] += 1  # the owner is folding
    yields = []

    def sleep(s: float) -> None:
        yields.append(s)
        if len(yields) == 3:
            c[h._gen] += 1  # it finished (nothing moved, for the test)

    monkeypatch.setattr(series, "time", type("T", (), {"sleep": staticmethod(sleep)}))
    assert sum(h.counts().cells[:-1]) == 3 and yields == [0, 0, 0], "waited for the fold, then read"
    seen = c[h._seen]
    assert seen.n == 3 and seen.gen == c[h._gen]


def test_a_thread_busy_folding_through_every_look_is_skipped_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    h, drop = histogram()
    h.observe(0.01)
    h._local.c[h._gen] = 1  # folding, for ever
    monkeypatch.setattr(series, "time", type("T", (), {"sleep": staticmethod(lambda s: None)}))
    assert sum(h.counts().cells[:-1]) == 0
    assert drop.counts == {"histogram_busy": 1}


def test_a_fold_since_the_last_look_restarts_the_count_of_the_new_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(series, "BUFFER", 4)
    h, _ = histogram()
    values = [0.001, 0.002, 0.003]
    for v in values:
        h.observe(v)
    assert sum(h.counts().cells[:-1]) == 3
    for v in (0.004, 0.005, 0.006):  # the 5th value folds the first four; two stay in the new buffer
        h.observe(v)
        values.append(v)
    assert h.counts().cells[:-1] == classic(values)[:-1]
    assert h._local.c[h._seen].n == len(h._local.b) == 1, "0.005 folded with the full buffer; 0.006 in the new one"


def test_ended_threads_buffers_are_counted_when_their_cells_are_folded(monkeypatch: pytest.MonkeyPatch) -> None:
    h, _ = histogram()
    values = []
    for i in range(SPARE_CELLS + 5):
        v = 0.001 * (i + 1)
        values.append(v)
        in_thread(lambda v=v: h.observe(v))
    total = h.counts()
    assert total.cells[:-1] == classic(values)[:-1]
    assert h.cell_lists() <= SPARE_CELLS + 1, "beyond the spares, ended threads' cells are folded and freed"
    assert Sketch.of(total.zero, total.sketch or {}) == Sketch.of_values(values)
    again = h.counts()
    assert again.cells == total.cells and again.sketch == total.sketch, "folded once: not again"


def test_a_new_thread_takes_an_ended_threads_buffer_and_keeps_appending() -> None:
    h, _ = histogram()
    in_thread(lambda: h.observe(0.002))
    in_thread(lambda: h.observe(0.003))
    assert h.cell_lists() == 1, "the second thread took the first one's cells"
    assert h.counts().cells[:-1] == classic([0.002, 0.003])[:-1]


def test_twins_are_published_as_one_sketch_included() -> None:
    h, _ = histogram()
    twin, _ = histogram()
    h.twins.append(twin)
    h.observe(0.004)
    twin.observe(0.5)
    counted = h.counts()
    assert counted.cells[:-1] == classic([0.004, 0.5])[:-1]
    assert Sketch.of(counted.zero, counted.sketch or {}) == Sketch.of_values([0.004, 0.5])


def test_a_histogram_of_other_bounds_has_no_sketch_and_counts_the_same() -> None:
    h, _ = histogram(SIZE_BOUNDS, sketched=False)
    values = [1.0, 1.5, 3.0, 4096.0, 5000.0, 0.0]
    for v in values:
        h.observe(v)
    counted = h.counts()
    assert counted.sketch is None and counted.zero == 0
    assert counted.cells[:-1] == classic(values, SIZE_BOUNDS)[:-1] and counted.cells[-1] == sum(values)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), "0.1", None, [0.1], complex(1, 1)])
def test_what_is_not_a_finite_number_is_dropped_and_counted_never_raised(bad: object) -> None:
    h, drop = histogram()
    h.observe(bad)  # type: ignore[arg-type]
    h.observe(0.25)
    assert drop.counts == {"bad_value": 1}
    assert h.counts().cells[:-1] == classic([0.25])[:-1] and h.counts().cells[-1] == 0.25


def test_numbers_of_other_types_are_recorded_as_floats() -> None:
    h, drop = histogram()
    for v in (True, 3, 0.5):
        h.observe(v)  # type: ignore[arg-type]
    assert drop.counts == {} and h.counts().cells[-1] == 4.5
    assert all(type(v) is float for v in h._local.b)


def test_a_signal_handler_that_observes_during_its_threads_fold_loses_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fold swapped the buffer: what the handler observes goes to the new one, or, while the old one is still
    the thread's, into the batch being counted; never twice."""
    monkeypatch.setattr(series, "BUFFER", 3)
    h, _ = histogram()
    real = series._Counted.count
    fired = []

    def count(self: series._Counted, values: list[float], bounds: tuple[float, ...]) -> None:
        if not fired:
            fired.append(True)
            h.observe(0.9)  # the handler, on this thread, during its fold
        real(self, values, bounds)

    monkeypatch.setattr(series._Counted, "count", count)
    values = [0.001, 0.002, 0.003, 0.004]
    for v in values:
        h.observe(v)
    assert h.counts().cells[:-1] == classic([*values, 0.9])[:-1]


def test_a_signal_handler_that_fills_the_buffer_during_a_fold_appends_instead_of_folding_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(series, "BUFFER", 2)
    h, _ = histogram()
    for v in (0.001, 0.002):
        h.observe(v)
    c = h._local.c
    c[h._gen] += 1  # this thread's own fold is under way (a handler interrupted it)
    h.observe(0.003)
    assert len(h._local.b) == 3, "appended past the cap: the fold under way takes it"
    c[h._gen] += 1
    assert h.counts().cells[:-1] == classic([0.001, 0.002, 0.003])[:-1]


def test_the_default_buffer_holds_what_a_thread_observes_between_two_flushes_at_1_khz() -> None:
    assert BUFFER == 1024
