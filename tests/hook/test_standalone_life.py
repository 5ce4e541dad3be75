"""Each documented outcome of the standalone agent's start and exit (docs/process-model.md), pinned.

The start: hook/election.Election, run by the hook's thread every flush, against real processes whose exit status
is the outcome under test (the command the election starts is the boundary: a real `python -m outrider standalone`
exits 0 once it serves, 3 when another agent does, 2 on a refused setting; stand-ins with those statuses make each
outcome happen on demand), a real spool and its real locks. The exit: standalone.workload_watch, on a fixture
/proc and a fake clock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrider.commands.standalone import workload_watch
from outrider.ground.config import Config
from outrider.hook import election
from outrider.hook.election import ELECTION_RETRY_S, MAX_RETRY_S, Election
from outrider.metrics.family import Family
from outrider.shared import spool


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(election, "time", type("T", (), {"monotonic": staticmethod(c)}))
    monkeypatch.setattr(election.random, "uniform", lambda a, b: a)  # the spread of many processes' looks: none
    return c


@pytest.fixture
def sp(tmp_path: Path) -> str:
    path = tmp_path / "spool"
    spool.prepare_dir(str(path), private=False)
    return str(path)


def exits_with(monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    """The command the election starts: a process that exits with `status`, as the agent would."""
    monkeypatch.setattr(election, "agent_command", lambda *a, **k: [sys.executable, "-c",
                                                                    f"import sys; sys.exit({status})"])


@contextlib.contextmanager
def never_settling(sp: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Election, subprocess.Popen[bytes]]]:
    """An election that started a process which neither settles nor exits (killed at the end)."""
    monkeypatch.setattr(election, "agent_command", lambda *a, **k: [sys.executable, "-c",
                                                                    "import time; time.sleep(600)"])
    e = Election(sp, "", True, frozenset())
    e.maybe_start_agent()
    child = e._child
    assert isinstance(child, subprocess.Popen)
    try:
        yield e, child
    finally:
        child.kill()
        child.wait()


def settled(e: Election) -> None:
    """Waits for the started process to exit, then lets the election look at it (its next flush)."""
    child = e._child
    assert child is not None, "a process was started"
    deadline = time.monotonic() + 60
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    e.maybe_start_agent()


class Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    """What the election says (the hook's logger; the agent's logging setup may keep it from the root's)."""
    said = Said()
    logger = logging.getLogger("outrider.hook")
    logger.addHandler(said)
    try:
        yield said.messages
    finally:
        logger.removeHandler(said)


def test_a_started_agent_is_a_success_and_the_next_look_is_at_the_usual_pace(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    exits_with(monkeypatch, 0)
    e = Election(sp, "", True, frozenset())
    e.maybe_start_agent()
    assert e.started == 1 and e._spawn_fd is not None, "started, holding spawn.lock until it settles"
    settled(e)
    assert e._spawn_fd is None and e._child is None and warnings == []
    assert e._next_try == clock.now + ELECTION_RETRY_S and e._retry_s == ELECTION_RETRY_S


def test_another_agent_already_serving_is_a_success_not_a_failed_start(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    """Every second job of a node finds the first one's agent: no warning, no back-off."""
    exits_with(monkeypatch, spool.EXIT_ANOTHER_AGENT)
    e = Election(sp, "", True, frozenset())
    e.maybe_start_agent()
    settled(e)
    assert warnings == [] and e._retry_s == ELECTION_RETRY_S and e._next_try == clock.now + ELECTION_RETRY_S


def test_a_refused_start_is_said_once_and_backs_off_doubling_up_to_ten_minutes(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    exits_with(monkeypatch, 2)  # the agent refuses a setting: it says why on stderr and exits 2
    e = Election(sp, "", True, frozenset())
    waits = []
    for _ in range(9):
        e.maybe_start_agent()
        settled(e)
        waits.append(e._next_try - clock.now)
        clock.now = e._next_try
    assert waits == [10.0, 20.0, 40.0, 80.0, 160.0, 320.0, MAX_RETRY_S, MAX_RETRY_S, MAX_RETRY_S]
    assert len(warnings) == 1 and "it exited with status 2" in warnings[0]


def test_while_spawn_lock_is_held_by_another_process_of_the_job_nothing_is_started(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    exits_with(monkeypatch, 0)
    held = election.try_spawn_lock(sp)  # another process of the job is starting the agent
    assert held is not None
    try:
        e = Election(sp, "", True, frozenset())
        e.maybe_start_agent()
        assert e.started == 0 and e._child is None
    finally:
        os.close(held)
    clock.now += ELECTION_RETRY_S
    e.maybe_start_agent()
    assert e.started == 1, "once it is let go, the next look starts one"
    settled(e)


def test_an_agent_serving_the_spool_means_no_start(sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    exits_with(monkeypatch, 0)
    held = spool.try_lock(sp)
    assert held is not None
    try:
        e = Election(sp, "", True, frozenset())
        e.maybe_start_agent()
        assert e.started == 0 and e._child is None and e._spawn_fd is None
    finally:
        os.close(held)


def test_an_embedding_executable_starts_nothing_and_says_so_once(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    monkeypatch.setattr(sys, "executable", "/usr/sbin/uwsgi")
    e = Election(sp, "", True, frozenset())
    e.maybe_start_agent()
    clock.now = e._next_try
    e.maybe_start_agent()
    assert e.started == 0 and e._spawn_fd is None
    assert len(warnings) == 1 and "'/usr/sbin/uwsgi' is not a Python interpreter" in warnings[0]


def test_a_start_that_never_settles_is_let_go_after_a_minute_and_backs_off(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    with never_settling(sp, monkeypatch) as (e, child):
        clock.now += election.SPAWN_TIMEOUT_S - 1
        e.maybe_start_agent()
        assert e._child is child and e._spawn_fd is not None, "still starting: spawn.lock still held"
        clock.now += 2
        e.maybe_start_agent()
        assert e._child is None and e._spawn_fd is None and e._retry_s == 2 * ELECTION_RETRY_S
        assert len(warnings) == 1 and "has not settled" in warnings[0]


def test_no_room_for_its_threads_starts_nothing_and_says_why_once(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    exits_with(monkeypatch, 0)
    monkeypatch.setattr(election, "task_headroom", lambda: (27, 30, "ulimit -u 30: this user runs 3 threads"))
    e = Election(sp, "", True, frozenset())
    for _ in range(3):
        e.maybe_start_agent()
        clock.now = e._next_try
    assert e.started == 0 and e.no_room == 3 and e._spawn_fd is None
    assert len(warnings) == 1 and "8 of the 27 threads" in warnings[0] and "ulimit -u 30" in warnings[0]


# --- the exit ------------------------------------------------------------------------------------------------

def stat_line(pid: int, start_ticks: int) -> str:
    text = Path("/proc/self/stat").read_text()
    rest = text[text.rindex(")") + 2:].split()
    rest[0], rest[19] = "S", str(start_ticks)
    return f"{pid} (python3) {' '.join(rest)}\n"


def watch_on(tmp_path: Path, alive: bool) -> tuple[Path, list[float], list[bool], object]:
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    if alive:
        (proc / "4242" / "stat").write_text(stat_line(4242, 1000))
    clock = [0.0]
    gone: list[bool] = []
    watch = workload_watch(Config(proc_root=str(proc), interval_s=1.0), 4242, clock=lambda: clock[0])
    watch.on_gone = lambda: gone.append(True)
    return proc, clock, gone, watch


NOBODY = [Family("outrider_hook_processes").add(0, "running")]


def test_a_workload_gone_before_the_agents_first_sweep_still_ends_it(tmp_path: Path) -> None:
    """The workload counts as seen from the start: it was alive when it started the agent. One that exits before
    the agent's first sweep (a short job) must not leave the agent running for ever."""
    _, clock, gone, watch = watch_on(tmp_path, alive=False)
    watch.on_sweep(NOBODY)  # type: ignore[attr-defined]
    assert not gone
    clock[0] = watch.grace_s  # type: ignore[attr-defined]
    watch.on_sweep(NOBODY)  # type: ignore[attr-defined]
    assert gone == [True]


def test_a_workload_gone_after_it_ends_the_agent_a_grace_period_later_and_a_next_stage_within_it_keeps_it(
        tmp_path: Path) -> None:
    proc, clock, gone, watch = watch_on(tmp_path, alive=True)
    watch.on_sweep(NOBODY)  # type: ignore[attr-defined]
    (proc / "4242" / "stat").unlink()  # the first stage ends
    clock[0] = 10.0
    watch.on_sweep(NOBODY)  # type: ignore[attr-defined]
    clock[0] = 10.0 + watch.grace_s - 0.5  # type: ignore[attr-defined]
    watch.on_sweep([Family("outrider_hook_processes").add(1, "running")])  # type: ignore[attr-defined]
    assert not gone, "the next stage published within the grace period: served on"
    clock[0] = 40.0
    watch.on_sweep(NOBODY)  # type: ignore[attr-defined]
    clock[0] = 40.0 + watch.grace_s  # type: ignore[attr-defined]
    watch.on_sweep(NOBODY)  # type: ignore[attr-defined]
    assert gone == [True]
