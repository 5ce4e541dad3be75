"""The hot path: correct buckets, no lost update across threads, bad input dropped and counted, never raised."""

from __future__ import annotations

import math
import threading

import pytest

from outrider.hook.registry import Registry
from outrider.hook.series import DURATION_BOUNDS, Counter, Dropped, Gauge, Histogram, NoopSeries, Series


def hist() -> tuple[Histogram, Dropped]:
    drop = Dropped()
    return Histogram("h_seconds", {}, len(DURATION_BOUNDS) + 2, drop, DURATION_BOUNDS), drop


def test_histogram_buckets_use_le_semantics_and_sum() -> None:
    h, _ = hist()
    for v in (0.0001, 0.001, 0.0011, 1.0, 1e6):
        h.observe(v)
    total = h.total()
    i_001 = DURATION_BOUNDS.index(0.001)
    assert total[0] == 1                      # 0.0001 <= 0.00025
    assert total[i_001] == 1                  # 0.001 <= 0.001: a value equal to a bound is in its bucket
    assert total[i_001 + 1] == 1              # 0.0011 in (0.001, 0.0025]
    assert total[DURATION_BOUNDS.index(1.0)] == 1
    assert total[-2] == 1                     # +Inf
    assert math.isclose(total[-1], 0.0001 + 0.001 + 0.0011 + 1.0 + 1e6)


def test_bad_values_are_dropped_and_counted_never_raised() -> None:
    h, drop = hist()
    h.observe(float("nan"))
    h.observe("slow")  # type: ignore[arg-type]
    h.observe(None)  # type: ignore[arg-type]
    c = Counter("c_total", {}, 1, drop)
    c.inc(-1)
    c.inc(float("nan"))
    g = Gauge("g", {}, 1, drop)
    g.set(float("nan"))
    assert drop.counts == {"bad_value": 6}
    assert sum(h.total()) == 0 and c.total() == [0.0]


def test_two_threads_lose_no_update() -> None:
    h, _ = hist()
    c = Counter("c_total", {}, 1, Dropped())
    n = 200_000
    start = threading.Barrier(2)

    def work() -> None:
        start.wait()
        for _ in range(n):
            h.observe(0.01)
            c.inc()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.total() == [2.0 * n]
    assert sum(h.total()[:-1]) == 2 * n
    assert math.isclose(h.total()[-1], 0.01 * 2 * n, rel_tol=1e-9)


def test_cells_of_finished_threads_still_count() -> None:
    c = Counter("c_total", {}, 1, Dropped())
    t = threading.Thread(target=lambda: c.inc(5))
    t.start()
    t.join()
    del t
    c.inc(1)
    assert c.total() == [6.0]


def test_reset_after_fork_starts_from_zero() -> None:
    c = Counter("c_total", {}, 1, Dropped())
    c.inc(3)
    c.reset_after_fork()
    assert c.total() == [0.0]
    c.inc(1)
    assert c.total() == [1.0]


@pytest.mark.parametrize(("kind", "name", "reason"), [
    ("counter", "b_total", "series_limit"),
    ("gauge", "bad name", "invalid_name"),
    ("histogram", "a_total", "inconsistent_kind"),
])
def test_a_refused_series_is_none_of_the_series_types_and_holds_nothing(kind: str, name: str, reason: str) -> None:
    reg = Registry(max_series=1)
    reg.series("counter", "a_total").inc()
    refused = reg.series(kind, name)
    # a sibling: an isinstance filter for the series that publish (the runtime's, before set_total) skips it
    assert isinstance(refused, NoopSeries) and not isinstance(refused, Series | Counter | Gauge | Histogram)
    refused.inc()
    refused.set_total(5.0)
    refused.set(1.0)
    refused.add(1.0)
    refused.observe(0.1)
    assert not refused.has_data() and not hasattr(refused, "__dict__")  # no cells, no value: nothing to keep
    assert reg.drop.counts == {reason: 1}
    entries, _, _ = reg.layout()
    assert [(e[0], e[1]) for e in entries if not e[0].startswith("outrider_")] == [("a_total", "counter")]
