"""commands/standalone value by value, in process: the standalone agent's configuration, how it knows its starting
process (pid and start time, on a fixture /proc), its priority and descriptor limit, the spool's lock and its
retries, the detach, letting go of stderr, and run()'s every outcome (another agent serves: 3 and quiet; an unusable
spool or an agent that cannot start: 1 with the reason; served until the workload is gone: 0).

run() builds a real Agent on a real spool with a real listener; what would change this test process itself (its
priority, its logging, a fork, its stderr) is recorded instead, and the grace period is 0 so that a workload gone
ends it at its first sweep. The outcomes as a user sees them are tests/hook/test_standalone_life.py's and
tests/hook/test_process_model.py's (real workloads and agents).
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outrider.commands import standalone
from outrider.ground.config import Config, load
from outrider.metrics.family import Family
from outrider.shared import spool
from outrider.wiring import lifecycle
from outrider.wiring.agent import Agent
from tests.helpers import wait_until
from tests.hook.test_standalone_life import stat_line

STRANGER = 4321
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's files need root")


def proc_with(tmp_path: Path, pid: int, state: str = "S", start_ticks: int = 1000) -> Path:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "stat").write_text(stat_line(pid, start_ticks).replace(") S ", f") {state} ", 1))
    return proc


def free(sp: str) -> bool:
    fd = spool.try_lock(sp)
    if fd is None:
        return False
    os.close(fd)
    return True


# --- the configuration ----------------------------------------------------------------------------------------

def test_the_standalone_configuration_takes_the_workloads_settings_with_its_own_collectors_and_no_exit_watch() -> None:
    config = standalone.standalone_config(load(env={}), None, None)
    defaults = load(env={}).config
    assert config.collectors == ("host", "process", "hook", "alerts", "self") == standalone.COLLECTORS
    assert config.rule_files == () and config.exit_when_workload_exits is False
    assert (config.spool_dir, config.listen) == (defaults.spool_dir, defaults.listen)
    loaded = load(env={"OUTRIDER_RULE_FILES": "builtin", "OUTRIDER_SPOOL_DIR": "/from/env",
                       "OUTRIDER_LISTEN": "127.0.0.1:9", "OUTRIDER_EXIT_WHEN_WORKLOAD_EXITS": "true",
                       "OUTRIDER_INTERVAL_S": "2"})
    config = standalone.standalone_config(loaded, None, None)
    assert (config.rule_files, config.spool_dir, config.listen) == (("builtin",), "/from/env", "127.0.0.1:9")
    assert config.exit_when_workload_exits is False and config.interval_s == 2.0
    config = standalone.standalone_config(loaded, "/from/flag", "127.0.0.1:8")
    assert (config.spool_dir, config.listen) == ("/from/flag", "127.0.0.1:8")


# --- the starting process, by pid and start time --------------------------------------------------------------

@pytest.mark.parametrize(("state", "ticks"), [("S", 1000), ("R", 1000), ("D", 1000), ("Z", None), ("X", None)])
def test_a_process_is_known_by_its_start_time_until_it_is_a_zombie(tmp_path: Path, state: str,
                                                                  ticks: int | None) -> None:
    proc = proc_with(tmp_path, 4242, state)
    assert standalone._start_ticks(str(proc), 4242) == ticks


@pytest.mark.parametrize("text", ["", "4242 (python3\n", "4242 (python3) S 1 2\n", "4242 (python3) S x y z\n"])
def test_a_process_gone_or_unreadable_is_none(tmp_path: Path, text: str) -> None:
    proc = tmp_path / "proc"
    assert standalone._start_ticks(str(proc), 4242) is None, "gone"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "stat").write_text(text)
    assert standalone._start_ticks(str(proc), 4242) is None


HOOKED = [Family("outrider_hook_processes").add(2, "running")]


def test_what_keeps_the_agent_is_the_publishers_and_the_starting_process_itself(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, 4242)
    config = Config(proc_root=str(proc), interval_s=4.0)
    watch = standalone.workload_watch(config, 4242)
    assert watch.seen is True and watch.grace_s == 12.0 == lifecycle.grace_s(4.0)
    assert watch._live(HOOKED) == 3 and watch._live([]) == 1
    proc_with(tmp_path, 4242, "Z")
    assert watch._live(HOOKED) == 2, "a zombie is gone"
    proc_with(tmp_path, 4242, "S", start_ticks=5000)
    assert watch._live(HOOKED) == 2 and watch._live([]) == 0, "its pid reused by another process"


def test_a_workload_that_is_its_containers_pid_1_is_watched_too(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, 1)
    watch = standalone.workload_watch(Config(proc_root=str(proc), interval_s=1.0), 1)
    assert watch._live([]) == 1


def test_a_starting_process_gone_before_the_agent_looked_or_none_counts_for_nothing(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, 0)  # no process has pid 0: never looked at
    config = Config(proc_root=str(proc), interval_s=1.0)
    assert standalone.workload_watch(config, 0)._live(HOOKED) == 2
    watch = standalone.workload_watch(config, 4242)  # gone already
    proc_with(tmp_path, 4242)  # a later process with its pid
    assert watch._live(HOOKED) == 2 and watch.seen is True and watch.grace_s == 5.0


def test_the_watch_runs_on_the_clock_it_is_given(tmp_path: Path) -> None:
    now = [50.0]
    gone: list[bool] = []
    watch = standalone.workload_watch(Config(proc_root=str(tmp_path), interval_s=1.0), 0, clock=lambda: now[0])
    watch.on_gone = lambda: gone.append(True)
    watch.on_sweep([])
    now[0] = 54.9
    watch.on_sweep([])
    assert gone == []
    now[0] = 55.0
    watch.on_sweep([])
    assert gone == [True]


# --- priority and descriptors ---------------------------------------------------------------------------------

def test_the_priority_is_lowered_to_nice_19_then_sched_idle_and_each_refusal_leaves_the_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, tuple[Any, ...]]] = []

    def setpriority(*args: Any) -> None:
        calls.append(("nice", args))
        raise PermissionError("refused by seccomp")

    def sched_setscheduler(*args: Any) -> None:
        calls.append(("sched", args))

    monkeypatch.setattr(os, "setpriority", setpriority)
    monkeypatch.setattr(os, "sched_setscheduler", sched_setscheduler)
    standalone.lower_priority()
    assert calls == [("nice", (os.PRIO_PROCESS, 0, 19)), ("sched", (0, os.SCHED_IDLE, os.sched_param(0)))]
    monkeypatch.delattr(os, "SCHED_IDLE")  # a platform without it
    standalone.lower_priority()
    assert calls[2] == ("nice", (os.PRIO_PROCESS, 0, 19)) and len(calls) == 3


def test_a_platform_without_setpriority_or_refusing_sched_idle_leaves_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def sched_setscheduler(*args: Any) -> None:
        calls.append("sched")
        raise PermissionError("SCHED_IDLE refused")

    monkeypatch.delattr(os, "setpriority")
    monkeypatch.setattr(os, "sched_setscheduler", sched_setscheduler)
    standalone.lower_priority()
    assert calls == ["sched"]


@pytest.mark.parametrize(("limits", "cap", "set_to"), [
    ((1024, 4096), None, (4096, 4096)),
    ((1024, resource.RLIM_INFINITY), None, (1 << 20, resource.RLIM_INFINITY)),
    ((1024, 8192), 2048, (2048, 8192)),
    ((1024, 1025), 2048, (1025, 1025)),
    ((4096, 4096), None, None),  # already there
    ((2048, 8192), 2048, None),
    ((5000, 8192), 2048, None),  # never lowered
    ((resource.RLIM_INFINITY, resource.RLIM_INFINITY), None, None),
])
def test_the_soft_descriptor_limit_is_raised_to_the_hard_one_capped(
        monkeypatch: pytest.MonkeyPatch, limits: tuple[int, int], cap: int | None,
        set_to: tuple[int, int] | None) -> None:
    asked: list[int] = []
    made: list[tuple[int, tuple[int, int]]] = []

    def getrlimit(which: int) -> tuple[int, int]:
        asked.append(which)
        return limits

    monkeypatch.setattr(resource, "getrlimit", getrlimit)
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: made.append((which, value)))
    if cap is None:
        standalone.raise_descriptor_limit()
    else:
        standalone.raise_descriptor_limit(cap)
    assert asked == [resource.RLIMIT_NOFILE]
    assert made == ([] if set_to is None else [(resource.RLIMIT_NOFILE, set_to)])


@pytest.mark.parametrize("error", [ValueError("not permitted"), PermissionError("refused")])
def test_a_descriptor_limit_that_cannot_be_read_or_raised_is_left(monkeypatch: pytest.MonkeyPatch,
                                                                  error: Exception) -> None:
    def refused(*args: Any) -> Any:
        raise error

    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", refused)
    standalone.raise_descriptor_limit()
    monkeypatch.setattr(resource, "getrlimit", refused)
    standalone.raise_descriptor_limit()


# --- the spool's lock -----------------------------------------------------------------------------------------

class FakeTime:
    """standalone's clock and sleep: each sleep moves the clock on by what it asked and calls `on_sleep`."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []
        self.on_sleep = lambda: None

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s
        self.on_sleep()


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    t = FakeTime()
    monkeypatch.setattr(standalone, "time", t)
    return t


