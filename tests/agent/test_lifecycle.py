"""The exit-with-the-workload decision (lifecycle.WorkloadWatch) on a fake clock: seen, then gone for the grace
period, exactly once; never before the workload was seen; a workload that comes back resets the wait."""

from __future__ import annotations

import pytest

from outrider.config import Config
from outrider.lifecycle import WorkloadWatch, attach, grace_s
from outrider.sampler import Sampler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch(alive: list[int], clock: Clock, calls: list[str]) -> WorkloadWatch:
    return WorkloadWatch(lambda families: alive[0], grace_s=5.0, on_gone=lambda: calls.append("gone"), clock=clock)


def test_gone_only_after_seen_and_empty_for_the_grace_period() -> None:
    alive, clock, calls = [0], Clock(), []
    w = watch(alive, clock, calls)
    for _ in range(10):  # nothing published yet: a workload still starting is not a workload gone
        w.on_sweep([])
        clock.now += 10
    assert calls == [] and not w.seen
    alive[0] = 2
    w.on_sweep([])
    alive[0] = 0
    w.on_sweep([])
    clock.now += 4.9
    w.on_sweep([])
    assert calls == [], "inside the grace period"
    clock.now += 0.1
    w.on_sweep([])
    assert calls == ["gone"] and w.gone
    clock.now += 10
    w.on_sweep([])
    assert calls == ["gone"], "once"


def test_a_workload_that_comes_back_within_the_grace_period_resets_the_wait() -> None:
    alive, clock, calls = [1], Clock(), []
    w = watch(alive, clock, calls)
    w.on_sweep([])
    alive[0] = 0
    w.on_sweep([])
    clock.now += 4
    alive[0] = 1  # `python prep.py && python train.py`: the next stage publishes
    w.on_sweep([])
    alive[0] = 0
    clock.now += 1
    w.on_sweep([])
    clock.now += 4
    w.on_sweep([])
    assert calls == [], "the wait started again when the workload came back"
    clock.now += 1
    w.on_sweep([])
    assert calls == ["gone"]


def test_grace_is_three_sweeps_and_at_least_five_seconds() -> None:
    assert grace_s(5.0) == 15.0
    assert grace_s(0.5) == 5.0


def test_off_by_default_and_listening_to_sweeps_when_on(tmp_path: object) -> None:
    base = Config(spool_dir=str(tmp_path), collectors=("hook",), rule_files=())
    sampler = Sampler(base)
    assert attach(sampler, base) is None and sampler.listeners == []
    on = Config(spool_dir=str(tmp_path), collectors=("hook",), rule_files=(), exit_when_workload_exits=True)
    sampler = Sampler(on)
    w = attach(sampler, on)
    assert w is not None and sampler.listeners == [w.on_sweep]
    sampler.sweep()
    assert not w.seen, "an empty spool is no workload"
    sampler.stop()


def test_a_workload_that_ran_and_exited_between_two_sweeps_counts_as_seen() -> None:
    clock, calls, ran = Clock(), [], [False]
    w = WorkloadWatch(lambda families: 0, grace_s=5.0, on_gone=lambda: calls.append("gone"), clock=clock,
                      ran=lambda families: ran[0])
    w.on_sweep([])
    clock.now += 10
    assert not w.seen
    ran[0] = True  # a 1-second trainer: never alive at a sweep, its values retired by the hook collector
    w.on_sweep([])
    assert w.seen and calls == []
    clock.now += 4.9
    w.on_sweep([])
    assert calls == [], "the same grace period as for a workload seen alive"
    clock.now += 0.1
    w.on_sweep([])
    assert calls == ["gone"]


def test_retired_hook_series_are_the_evidence_of_a_workload_that_ran() -> None:
    from outrider.lifecycle import ran_and_exited
    from outrider.metrics.family import Family

    retired = Family("outrider_hook_retired_series")
    assert not ran_and_exited([retired])
    retired.add(0.0)
    assert not ran_and_exited([retired])
    retired = Family("outrider_hook_retired_series")
    retired.add(3.0)
    assert ran_and_exited([retired])


@pytest.mark.parametrize(("startup", "expected"), [(60.0, ["gone"]), (0.0, [])])
def test_no_workload_within_the_startup_grace_ends_the_agent_and_zero_waits_forever(startup: float,
                                                                                     expected: list[str]) -> None:
    clock, calls = Clock(), []
    w = WorkloadWatch(lambda families: 0, grace_s=5.0, on_gone=lambda: calls.append("gone"), clock=clock,
                      startup_grace_s=startup)
    clock.now += 59.9
    w.on_sweep([])
    assert calls == []
    clock.now += 0.1
    w.on_sweep([])
    clock.now += 10_000
    w.on_sweep([])
    assert calls == expected, startup


def test_a_workload_seen_in_time_is_not_ended_by_the_startup_grace() -> None:
    alive, clock, calls = [0], Clock(), []
    w = WorkloadWatch(lambda families: alive[0], grace_s=5.0, on_gone=lambda: calls.append("gone"), clock=clock,
                      startup_grace_s=60.0)
    clock.now += 30
    alive[0] = 1
    w.on_sweep([])
    clock.now += 3600
    w.on_sweep([])
    assert calls == [], "a long run is not cut by a bound on its start"


def test_startup_grace_default_is_the_documented_15_minutes() -> None:
    assert Config().startup_grace_s == 900.0
