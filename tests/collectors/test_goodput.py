"""Goodput accounting (collectors/goodput.py) on timelines of known causes: start-up, the loop's parts, a process
killed and its replacement (a restart), one that died hung (a stall), restarts within one sweep, helpers and ranks
with several processes."""

from __future__ import annotations

import pytest

from outrider.collectors.goodput import GoodputAccount, Seen
from outrider.metrics.family import Family


def proc(pid: int, start: float, *, steps: int = 0, last: float = 0.0, first: float | None = None,
         ttfs: float | None = None, heartbeat: float | None = None, exited: bool = False, stalled: bool = False,
         helper: bool = False, rank: str = "0") -> Seen:
    return Seen((pid, int(start * 1e9)), "job", rank, exited, stalled, steps, start,
                heartbeat if heartbeat is not None else max(start, last), last, first, ttfs, helper)


def seconds(account: GoodputAccount, now: float = 0.0, rank: str = "0") -> dict[str, float]:
    fams: dict[str, Family] = {f.defn.name: f for f in account.families(now)}
    return {labels[2]: v for labels, v in fams["outrider_train_goodput_seconds_total"].samples  # type: ignore[misc]
            if labels[0] == rank}


def ratio(account: GoodputAccount, now: float, rank: str = "0") -> float:
    fams = {f.defn.name: f for f in account.families(now)}
    return next(float(v) for labels, v in fams["outrider_train_goodput_ratio"].samples  # type: ignore[arg-type]
                if labels[0] == rank)


def loop(step: float, wait: float = 0.0, other: float = 0.0, rank: str = "0") -> dict[tuple[str, str], dict[str,
                                                                                                           float]]:
    return {("job", rank): {"step": step, "data_wait": wait, "other": other}}


def test_start_up_then_the_loops_parts() -> None:
    g = GoodputAccount()
    g.observe([proc(1, 100.0)], {})  # started, no step yet
    assert ratio(g, 104.0) == 0.0, "four seconds of start-up so far, nothing productive"
    g.observe([proc(1, 100.0, steps=1, last=110.0, first=110.0, ttfs=12.0)], loop(0.0))
    g.observe([proc(1, 100.0, steps=20, last=130.0, first=110.0, ttfs=12.0)], loop(15.0, 4.0, 1.0))
    assert seconds(g) == {"productive": 15.0, "data_wait": 4.0, "checkpoint": 0.0, "other": 1.0, "stall": 0.0,
                          "restart": 0.0, "startup": 12.0}
    assert ratio(g, 130.0) == pytest.approx(15.0 / 32.0)


def test_a_killed_process_and_its_replacement_are_a_restart_from_the_last_step_to_the_next_first() -> None:
    g = GoodputAccount()
    a = proc(1, 0.0, steps=50, last=100.0, first=5.0, ttfs=5.0, heartbeat=100.4)
    g.observe([a], loop(90.0))
    g.observe([proc(1, 0.0, steps=50, last=100.0, first=5.0, ttfs=5.0, heartbeat=100.4, exited=True)], loop(90.0))
    g.observe([proc(2, 103.0)], loop(90.0))  # the launcher's new process, not stepped yet
    assert ratio(g, 108.0) == pytest.approx(90.0 / (95.0 + 8.0)), "eight seconds of restart so far"
    g.observe([proc(2, 103.0, steps=3, last=112.0, first=110.0, ttfs=7.0)], loop(92.0))
    got = seconds(g)
    assert got["restart"] == pytest.approx(10.0), "from the last step (100) to the next first step (110)"
    assert got["startup"] == 5.0, "the replacement's start-up is the restart's"
    assert got["productive"] == 92.0
    fams = {f.defn.name: f for f in g.families(112.0)}
    assert fams["outrider_train_restarts_total"].samples == [(("0", "job"), 1.0)]


def test_a_process_that_died_hung_is_a_stall_then_a_restart() -> None:
    g = GoodputAccount()
    g.observe([proc(1, 0.0, steps=10, last=50.0, first=2.0, ttfs=2.0, heartbeat=60.0)], loop(48.0))
    g.observe([proc(1, 0.0, steps=10, last=50.0, first=2.0, ttfs=2.0, heartbeat=300.0, stalled=True)], loop(48.0))
    assert ratio(g, 300.0) == pytest.approx(48.0 / (50.0 + 250.0)), "the hang counts while it goes on"
    g.observe([proc(1, 0.0, steps=10, last=50.0, first=2.0, ttfs=2.0, heartbeat=350.0, exited=True)], loop(48.0))
    g.observe([proc(2, 355.0, steps=1, last=362.0, first=362.0, ttfs=7.0)], loop(48.0))
    got = seconds(g)
    assert got["stall"] == pytest.approx(300.0), "its last step (50) to its death (350)"
    assert got["restart"] == pytest.approx(12.0), "its death to the next first step"


def test_a_restart_seen_in_one_sweep_is_a_restart() -> None:
    g = GoodputAccount()
    g.observe([proc(1, 0.0, steps=5, last=20.0, first=3.0, ttfs=3.0)], loop(17.0))
    g.observe([proc(1, 0.0, steps=6, last=21.0, first=3.0, ttfs=3.0, heartbeat=21.2, exited=True),
               proc(2, 22.0, steps=2, last=26.0, first=25.0, ttfs=3.0)], loop(18.0))
    got = seconds(g)
    assert (got["restart"], got["startup"]) == (pytest.approx(4.0), 3.0)


def test_helpers_and_processes_beside_a_stepping_one_never_make_a_restart() -> None:
    g = GoodputAccount()
    g.observe([proc(1, 0.0, steps=5, last=20.0, first=3.0, ttfs=3.0), proc(2, 1.0, helper=True),
               proc(3, 2.0, steps=5, last=20.0, first=4.0, ttfs=2.0)], loop(30.0))
    g.observe([proc(1, 0.0, steps=9, last=30.0, first=3.0, ttfs=3.0), proc(2, 1.0, helper=True, exited=True),
               proc(3, 2.0, steps=6, last=25.0, first=4.0, ttfs=2.0, exited=True)], loop(40.0))
    got = seconds(g)
    assert got["restart"] == 0.0 and got["startup"] == 5.0, "two processes started; neither replaced the other"
    fams = {f.defn.name: f for f in g.families(30.0)}
    assert fams["outrider_train_restarts_total"].samples == [(("0", "job"), 0.0)]


def test_ranks_are_accounted_apart() -> None:
    g = GoodputAccount()
    g.observe([proc(1, 0.0, steps=5, last=20.0, first=3.0, ttfs=3.0, rank="0"),
               proc(2, 0.0, steps=5, last=20.0, first=6.0, ttfs=6.0, rank="1")],
              {**loop(10.0, rank="0"), **loop(8.0, 2.0, rank="1")})
    assert seconds(g, rank="0")["startup"] == 3.0 and seconds(g, rank="1")["startup"] == 6.0
    assert seconds(g, rank="1")["data_wait"] == 2.0