def test_the_default_spool_and_its_lock_are_private_a_configured_ones_lock_is_readable(tmp_path: Path) -> None:
    private = tmp_path / "private"
    fd = standalone.take_lock(str(private), True, frozenset())
    assert fd is not None and not free(str(private))
    os.close(fd)
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(private / "agent.lock").st_mode) == 0o600
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755 | stat.S_ISGID)
    fd = standalone.take_lock(str(shared), False, frozenset())
    assert fd is not None
    os.close(fd)
    assert stat.S_IMODE(os.stat(shared / "agent.lock").st_mode) == 0o640
    with pytest.raises(OSError, match="open to other users"):
        standalone.take_lock(str(shared), True, frozenset())


def test_a_held_lock_is_retried_every_20_ms_until_the_wait_is_over(tmp_path: Path, fake_time: FakeTime) -> None:
    sp = str(tmp_path)
    held = spool.try_lock(sp)
    assert held is not None
    try:
        assert standalone.take_lock(sp, False, frozenset(), wait_s=0.0) is None and fake_time.slept == []
        assert standalone.take_lock(sp, False, frozenset(), wait_s=0.09) is None
        assert fake_time.slept == [0.02] * 5, "tries at 0, 20, 40, 60, 80 and 100 ms"
        assert standalone.LOCK_WAIT_S == 2.0
        fake_time.slept.clear()
        assert standalone.take_lock(sp, False, frozenset()) is None
        assert 2.0 <= sum(fake_time.slept) < 2.0 + 2 * 0.02, "two seconds of tries by default"
    finally:
        os.close(held)


