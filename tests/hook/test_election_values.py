"""hook/election value by value, in process: the agent's command and environment, which executable is Python, the
room for its threads, the locks' probes, how the started process is set up (both ways of starting it), and what the
election does and says at each turn: the waits, the back-off's resets, each failure's words, the fork.

Real spools, real locks and real started processes (a stand-in for the agent that writes down how it was started);
the clock and the spread of the looks are fakes (tests/hook/test_standalone_life.py's). The outcomes as a user sees
them are tests/hook/test_standalone_life.py's; these pin the values behind them, so a one-line change is caught
without starting a workload.
"""

from __future__ import annotations

import errno
import json
import os
import random
import resource
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from outrider.hook import election, native
from outrider.hook.election import AGENT_TASKS, ELECTION_RETRY_S, MAX_RETRY_S, SPAWN_TIMEOUT_S, Election
from outrider.kernel import cgroupfs, procfs
from outrider.shared import spool
from tests.hook.test_standalone_life import Clock, clock, exits_with, never_settling, settled, sp, warnings

__all__ = ["clock", "sp", "warnings"]  # fixtures, used by name

STRANGER = 4321
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(election.__file__))))

# The stand-in for the agent: writes down how it was started (its argv, session, working directory, descriptors and
# their open flags, PYTHONPATH) to the file named last on its command line, then exits 0.
REPORT = r"""
import json, os, sys
fds = sorted(int(n) for n in os.listdir("/proc/self/fd"))
def flags(fd):
    for line in open(f"/proc/self/fdinfo/{fd}"):
        if line.startswith("flags:"):
            return int(line.split()[1], 8) & 3
def target(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
out = {"argv": sys.argv[1:], "session_leader": os.getsid(0) == os.getpid(), "cwd": os.getcwd(),
       "fds": [fd for fd in fds if target(fd) is not None and not target(fd).startswith("/proc/")],
       "stdin": [target(0), flags(0)], "stdout": [target(1), flags(1)], "stderr": target(2),
       "pythonpath": os.environ.get("PYTHONPATH"), "marker": os.environ.get("OUTRIDER_MARKER")}
with open(sys.argv[-1] + ".tmp", "w") as fh:
    json.dump(out, fh)
os.rename(sys.argv[-1] + ".tmp", sys.argv[-1])
"""


def reports_to(monkeypatch: pytest.MonkeyPatch, out: Path, argv0: str = "python3") -> None:
    """The command the election starts: the REPORT stand-in, told to write to `out`."""
    monkeypatch.setattr(election, "agent_command", lambda *a, **k: [argv0, "-c", REPORT, str(out)])


def report_of(out: Path) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    loaded: dict[str, object] = json.loads(out.read_text())
    return loaded


def free(sp: str, name: str = election.SPAWN_LOCK_NAME) -> bool:
    """Whether no open file of any process (this one's included: flock is per open file) holds the lock."""
    fd = spool.try_lock(sp, name)
    if fd is None:
        return False
    os.close(fd)
    return True


def open_fds() -> set[int]:
    """This process's descriptors, less the one the listing itself opens."""
    listing = f"/proc/{os.getpid()}/fd"
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") != listing:
                fds.add(int(name))
        except OSError:
            continue  # the listing's own, closed by now
    return fds


def plant(sp: str, name: str, owner: int = STRANGER) -> None:
    """A lock file another user left in the spool, held by nobody."""
    path = os.path.join(sp, name)
    Path(path).write_text("")
    os.chown(path, owner, owner)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file needs root")


# --- the command and its environment --------------------------------------------------------------------------

def test_the_command_names_the_workload_and_detaches_and_passes_only_what_was_set() -> None:
    base = [sys.executable, "-m", "outrider", "standalone", "--workload-pid", "42", "--detach"]
    assert election.agent_command("/sp", False, "", 42) == base
    assert election.agent_command("/sp", True, "", 42) == [*base, "--spool-dir", "/sp"]
    assert election.agent_command("/sp", False, "127.0.0.1:0", 42) == [*base, "--listen", "127.0.0.1:0"]
    assert election.agent_command("/sp", True, ":9", 7) == [
        sys.executable, "-m", "outrider", "standalone", "--workload-pid", "7", "--detach", "--spool-dir", "/sp",
        "--listen", ":9"]


