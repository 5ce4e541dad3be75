"""wiring/lifecycle value by value: each boundary of WorkloadWatch met exactly (the grace period, startup_grace_s,
its smallest values), what it says at each turn of a workload's life, on_empty once, what counts as a live process
of the workload (the hook's count, the trees of `pids`), PodPeers' parent chain at its bound, the evidence of a
workload that ran, and attach()'s wiring. A fixture /proc and a fake clock; tests/agent/test_lifecycle.py holds the
behaviours these values are behind.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrider.ground.config import Config
from outrider.metrics.family import Family, HistogramValue
from outrider.wiring import lifecycle
from outrider.wiring.lifecycle import PodPeers, WorkloadWatch, attach, live_processes, ran_and_exited
from outrider.wiring.sampler import Sampler
from tests.agent.test_lifecycle import Clock, _proc


class Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@pytest.fixture
def said() -> Iterator[list[str]]:
    handler = Said()
    logger = logging.getLogger("outrider.lifecycle")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_workloads_life_said_turn_by_turn_with_on_empty_once(said: list[str]) -> None:
    alive, clock, calls = [3], Clock(), []
    w = WorkloadWatch(lambda families: alive[0], grace_s=5.0, on_gone=lambda: calls.append("gone"), clock=clock)
    w.on_empty = lambda: calls.append("empty")
    w.on_sweep([])
    w.on_sweep([])  # still there: said once
    alive[0] = 0
    clock.now = 200.0
    w.on_sweep([])
    alive[0] = 1  # back within the grace period
    w.on_sweep([])
    alive[0] = 0
    clock.now = 300.0
    w.on_sweep([])
    clock.now = 304.0
    w.on_sweep([])
    assert calls == ["empty"] and not w.gone
    clock.now = 305.0  # exactly the grace period
    w.on_sweep([])
    assert calls == ["empty", "gone"] and w.gone
    assert said == [
        "INFO watching the workload: 3 process(es); the agent exits once none is left",
        "INFO the workload has exited; stopping in 5 s unless it comes back",
        "INFO the workload has exited; stopping in 5 s unless it comes back",
        "INFO the workload is gone: final sweep and flush, then exit",
    ]


def test_gone_without_on_gone_set_is_still_gone_and_nothing_more_is_done() -> None:
    alive = [1]
    clock = Clock()
    w = WorkloadWatch(lambda families: alive[0], grace_s=5.0, clock=clock)
    w.on_sweep([])
    alive[0] = 0
    w.on_sweep([])
    clock.now += 5.0
    w.on_sweep([])
    assert w.gone
    alive[0] = 1
    w.on_sweep([])
    assert w.gone and w._empty_since == 100.0, "a gone watch looks at nothing more"


def test_a_workload_that_ran_between_sweeps_is_said(said: list[str]) -> None:
    clock = Clock()
    w = WorkloadWatch(lambda families: 0, grace_s=5.0, clock=clock, ran=lambda families: True)
    w.on_sweep([])
    assert w.seen and said == ["INFO the workload ran and exited between two sweeps",
                               "INFO the workload has exited; stopping in 5 s unless it comes back"]


def test_by_default_nothing_ran_and_there_is_no_startup_bound() -> None:
    clock, calls = Clock(), []
    w = WorkloadWatch(lambda families: 0, grace_s=5.0, on_gone=lambda: calls.append("gone"), clock=clock)
    for _ in range(3):
        clock.now += 1e6
        w.on_sweep([Family("outrider_hook_retired_series").add(5.0)])
    assert calls == [] and not w.seen and not w.gone


@pytest.mark.parametrize(("startup", "after", "gone"), [
    (60.0, 59.0, False), (60.0, 60.0, True), (0.5, 0.5, True), (0.5, 0.25, False), (1.0, 1.0, True),
])
def test_the_startup_bound_is_met_exactly_and_said(said: list[str], startup: float, after: float,
                                                   gone: bool) -> None:
    clock, calls = Clock(), []
    w = WorkloadWatch(lambda families: 0, grace_s=5.0, on_gone=lambda: calls.append("gone"), clock=clock,
                      startup_grace_s=startup)
    clock.now += after
    w.on_sweep([])
    assert w.gone is gone and calls == (["gone"] if gone else [])
    assert said == ([f"WARNING no workload appeared within startup_grace_s ({startup:g} s): it failed before "
                     "instrument(), or does not call it; the workload is gone: final sweep and flush, then exit"]
                    if gone else [])


def test_the_startup_bound_counts_from_the_watchs_start_without_on_gone_set() -> None:
    clock = Clock()
    w = WorkloadWatch(lambda families: 0, grace_s=5.0, clock=clock, startup_grace_s=10.0)
    clock.now = 105.0
    w.on_sweep([])
    assert not w.gone
    clock.now = 110.0
    w.on_sweep([])
    assert w.gone


# --- what counts as the workload ------------------------------------------------------------------------------

def test_the_hooks_count_is_summed_over_its_samples_and_nothing_else_counts(tmp_path: Path) -> None:
    live = live_processes(str(tmp_path), ())
    hooked = Family("outrider_hook_processes").add(2.0, "running").add(1.0, "stalled")
    other = Family("outrider_process_threads").add(7.0, "4242", "python3")
    odd = Family("outrider_hook_processes")
    odd.samples.append((("x",), HistogramValue((1.0,), [1, 1], 1.0)))  # no number: not counted
    assert live([hooked, other]) == 3 and live([other]) == 0 and live([odd]) == 0
    assert live([Family("outrider_hook_processes").add(2.9, "running")]) == 2


def test_the_trees_of_pids_count_their_live_processes(tmp_path: Path) -> None:
    _proc(tmp_path, 1, 0)
    _proc(tmp_path, 30, 1)
    _proc(tmp_path, 31, 30)
    _proc(tmp_path, 32, 30, state="Z")
    _proc(tmp_path, 33, 31, state="X")
    _proc(tmp_path, 34, 31)
    _proc(tmp_path, 40, 1)  # not in the trees
    live = live_processes(str(tmp_path), (30,))
    assert live([]) == 3
    assert live([Family("outrider_hook_processes").add(1.0, "running")]) == 4
    (tmp_path / "31" / "stat").write_text("garbage")  # exited between the listing and the reading
    assert live([]) == 2, "the others are still counted"
    assert live_processes(str(tmp_path), ())([]) == 0, "no pids: only the hook's count"


def test_attach_watches_the_trees_of_the_configured_pids(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _proc(proc, 1, 0)
    _proc(proc, 30, 1)
    _proc(proc, 31, 30)
    config = Config(spool_dir=str(tmp_path), collectors=("hook",), rule_files=(), exit_when_workload_exits=True,
                    pids=(30,), proc_root=str(proc))
    sampler = Sampler(config)
    try:
        w = attach(sampler, config)
        assert w is not None and w._live([]) == 2
    finally:
        sampler.stop()


def test_the_evidence_of_a_run_is_read_from_the_sweeps_families() -> None:
    w = WorkloadWatch(lambda families: 0, grace_s=5.0, clock=Clock(), ran=ran_and_exited)
    w.on_sweep([Family("outrider_hook_retired_series").add(0.0)])
    assert not w.seen
    w.on_sweep([Family("outrider_hook_retired_series").add(2.0)])
    assert w.seen


def test_pod_peers_in_any_dead_state_are_not_counted(tmp_path: Path) -> None:
    _proc(tmp_path, 1, 0)
    _proc(tmp_path, 7, 0)
    _proc(tmp_path, 8, 7, state="X")
    _proc(tmp_path, 9, 7, state="Z")
    _proc(tmp_path, 20, 0)
    peers = PodPeers.around(str(tmp_path), pid=20)
    assert peers is not None and peers.alive() == 1


def test_pod_peers_follow_a_parent_chain_of_64_and_no_longer(tmp_path: Path) -> None:
    _proc(tmp_path, 1, 0)
    _proc(tmp_path, 100, 0)  # a container's first process
    for pid in range(101, 166):
        _proc(tmp_path, pid, pid - 1)
    peers = PodPeers.around(str(tmp_path), pid=163)  # 63 parents up to 100, whose parent is 0: 64 reads
    assert peers is not None and peers.own_root == 100 and peers.proc_root == str(tmp_path)
    assert peers.published is False
    assert PodPeers.around(str(tmp_path), pid=164) is None, "65 reads: no container's"


def test_pod_peers_of_this_process_are_looked_for_from_its_own_pid(tmp_path: Path) -> None:
    me = os.getpid()
    _proc(tmp_path, 1, 0)
    _proc(tmp_path, me, 0)
    peers = PodPeers.around(str(tmp_path))
    assert peers is not None and peers.own_root == me


@pytest.mark.parametrize(("value", "ran"), [(0.0, False), (0.5, True), (1.0, True), (-1.0, False)])
def test_retired_series_above_zero_are_a_workload_that_ran(value: float, ran: bool) -> None:
    assert ran_and_exited([Family("outrider_hook_processes").add(3.0, "running"),
                           Family("outrider_hook_retired_series").add(value)]) is ran
    assert ran_and_exited([Family("outrider_hook_processes").add(3.0, "running")]) is False


# --- attach ---------------------------------------------------------------------------------------------------

def test_attach_wires_the_documented_grace_periods_and_the_evidence_of_a_run(tmp_path: Path,
                                                                            said: list[str]) -> None:
    config = Config(spool_dir=str(tmp_path), collectors=("hook",), rule_files=(), exit_when_workload_exits=True,
                    interval_s=4.0, startup_grace_s=33.0, proc_root=str(tmp_path / "proc"))
    (tmp_path / "proc").mkdir()
    sampler = Sampler(config)
    w = attach(sampler, config)
    try:
        assert w is not None and w.grace_s == 12.0 and w.startup_grace_s == 33.0 and w._ran is ran_and_exited
        assert w.on_gone is None and said == []
        assert w._live([Family("outrider_hook_processes").add(4.0, "running")]) == 4
    finally:
        sampler.stop()


@pytest.mark.parametrize(("collectors", "pids", "warned"), [
    (("host",), (), True), (("host",), (os.getpid(),), False), (("hook", "host"), (), False),
])
def test_attach_says_when_there_is_nothing_to_watch(tmp_path: Path, said: list[str], collectors: tuple[str, ...],
                                                    pids: tuple[int, ...], warned: bool) -> None:
    config = Config(spool_dir=str(tmp_path), collectors=collectors, rule_files=(), exit_when_workload_exits=True,
                    pids=pids, proc_root=str(tmp_path))
    sampler = Sampler(config)
    try:
        assert attach(sampler, config) is not None
    finally:
        sampler.stop()
    assert said == (["WARNING exit_when_workload_exits: with neither the hook collector nor pids there is no workload "
                     "to watch; the agent runs until it is stopped"] if warned else [])


def test_attach_in_a_shared_pid_namespace_watches_the_other_containers_until_something_publishes(
        tmp_path: Path, said: list[str]) -> None:
    proc = tmp_path / "proc"
    me = os.getpid()
    _proc(proc, 1, 0)  # pause
    _proc(proc, 7, 0)  # the trainer's container
    _proc(proc, me, 0)  # this container: the agent
    config = Config(spool_dir=str(tmp_path), collectors=("hook",), rule_files=(), exit_when_workload_exits=True,
                    proc_root=str(proc))
    sampler = Sampler(config)
    try:
        w = attach(sampler, config)
        assert w is not None
        assert w._live([]) == 1, "the trainer, before it publishes"
        assert w._live([Family("outrider_hook_processes").add(2.0, "running")]) == 2
        assert w._live([]) == 0, "the shards alone, once published"
    finally:
        sampler.stop()
    assert said == ["INFO sharing the pod's PID namespace: until the workload publishes, the pod's other containers' "
                    "processes stand for it"]


def test_grace_is_three_sweeps_exactly_at_its_floor() -> None:
    assert lifecycle.grace_s(5.0 / 3.0) == 5.0 and lifecycle.grace_s(2.0) == 6.0 and lifecycle.grace_s(1.0) == 5.0