def test_a_lock_let_go_during_the_wait_is_taken(tmp_path: Path, fake_time: FakeTime) -> None:
    sp = str(tmp_path)
    held = [spool.try_lock(sp)]

    def let_go() -> None:  # the hook's probe ends
        if held[0] is not None:
            os.close(held[0])
            held[0] = None

    fake_time.on_sleep = let_go
    fd = standalone.take_lock(sp, False, frozenset(), wait_s=60.0)
    assert fd is not None and fake_time.slept == [0.02]
    os.close(fd)


@needs_root
def test_a_planted_lock_is_replaced_and_said_and_a_trusted_uids_is_used(tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    sp.mkdir()
    lock = sp / "agent.lock"
    lock.write_text("")
    os.chown(lock, STRANGER, STRANGER)
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("outrider.standalone").addHandler(handler)
    try:
        fd = standalone.take_lock(str(sp), False, frozenset({STRANGER}))
        assert fd is not None and said == [] and os.stat(lock).st_uid == STRANGER
        os.close(fd)
        fd = standalone.take_lock(str(sp), False, frozenset())
        assert fd is not None and os.stat(lock).st_uid == 0
        os.close(fd)
    finally:
        logging.getLogger("outrider.standalone").removeHandler(handler)
    assert len(said) == 1 and f"owned by uid {STRANGER}, which is not trusted" in said[0]


# --- detach and stderr ----------------------------------------------------------------------------------------

class Exited(Exception):
    pass


@pytest.fixture
def fork(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """os.fork and os._exit recorded: the test's process is never forked nor ended."""
    calls: list[str] = []

    def _exit(code: int) -> None:
        calls.append(f"exit {code}")
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", _exit)
    return calls


@pytest.mark.parametrize(("threads", "forked_pid", "result", "calls"), [
    (2, 0, False, []),  # threads run: never forked
    (5, 0, False, []),
    (1, 0, True, ["fork"]),  # the child goes on
    (1, 4242, None, ["fork", "exit 0"]),  # the parent exits 0
])
def test_detach_forks_once_where_no_thread_runs_and_the_parent_exits_0(
        monkeypatch: pytest.MonkeyPatch, fork: list[str], threads: int, forked_pid: int, result: bool | None,
        calls: list[str]) -> None:
    monkeypatch.setattr(threading, "active_count", lambda: threads)

    def fake_fork() -> int:
        fork.append("fork")
        return forked_pid

    monkeypatch.setattr(os, "fork", fake_fork)
    if result is None:
        with pytest.raises(Exited):
            standalone.detach()
    else:
        assert standalone.detach() is result
    assert fork == calls


def test_detach_for_real_leaves_a_child_of_no_one_here(tmp_path: Path) -> None:
    out = tmp_path / "child"
    code = ("import os, sys\nfrom outrider.commands.standalone import detach\n"
            f"print('before', flush=False)\nif detach():\n    open({str(out)!r}, 'w').write(str(os.getppid()))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert (r.returncode, r.stdout, r.stderr) == (0, "before\n", "")
    wait_until(lambda: out.exists() and out.read_text(), timeout_s=60, what="the detached child's line")
    assert int(out.read_text()) != os.getpid()


@pytest.fixture
def stderr_kept() -> Iterator[None]:
    saved = os.dup(2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def test_stderr_is_let_go_for_dev_null(stderr_kept: None) -> None:
    before = set(os.listdir("/proc/self/fd"))
    standalone.release_stderr()
    assert os.readlink("/proc/self/fd/2") == os.devnull
    assert set(os.listdir("/proc/self/fd")) == before


def test_stderr_that_cannot_be_let_go_is_kept(stderr_kept: None, monkeypatch: pytest.MonkeyPatch) -> None:
    was = os.readlink("/proc/self/fd/2")

    def refused(*args: Any) -> int:
        raise OSError("no /dev/null in this container")

    monkeypatch.setattr(os, "open", refused)
    standalone.release_stderr()
    assert os.readlink("/proc/self/fd/2") == was


# --- run() ----------------------------------------------------------------------------------------------------

class Run:
    """run() with what would change this process recorded, and the Agents it built."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        self.calls: list[str] = []
        self.agents: list[tuple[Agent, dict[str, Any]]] = []
        self.capsys = capsys
        for name in [k for k in os.environ if k.startswith("OUTRIDER_")]:
            monkeypatch.delenv(name)
        monkeypatch.setattr(standalone, "lower_priority", lambda: self.calls.append("lower_priority"))
        monkeypatch.setattr(standalone, "raise_descriptor_limit", lambda: self.calls.append("raise_descriptors"))
        monkeypatch.setattr(standalone, "setup_logging", lambda level: self.calls.append(f"logging {level}"))
        monkeypatch.setattr(standalone, "detach", lambda: self.calls.append("detach"))
        monkeypatch.setattr(standalone, "release_stderr", lambda: self.calls.append("release_stderr"))
        monkeypatch.setattr(lifecycle, "grace_s", lambda interval_s: 0.0)
        built = self.agents

        class Recorded(Agent):
            def __init__(self, config: Config, **kwargs: Any) -> None:
                super().__init__(config, **kwargs)
                built.append((self, kwargs))

        monkeypatch.setattr(standalone, "Agent", Recorded)

    def __call__(self, workload_pid: int, spool_dir: str | None, listen: str | None,
                 detach_first: bool = False) -> tuple[int, str]:
        code = standalone.run(workload_pid, spool_dir, listen, detach_first)
        return code, self.capsys.readouterr().err


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    return Run(monkeypatch, capsys)


def gone_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", ""])
    p.wait()
    return p.pid


def test_served_until_the_workload_is_gone_and_said_where(run: Run, tmp_path: Path) -> None:
    sp = str(tmp_path / "spool")
    pid = gone_pid()
    code, err = run(pid, sp, "127.0.0.1:0")
    assert code == 0
    [(agent, kwargs)] = run.agents
    assert kwargs == {"roots": (pid,), "listen_fallback": False, "hold_spool_lock": False}
    assert err.splitlines()[-1] == (f"outrider: no agent found on {sp}; started one (pid {os.getpid()}) serving "
                                    f"{agent.server.url}/metrics; it exits after the last instrumented process")
    assert run.calls == ["lower_priority", "raise_descriptors", "logging warning", "release_stderr"]
    assert agent.config.spool_dir == sp and agent.config.collectors == standalone.COLLECTORS
    assert agent.sampler.ctx.exclude_pids == frozenset({os.getpid()})
    watch = agent.workload
    assert isinstance(watch, lifecycle.WorkloadWatch) and watch.gone and watch.seen
    assert watch.on_sweep in agent.sampler.listeners
    assert free(sp), "the lock is let go"
    assert stat.S_IMODE(os.stat(sp).st_mode) == 0o700 and stat.S_IMODE(os.stat(f"{sp}/agent.lock").st_mode) == 0o644


def test_detached_first_when_asked_and_the_log_level_set_is_kept(run: Run, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTRIDER_LOG_LEVEL", "error")
    code, _ = run(0, str(tmp_path / "spool"), "127.0.0.1:0", detach_first=True)
    assert code == 0
    assert run.calls == ["lower_priority", "raise_descriptors", "logging error", "detach", "release_stderr"]
    assert run.agents[0][1]["roots"] == ()


def test_a_workload_that_is_pid_1_is_the_agents_root(run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container's first process; here a fixture /proc where it is already gone, so the agent ends at once."""
    (tmp_path / "proc").mkdir()
    monkeypatch.setenv("OUTRIDER_PROC_ROOT", str(tmp_path / "proc"))
    assert run(1, str(tmp_path / "spool"), "127.0.0.1:0")[0] == 0
    assert run.agents[0][1]["roots"] == (1,)


def test_only_the_default_address_falls_back_to_a_free_port(run: Run, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    run(0, str(tmp_path / "a"), None)
    monkeypatch.setenv("OUTRIDER_LISTEN", "127.0.0.1:0")
    run(0, str(tmp_path / "b"), None)
    assert [kwargs["listen_fallback"] for _, kwargs in run.agents] == [True, False]


def test_the_default_spool_is_made_private(run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sp = tmp_path / "default"
    monkeypatch.setattr(spool, "default_dir", lambda: str(sp))
    code, err = run(0, None, "127.0.0.1:0")
    assert code == 0 and f"no agent found on {sp};" in err
    assert stat.S_IMODE(os.stat(sp / "agent.lock").st_mode) == 0o600 and free(str(sp))


def test_another_agent_serving_is_exit_3_and_quiet(run: Run, tmp_path: Path, fake_time: FakeTime) -> None:
    sp = str(tmp_path)
    held = spool.try_lock(sp)
    assert held is not None
    try:
        assert run(0, sp, "127.0.0.1:0") == (spool.EXIT_ANOTHER_AGENT, "")
        assert 2.0 <= sum(fake_time.slept) < 2.0 + 2 * 0.02, "after the whole wait"
    finally:
        os.close(held)
    assert run.agents == []


def test_an_unusable_spool_is_exit_1_with_the_reason(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "a-file"
    path.write_text("")
    assert run(0, str(path), "127.0.0.1:0") == (
        1, f"outrider: cannot use the spool {path}: [Errno 20] spool {path} is not a directory\n")
    assert run.agents == []


@needs_root
def test_a_configured_spool_of_a_trusted_uid_is_used(run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sp = tmp_path / "spool"
    sp.mkdir()
    os.chown(sp, STRANGER, STRANGER)
    code, err = run(0, str(sp), "127.0.0.1:0")
    assert code == 1 and "which is not trusted" in err
    monkeypatch.setenv("OUTRIDER_SPOOL_TRUSTED_UIDS", str(STRANGER))
    assert run(0, str(sp), "127.0.0.1:0")[0] == 0


def test_an_agent_that_cannot_listen_is_exit_1_with_the_reason_and_the_lock_let_go(run: Run, tmp_path: Path) -> None:
    sp = str(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run(0, sp, f"127.0.0.1:{port}")
    assert code == 1 and run.agents == []
    assert err == (f"outrider: the agent for {sp} could not start: cannot listen on 127.0.0.1:{port}: Address already "
                   "in use: another process holds it and would answer the scrapes meant for this agent; stop it, or "
                   "listen elsewhere\n")
    assert free(sp)