def test_the_agents_environment_is_the_workloads_with_this_outrider_first_on_the_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTRIDER_MARKER", "kept")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = election.agent_environment()
    assert env["PYTHONPATH"] == PACKAGE_ROOT and env["OUTRIDER_MARKER"] == "kept"
    assert os.path.isfile(os.path.join(PACKAGE_ROOT, "outrider", "hook", "election.py"))
    monkeypatch.setenv("PYTHONPATH", "/a:/b")
    assert election.agent_environment()["PYTHONPATH"] == PACKAGE_ROOT + os.pathsep + "/a:/b"
    monkeypatch.setenv("PYTHONPATH", "")
    assert election.agent_environment()["PYTHONPATH"] == PACKAGE_ROOT
    assert os.environ["PYTHONPATH"] == "", "the workload's own environment is left as it was"


@pytest.mark.parametrize(("name", "mode", "python"), [
    ("python3.11", 0o755, True), ("python", 0o700, True), ("pypy3", 0o755, True),
    ("python3", 0o644, False),  # not executable
    ("uwsgi", 0o755, False), ("mypython", 0o755, False), ("ipypy", 0o755, False),
])
def test_only_an_executable_named_python_or_pypy_is_started_with_m_outrider(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, mode: int, python: bool) -> None:
    exe = tmp_path / name
    exe.write_text("")
    exe.chmod(mode)
    monkeypatch.setattr(sys, "executable", str(exe))
    assert election.python_interpreter() == (str(exe) if python else None)


@pytest.mark.parametrize("exe", ["", None])
def test_no_executable_at_all_is_none(monkeypatch: pytest.MonkeyPatch, exe: str | None) -> None:
    monkeypatch.setattr(sys, "executable", exe)
    assert election.python_interpreter() is None


# --- the room for the agent's threads -------------------------------------------------------------------------

