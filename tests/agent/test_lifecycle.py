"""The exit-with-the-workload decision (lifecycle.WorkloadWatch) on a fake clock: seen, then gone for the grace
period, exactly once; never before the workload was seen; a workload that comes back resets the wait."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrider.ground.config import Config
from outrider.wiring.lifecycle import PodPeers, WorkloadWatch, attach, grace_s
from outrider.wiring.sampler import Sampler


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


def test_off_by_default_and_listening_to_sweeps_when_on(tmp_path: Path) -> None:
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
    from outrider.metrics.family import Family
    from outrider.wiring.lifecycle import ran_and_exited

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


def _proc(root: Path, pid: int, ppid: int, state: str = "S") -> None:
    """A process of a fake /proc tree: its stat (this process's own line with the pid, state and parent replaced)
    and its main thread's children file, and itself in its parent's."""
    text = Path("/proc/self/stat").read_text()
    rest = text[text.rindex(")") + 2:].split()
    rest[0], rest[1] = state, str(ppid)
    (root / str(pid) / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} (proc{pid}) {' '.join(rest)}\n")
    children = root / str(pid) / "task" / str(pid) / "children"
    if not children.exists():
        children.write_text("")
    if ppid:
        parents = root / str(ppid) / "task" / str(ppid) / "children"
        if str(pid) not in parents.read_text().split():
            parents.write_text(parents.read_text() + f"{pid} ")


def test_a_container_started_into_a_pods_pid_namespace_sees_the_other_containers_processes(tmp_path: Path) -> None:
    """The pod's pause process is PID 1; each container's first process has its parent outside the namespace (ppid
    0). The agent's container (first process 20, the agent 21 under it) sees the trainer's (7, and 8 under it)."""
    _proc(tmp_path, 1, 0)  # pause
    _proc(tmp_path, 7, 0)  # the trainer's container
    _proc(tmp_path, 8, 7)
    _proc(tmp_path, 20, 0)  # the sidecar's container: a wrapper, then the agent
    _proc(tmp_path, 21, 20)
    peers = PodPeers.around(str(tmp_path), pid=21)
    assert peers is not None and peers.own_root == 20
    assert peers.alive() == 2, "the trainer's two, not pause, not the sidecar's own"
    _proc(tmp_path, 8, 7, state="Z")
    assert peers.alive() == 1, "a zombie is gone"
    (tmp_path / "7" / "stat").unlink()  # exited between the listing and the reading
    assert peers.alive() == 0


def test_no_pod_peers_in_a_pid_namespace_of_its_own_or_on_the_host(tmp_path: Path) -> None:
    _proc(tmp_path, 1, 0)  # the container's own first process is PID 1: nothing shared
    _proc(tmp_path, 5, 1)
    assert PodPeers.around(str(tmp_path), pid=5) is None
    assert PodPeers.around(str(tmp_path), pid=1) is None
    assert PodPeers.around(str(tmp_path), pid=99) is None, "a parent chain that cannot be read"
    assert PodPeers.around("/proc") is None, "this test's own process: on the host or in a container of its own"


def test_until_the_workload_publishes_the_other_containers_processes_stand_for_it(tmp_path: Path) -> None:
    """A trainer alive before instrument() is seen and keeps the agent; once it publishes, the shards alone count
    (a proxy sidecar that runs on does not hold the agent); one that dies before publishing is gone after the grace
    period, not after startup_grace_s."""
    from outrider.metrics.family import Family

    _proc(tmp_path, 1, 0)
    _proc(tmp_path, 7, 0)  # the trainer
    _proc(tmp_path, 9, 0)  # a proxy sidecar
    _proc(tmp_path, 20, 0)  # the agent
    peers = PodPeers.around(str(tmp_path), pid=20)
    assert peers is not None
    hooked = [0]
    live = peers.until_published(lambda families: hooked[0])
    assert live([]) == 2, "nothing published yet: the other containers' processes"
    hooked[0] = 1  # the trainer publishes
    assert live([]) == 1 and peers.published
    hooked[0] = 0  # the trainer exits; the proxy runs on
    assert live([]) == 0, "the shards count now, not the proxy"

    clock, calls = Clock(), []
    fresh = PodPeers.around(str(tmp_path), pid=20)
    assert fresh is not None
    w = WorkloadWatch(fresh.until_published(lambda families: 0), grace_s=5.0, on_gone=lambda: calls.append("gone"),
                      clock=clock, startup_grace_s=900.0)
    (tmp_path / "9" / "stat").unlink()  # no proxy this time
    w.on_sweep([])
    assert w.seen, "the trainer, alive before it ever published"
    _proc(tmp_path, 7, 0, state="Z")  # killed before it published
    w.on_sweep([])
    clock.now += 5
    w.on_sweep([])
    assert calls == ["gone"], "after the grace period, not startup_grace_s"

    retired = Family("outrider_hook_retired_series").add(2.0)
    late = PodPeers.around(str(tmp_path), pid=20)
    assert late is not None
    assert late.until_published(lambda families: 0)([retired]) == 0 and late.published, \
        "a shard already retired counts as published"