def fixture_roots(tmp_path: Path, pids: tuple[str, str] | None) -> tuple[str, str]:
    """A /proc with one process of uid 1000 running 6 threads and one of uid 1001 running 50, and a cgroup tree
    whose pids limit is `pids` (max, current), or no pids limit."""
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    for pid, uid, threads in ((10, 1000, 6), (11, 1001, 50)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nThreads:\t{threads}\n")
    (proc / "self").mkdir()
    (proc / "self" / "cgroup").write_text("0::/job\n")
    group = sys_root / "fs" / "cgroup" / "job"
    group.mkdir(parents=True)
    (sys_root / "fs" / "cgroup" / "cgroup.controllers").write_text("pids\n")
    if pids is not None:
        (group / "pids.max").write_text(pids[0] + "\n")
        (group / "pids.current").write_text(pids[1] + "\n")
    return str(proc), str(sys_root)


def nproc_limit(monkeypatch: pytest.MonkeyPatch, soft: int, uid: int = 1000) -> None:
    """RLIMIT_NPROC's soft limit `soft` for a process of `uid`; any other limit asked for is refused."""
    def getrlimit(which: int) -> tuple[int, int]:
        if which != resource.RLIMIT_NPROC:
            raise ValueError(f"not RLIMIT_NPROC: {which}")
        return soft, resource.RLIM_INFINITY

    monkeypatch.setattr(resource, "getrlimit", getrlimit)
    monkeypatch.setattr(os, "getuid", lambda: uid)


def test_the_users_thread_limit_counts_that_users_threads_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc, sys_root = fixture_roots(tmp_path, None)
    nproc_limit(monkeypatch, 100)
    assert election.task_headroom(proc, sys_root) == (94, 100, "ulimit -u 100: this user runs 6 threads")
    nproc_limit(monkeypatch, 100, uid=1001)
    assert election.task_headroom(proc, sys_root) == (50, 100, "ulimit -u 100: this user runs 50 threads")


def test_no_limit_anywhere_is_none_and_an_unlimited_user_is_no_limit(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    proc, sys_root = fixture_roots(tmp_path, None)
    nproc_limit(monkeypatch, resource.RLIM_INFINITY)
    assert election.task_headroom(proc, sys_root) is None
    nproc_limit(monkeypatch, 100, uid=0)
    assert election.task_headroom(proc, sys_root) is None, "root is exempt from RLIMIT_NPROC"
    nproc_limit(monkeypatch, 100, uid=1)
    assert election.task_headroom(proc, sys_root) is not None, "only root is"


def test_the_pids_cgroup_alone_and_the_tighter_of_the_two(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc, sys_root = fixture_roots(tmp_path, ("300", "120"))
    nproc_limit(monkeypatch, resource.RLIM_INFINITY)
    assert election.task_headroom(proc, sys_root) == (180, 300, "the pids cgroup allows 300: 120 in use")
    nproc_limit(monkeypatch, 190)
    assert election.task_headroom(proc, sys_root) == (180, 300, "the pids cgroup allows 300: 120 in use")
    nproc_limit(monkeypatch, 180)
    assert election.task_headroom(proc, sys_root) == (174, 180, "ulimit -u 180: this user runs 6 threads")


def test_a_limit_that_cannot_be_read_leaves_the_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc, sys_root = fixture_roots(tmp_path, ("300", "120"))
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    for error in (OSError(errno.EPERM, "refused"), ValueError("odd")):
        def getrlimit(which: int, error: Exception = error) -> tuple[int, int]:
            raise error

        monkeypatch.setattr(resource, "getrlimit", getrlimit)
        assert election.task_headroom(proc, sys_root) == (180, 300, "the pids cgroup allows 300: 120 in use")


def test_the_election_reads_the_real_proc_and_sys(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, str]] = []

    def pids_limit(proc_root: str, sys_root: str) -> None:
        asked.append((proc_root, sys_root))

    def tasks_of_user(proc_root: str, uid: int) -> int:
        asked.append((proc_root, str(uid)))
        return 5

    monkeypatch.setattr(cgroupfs, "pids_limit", pids_limit)
    monkeypatch.setattr(procfs, "tasks_of_user", tasks_of_user)
    nproc_limit(monkeypatch, 100)
    assert election.task_headroom() == (95, 100, "ulimit -u 100: this user runs 5 threads")
    assert asked == [("/proc", "1000"), ("/proc", "/sys")]


@pytest.mark.parametrize(("free_tasks", "limit", "room"), [
    (100 + AGENT_TASKS, 201, True), (99 + AGENT_TASKS, 201, False),  # half of an odd limit, rounded down
    (64 + AGENT_TASKS, 129, True), (63 + AGENT_TASKS, 10, False),
])
def test_half_an_odd_limit_is_rounded_down(free_tasks: int, limit: int, room: bool) -> None:
    assert election.room_for_agent((free_tasks, limit, "")) is room


# --- the locks' probes ----------------------------------------------------------------------------------------

def test_a_probe_of_a_free_agent_lock_leaves_it_free_and_makes_it_with_the_mode_asked(sp: str) -> None:
    before = open_fds()
    assert election.agent_serving(sp, mode=0o640) is False
    assert open_fds() == before and free(sp, spool.LOCK_NAME)
    assert stat.S_IMODE(os.stat(os.path.join(sp, spool.LOCK_NAME)).st_mode) == 0o640
    held = spool.try_lock(sp)
    assert held is not None
    try:
        assert election.agent_serving(sp) is True
        assert open_fds() == before | {held}
    finally:
        os.close(held)


def test_the_spawn_lock_is_spawn_lock_held_by_its_descriptor_with_the_mode_asked(sp: str) -> None:
    fd = election.try_spawn_lock(sp, mode=0o640)
    assert fd is not None
    try:
        assert not free(sp) and free(sp, spool.LOCK_NAME)
        assert election.try_spawn_lock(sp) is None, "the job's other processes: not theirs now"
        assert stat.S_IMODE(os.stat(os.path.join(sp, "spawn.lock")).st_mode) == 0o640
    finally:
        os.close(fd)
    assert free(sp)


@needs_root
@pytest.mark.parametrize("name", [spool.LOCK_NAME, election.SPAWN_LOCK_NAME])
def test_a_lock_a_stranger_planted_is_replaced_and_said_and_a_trusted_ones_is_used(sp: str, name: str) -> None:
    said: list[str] = []
    probe = election.agent_serving if name == spool.LOCK_NAME else election.try_spawn_lock
    plant(sp, name)
    fd = probe(sp, frozenset({STRANGER}), spool.PRIVATE_FILE_MODE, said.append)
    assert said == [] and os.stat(os.path.join(sp, name)).st_uid == STRANGER, "a trusted uid's file is used"
    if type(fd) is int:
        os.close(fd)
    fd = probe(sp, frozenset(), spool.PRIVATE_FILE_MODE, said.append)
    if type(fd) is int:
        os.close(fd)
    assert os.stat(os.path.join(sp, name)).st_uid == os.geteuid()
    assert said == [f"{os.path.join(sp, name)} was owned by uid {STRANGER}, which is not trusted, and no process held "
                    "it (planted by another user?): replaced with one of this user's"]


# --- how the agent is started ---------------------------------------------------------------------------------

def started_in_a_busy_process(sp: str, tmp_path: Path) -> Election:
    """An election's first look, made while this process's stdin is a file of its own (a workload's terminal or
    pipe) and descriptor 3 is open and inheritable (the first a careless start would pass on)."""
    stdin = os.dup(0)
    own = os.open(tmp_path / "workload-stdin", os.O_RDWR | os.O_CREAT, 0o600)
    os.dup2(own, 0)
    os.close(own)
    opened = False
    try:
        was = os.get_inheritable(3)
    except OSError:
        fd = os.open(os.devnull, os.O_RDONLY)
        if fd != 3:
            os.dup2(fd, 3)
            os.close(fd)
        was, opened = False, True
    os.set_inheritable(3, True)
    try:
        e = Election(sp, "", True, frozenset())
        e.maybe_start_agent()
    finally:
        if opened:
            os.close(3)
        else:
            os.set_inheritable(3, was)
        os.dup2(stdin, 0)
        os.close(stdin)
    return e


def check_started_like_popen(report: dict[str, object], stdin_flags: int, stdout_flags: int) -> None:
    """A session of its own, stdin and stdout on /dev/null (opened with those flags), stderr the workload's, and
    no other descriptor; this copy of outrider first on its path."""
    assert report["session_leader"] is True
    assert report["stdin"] == [os.devnull, stdin_flags] and report["stdout"] == [os.devnull, stdout_flags]
    assert report["stderr"] == os.readlink("/proc/self/fd/2")
    assert report["fds"] == [0, 1, 2]
    assert str(report["pythonpath"]).split(os.pathsep)[0] == PACKAGE_ROOT and report["marker"] == "kept"


def test_the_agent_is_started_in_a_session_of_its_own_with_only_stderr_of_the_workloads_descriptors(
        sp: str, tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "report.json"
    reports_to(monkeypatch, out, argv0="not-an-executable")  # started by its executable, not its argv[0]
    monkeypatch.setenv("OUTRIDER_MARKER", "kept")
    e = started_in_a_busy_process(sp, tmp_path)
    report = report_of(out)
    settled(e)
    check_started_like_popen(report, os.O_RDWR, os.O_RDWR)  # subprocess.DEVNULL is opened read-write
    assert report["cwd"] == "/" and report["argv"] == [str(out)]


@pytest.mark.parametrize("green", ["subprocess", "os"])
def test_where_a_green_library_patched_subprocess_or_os_the_agent_is_posix_spawned_the_same_way(
        sp: str, tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch, green: str) -> None:
    out = tmp_path / "report.json"
    reports_to(monkeypatch, out)
    monkeypatch.setenv("OUTRIDER_MARKER", "kept")
    monkeypatch.setattr(native, "patched", lambda module: module == green)
    e = started_in_a_busy_process(sp, tmp_path)
    assert isinstance(e._child, election.SpawnedAgent)
    report = report_of(out)
    settled(e)
    check_started_like_popen(report, os.O_RDONLY, os.O_WRONLY)
    assert e._child is None and e._spawn_fd is None and e.started == 1


def test_a_spawned_agents_exit_is_read_once_and_kept(tmp_path: Path) -> None:
    agent = election.SpawnedAgent(sys.executable, [sys.executable, "-c", "import sys, time; time.sleep(0.3); "
                                                                          "sys.exit(3)"])
    assert agent.poll() is None and agent.returncode is None, "still running"
    deadline = time.monotonic() + 60
    while agent.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert agent.returncode == 3 and agent.poll() == 3, "read once, then kept (its pid is reaped)"


def test_a_spawned_agent_killed_reads_as_its_signal_and_one_reaped_by_another_as_ended() -> None:
    killed = election.SpawnedAgent(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(killed.pid, 9)
    deadline = time.monotonic() + 60
    while killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert killed.returncode == -9
    reaped = election.SpawnedAgent(sys.executable, [sys.executable, "-c", "import sys; sys.exit(5)"])
    os.waitpid(reaped.pid, 0)  # a green library's child watcher got there first
    assert reaped.poll() == 0 and reaped.returncode == 0


@pytest.mark.parametrize("green", [None, "os"])
def test_the_agent_is_started_with_the_real_command_for_this_spool_address_and_workload(
        sp: str, tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch, green: str | None) -> None:
    """The command as the election makes it, run by a stand-in interpreter (a script named python3) that writes
    down its arguments."""
    out = tmp_path / "argv"
    exe = tmp_path / "python3"
    exe.write_text(f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" > {out}.tmp && mv {out}.tmp {out}\n')
    exe.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(exe))
    monkeypatch.setattr(native, "patched", lambda module: module == green)
    e = Election(sp, "127.0.0.1:0", True, frozenset())
    e.maybe_start_agent()
    argv = report_lines(out)
    settled(e)
    assert argv == [str(exe), "-m", "outrider", "standalone", "--workload-pid", str(os.getpid()), "--detach",
                    "--spool-dir", sp, "--listen", "127.0.0.1:0"]
    assert e.started == 1 and e._retry_s == ELECTION_RETRY_S
    clock.now = e._next_try
    e = Election(sp, "", False, frozenset())  # the default spool (its path is the agent's default too)
    Path(sp).chmod(0o700)
    out.unlink()
    e.maybe_start_agent()
    argv = report_lines(out)
    settled(e)
    assert argv == [str(exe), "-m", "outrider", "standalone", "--workload-pid", str(os.getpid()), "--detach"]


def report_lines(out: Path) -> list[str]:
    deadline = time.monotonic() + 60
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return out.read_text().splitlines()


# --- the election, turn by turn -------------------------------------------------------------------------------

def test_the_first_look_is_at_once_whatever_the_clock_reads(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    exits_with(monkeypatch, 0)
    clock.now = 0.0  # CLOCK_MONOTONIC counts from boot
    e = Election(sp, "", True, frozenset())
    e.maybe_start_agent()
    assert e.started == 1
    settled(e)


@needs_root
@pytest.mark.parametrize("name", [spool.LOCK_NAME, election.SPAWN_LOCK_NAME])
def test_a_planted_lock_replaced_during_a_look_is_said_once(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str], name: str) -> None:
    exits_with(monkeypatch, 0)
    plant(sp, name)
    e = Election(sp, "", True, frozenset())
    e.maybe_start_agent()
    settled(e)
    assert e.started == 1
    assert warnings == [f"outrider: {os.path.join(sp, name)} was owned by uid {STRANGER}, which is not trusted, and "
                        "no process held it (planted by another user?): replaced with one of this user's"]
    clock.now = e._next_try
    plant(sp, name)
    e.maybe_start_agent()
    settled(e)
    assert e.started == 2 and len(warnings) == 1, "said once per lock"


@needs_root
def test_an_agent_lock_planted_while_the_spawn_lock_was_taken_is_said_too(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    exits_with(monkeypatch, 0)
    take = election.try_spawn_lock

    def and_plant(*args: Any) -> int | None:
        fd = take(*args)
        plant(sp, spool.LOCK_NAME)  # between the two looks at agent.lock
        return fd

    monkeypatch.setattr(election, "try_spawn_lock", and_plant)
    e = Election(sp, "", True, frozenset())
    e.maybe_start_agent()
    settled(e)
    assert e.started == 1 and len(warnings) == 1 and f"{spool.LOCK_NAME} was owned by uid {STRANGER}" in warnings[0]


def test_nothing_is_looked_at_before_the_next_try_and_each_look_is_spread_over_a_fifth_more(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    spreads: list[tuple[float, float]] = []

    def uniform(a: float, b: float) -> float:
        spreads.append((a, b))
        return b

    monkeypatch.setattr(random, "uniform", uniform)
    held = spool.try_lock(sp)  # an agent serves: each look finds it
    assert held is not None
    try:
        e = Election(sp, "", True, frozenset())
        e.maybe_start_agent()
        assert spreads == [(1.0, 1.2)] and e._next_try == clock.now + ELECTION_RETRY_S * 1.2
        clock.now = e._next_try - 0.001
        e.maybe_start_agent()
        assert len(spreads) == 1, "not yet"
        clock.now = e._next_try
        e.maybe_start_agent()
        assert len(spreads) == 2, "at the next try exactly"
    finally:
        os.close(held)
    assert e.started == 0 and e._retry_s == ELECTION_RETRY_S


def test_the_default_spool_is_private_and_its_locks_too_a_configured_one_shares_them(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    exits_with(monkeypatch, 0)
    private = tmp_path / "private"
    e = Election(str(private), "", False, frozenset())
    e.maybe_start_agent()
    assert e.started == 1 and stat.S_IMODE(os.stat(private).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(private / "agent.lock").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(private / "spawn.lock").st_mode) == 0o600
    settled(e)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)  # others may enter: refused as a private spool, used as a configured one
    e = Election(str(shared), "", True, frozenset())
    e.maybe_start_agent()
    assert e.started == 1
    assert stat.S_IMODE(os.stat(shared / "agent.lock").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(shared / "spawn.lock").st_mode) == 0o644
    settled(e)
    e = Election(str(shared), "", False, frozenset())
    e.maybe_start_agent()
    assert e.started == 0, "the default spool open to others is refused"


@needs_root
def test_a_configured_spool_of_a_trusted_uid_is_used(tmp_path: Path, clock: Clock,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    exits_with(monkeypatch, 0)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, STRANGER, STRANGER)
    e = Election(str(shared), "", True, frozenset({STRANGER}))
    e.maybe_start_agent()
    assert e.started == 1
    settled(e)
    e = Election(str(shared), "", True, frozenset())
    e.maybe_start_agent()
    assert e.started == 0, "not trusted"


def test_an_unusable_spool_is_left_to_the_publisher_to_say_no_back_off(
        tmp_path: Path, clock: Clock, warnings: list[str]) -> None:
    path = tmp_path / "a-file"
    path.write_text("")
    e = Election(str(path), "", True, frozenset())
    e.maybe_start_agent()
    assert e.started == 0 and warnings == [] and e._retry_s == ELECTION_RETRY_S
    assert e._next_try == clock.now + ELECTION_RETRY_S


def test_a_lock_that_cannot_be_replaced_is_a_failure_said_once_with_back_off(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    def refused(*args: object, **kwargs: object) -> int | None:
        raise spool.LockRefused(errno.EPERM, "agent.lock is planted, and no process holds it")

    monkeypatch.setattr(spool, "try_lock", refused)
    e = Election(sp, "", True, frozenset())
    e.maybe_start_agent()
    assert e._retry_s == 2 * ELECTION_RETRY_S and e._next_try == clock.now + 2 * ELECTION_RETRY_S
    assert warnings == [f"outrider: could not start an agent for the spool {sp} ([Errno 1] agent.lock is planted, "
                        "and no process holds it); metrics are still published there, and the start is retried "
                        "with back-off"]


def test_an_agent_that_came_while_the_spawn_lock_was_taken_means_no_start_and_the_lock_let_go(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    exits_with(monkeypatch, 0)
    looks = iter([False, True])
    monkeypatch.setattr(election, "agent_serving", lambda *a, **k: next(looks))
    before = open_fds()
    e = Election(sp, "", True, frozenset())
    e.maybe_start_agent()
    assert e.started == 0 and e._child is None and e._spawn_fd is None
    assert free(sp) and open_fds() == before


def test_an_embedding_executable_lets_the_spawn_lock_go(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    monkeypatch.setattr(sys, "executable", "/usr/sbin/uwsgi")
    before = open_fds()
    e = Election(sp, "", True, frozenset())
    e.maybe_start_agent()
    assert free(sp) and open_fds() == before
    assert e._retry_s == 2 * ELECTION_RETRY_S and e._next_try == clock.now + 2 * ELECTION_RETRY_S
    assert warnings == [f"outrider: could not start an agent for the spool {sp} ('/usr/sbin/uwsgi' is not a Python "
                        "interpreter; run `outrider agent` beside it); metrics are still published there, and the "
                        "start is retried with back-off"]


def test_no_room_lets_the_spawn_lock_go_counts_and_says_the_whole_reason(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    exits_with(monkeypatch, 0)
    monkeypatch.setattr(election, "task_headroom", lambda: (27, 30, "ulimit -u 30: this user runs 3 threads"))
    before = open_fds()
    e = Election(sp, "", True, frozenset())
    e.maybe_start_agent()
    assert free(sp) and open_fds() == before and e.no_room == 1 and e.started == 0
    assert warnings == [f"outrider: could not start an agent for the spool {sp} (it would take 8 of the 27 threads "
                        "this job may still start (ulimit -u 30: this user runs 3 threads), which the workload may "
                        "need; run `outrider agent` beside the job or raise the limit); metrics are still published "
                        "there, and the start is retried with back-off"]
    monkeypatch.setattr(election, "task_headroom", lambda: None)
    clock.now = e._next_try
    e.maybe_start_agent()
    assert e.started == 1 and e.no_room == 1, "no limit: room"
    settled(e)


def test_a_start_that_raises_lets_the_spawn_lock_go_and_is_a_failure(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    def broken() -> dict[str, str]:
        raise RuntimeError("a patched library's own error")

    monkeypatch.setattr(election, "agent_environment", broken)
    before = open_fds()
    e = Election(sp, "", True, frozenset())
    e.maybe_start_agent()
    assert free(sp) and open_fds() == before and e.started == 0 and e._child is None
    assert e._retry_s == 2 * ELECTION_RETRY_S
    assert len(warnings) == 1 and "(a patched library's own error)" in warnings[0]


def test_a_start_holds_the_spawn_lock_from_its_time_and_counts(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    exits_with(monkeypatch, 0)
    e = Election(sp, "", True, frozenset())
    for n in (1, 2):
        e.maybe_start_agent()
        assert e.started == n and not free(sp) and e._spawned_at == clock.now
        settled(e)
        assert free(sp)
        clock.now = e._next_try


def test_a_start_unsettled_for_exactly_the_timeout_is_let_go_and_said_in_seconds(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str]) -> None:
    with never_settling(sp, monkeypatch) as (e, _):
        clock.now += SPAWN_TIMEOUT_S
        e.maybe_start_agent()
        assert e._child is None and free(sp)
        assert e._next_try == clock.now + 2 * ELECTION_RETRY_S
        assert warnings == [f"outrider: could not start an agent for the spool {sp} (it has not settled after 60 s); "
                            "metrics are still published there, and the start is retried with back-off"]


@pytest.mark.parametrize("success", [0, spool.EXIT_ANOTHER_AGENT])
def test_a_success_after_failures_resets_the_back_off_and_the_next_failure_is_said_again(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch, warnings: list[str], success: int) -> None:
    e = Election(sp, "", True, frozenset())
    for _ in range(2):
        exits_with(monkeypatch, 2)
        e.maybe_start_agent()
        settled(e)
        clock.now = e._next_try
    assert e._retry_s == 4 * ELECTION_RETRY_S and len(warnings) == 1
    exits_with(monkeypatch, success)
    e.maybe_start_agent()
    settled(e)
    assert e._retry_s == ELECTION_RETRY_S and e._next_try == clock.now + ELECTION_RETRY_S
    clock.now = e._next_try
    exits_with(monkeypatch, 1)
    e.maybe_start_agent()
    settled(e)
    assert e._retry_s == 2 * ELECTION_RETRY_S and len(warnings) == 2 and "it exited with status 1" in warnings[1]


def test_the_back_off_stops_at_ten_minutes(sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    e = Election(sp, "", True, frozenset())
    e._retry_s = MAX_RETRY_S / 2 + 1
    e._failed("again")
    assert e._retry_s == MAX_RETRY_S and e._next_try == clock.now + MAX_RETRY_S
    e._failed("again")
    assert e._retry_s == MAX_RETRY_S


def test_a_replaced_lock_is_said_once_per_lock_and_at_most_eight_times(sp: str, warnings: list[str]) -> None:
    e = Election(sp, "", True, frozenset())
    for n in range(12):
        e._replaced(f"lock {n} was replaced")
        e._replaced(f"lock {n} was replaced")
    assert warnings == [f"outrider: lock {n} was replaced" for n in range(8)]


def test_stop_lets_the_spawn_lock_go_even_where_its_descriptor_is_already_closed(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    with never_settling(sp, monkeypatch) as (e, _):
        assert e._spawn_fd is not None
        e.stop()
        assert free(sp) and e._spawn_fd is None
        e.stop()  # twice: nothing more
        fd = e._spawn_fd = os.open(os.devnull, os.O_RDONLY)
        os.close(fd)  # closed under it (a fork handler, say)
        e.stop()
        assert e._spawn_fd is None


def test_a_forked_child_holds_nothing_of_the_parents_start_and_spreads_its_first_look(
        sp: str, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    spreads: list[tuple[float, float]] = []

    def uniform(a: float, b: float) -> float:
        spreads.append((a, b))
        return 2.5

    monkeypatch.setattr(random, "uniform", uniform)
    with never_settling(sp, monkeypatch) as (e, _):
        e._retry_s, e._warned = 4 * ELECTION_RETRY_S, True
        spawn_fd = e._spawn_fd
        assert spawn_fd is not None
        before = open_fds()
        e.after_fork_in_child()
        assert open_fds() == before - {spawn_fd} and free(sp), "its copy closed (the parent's would hold the lock)"
        assert e._spawn_fd is None and e._child is None and e.started == 0
        assert spreads[-1] == (0.0, ELECTION_RETRY_S) and e._next_try == clock.now + 2.5
        assert e._retry_s == ELECTION_RETRY_S and e._warned is False
        e._spawn_fd = fd = os.open(os.devnull, os.O_RDONLY)
        os.close(fd)
        e.after_fork_in_child()  # its copy already gone
        assert e._spawn_fd is None


def test_a_relative_spool_is_the_workloads_working_directory_at_start_for_the_shards_and_the_agent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the standalone agent is started in / (its own session, no hold on the workload's directory): a relative
    # --spool-dir would be read from /, an empty directory the workload never writes, and the shards themselves
    # would follow the workload's later chdir
    from outrider.hook.runtime import Hook
    from outrider.hook.settings import HookSettings
    monkeypatch.chdir(tmp_path)
    hook = Hook(HookSettings(spool_dir="spool", standalone=False))
    try:
        assert hook.spool_dir == str(tmp_path / "spool")
        assert hook.election.spool_dir == str(tmp_path / "spool")
        assert election.agent_command(hook.election.spool_dir, True, "", 42)[-2:] == ["--spool-dir",
                                                                                    str(tmp_path / "spool")]
    finally:
        hook.close(wait_s=0.0)


def test_a_relative_spool_with_no_working_directory_left_is_kept_as_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from outrider.hook.runtime import absolute_dir
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert absolute_dir("spool") == "spool"  # os.getcwd() raises FileNotFoundError: the hook must not
    assert absolute_dir("/abs/spool") == "/abs/spool"
    assert absolute_dir("") == ""
