"""Standalone mode: with no agent on the spool, a hooked process starts one as a separate process (decision 9).

Nothing of the agent runs in the workload. Every ELECTION_RETRY_S the publisher thread checks whether an agent
holds the spool's lock (agent.lock); when none does, and no other process of the job is already starting one
(spawn.lock, held until the start is settled), it starts `python -m outrider standalone` with the standard
library's subprocess: a new session, no descriptor of the workload but stderr (so the agent's "serving ..." line
reaches the user), stdin and stdout on /dev/null. That process lowers its own priority to the lowest the platform
allows (nice 19, SCHED_IDLE), takes agent.lock itself (a loser of a race exits at once with
spool.EXIT_ANOTHER_AGENT), detaches (so it is never the workload's child: no zombie, nothing for the workload's own
wait() to reap), and exits after the last publishing process is gone (outrider/commands/standalone.py).

A failed start (exit status other than 0 or spool.EXIT_ANOTHER_AGENT) is logged once and retried with a doubling
back-off up to MAX_RETRY_S. Nothing here raises into the workload, and this module imports nothing of the agent.

Thread limits: the agent's threads count against the same limits as the workload's (RLIMIT_NPROC counts every
thread of the user, a pids cgroup every thread in it). The agent is not started where it would take slots the
workload may need: only while, after its AGENT_TASKS, at least half the tightest limit (and MIN_FREE_TASKS) would
still be free (task_headroom). Otherwise the hook says why once, and looks again with the failure's back-off
(a job that ends threads makes room). Under `ulimit -u 30`, a workload that starts 28 threads alone started 18 with
the standalone agent beside it (and 25 with the hook's three threads, one now).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from outrider.hook import native
from outrider.kernel import cgroupfs, procfs
from outrider.shared import spool

LOG = logging.getLogger("outrider.hook")
ELECTION_RETRY_S = 5.0
MAX_RETRY_S = 600.0
# How long this process keeps other processes of the job from starting an agent while the one it started has
# neither settled (taken the lock and detached, or found another agent) nor exited.
SPAWN_TIMEOUT_S = 60.0
SPAWN_LOCK_NAME = "spawn.lock"
AGENT_COMMAND = "standalone"  # `outrider standalone` (outrider/commands/cli.py)
AGENT_TASKS = 8  # the standalone agent's threads: main, sweep, HTTP server and its 4 workers (7 measured), + 1
MIN_FREE_TASKS = 64


def task_headroom(proc_root: str = "/proc", sys_root: str = "/sys") -> tuple[int, int, str] | None:
    """(free, limit, what) for the tightest limit on the threads this process and its children may start: the
    user's RLIMIT_NPROC (not enforced for root) and the pids cgroup's; None where neither limits."""
    found: list[tuple[int, int, str]] = []
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != resource.RLIM_INFINITY and os.getuid() != 0:
            used = procfs.tasks_of_user(proc_root, os.getuid())
            found.append((soft - used, soft, f"ulimit -u {soft}: this user runs {used} threads"))
    except (ImportError, OSError, ValueError):
        pass
    pids = cgroupfs.pids_limit(proc_root, sys_root)
    if pids is not None:
        found.append((pids.limit - pids.current, pids.limit,
                      f"the pids cgroup allows {pids.limit}: {pids.current} in use"))
    return min(found) if found else None


def room_for_agent(headroom: tuple[int, int, str] | None) -> bool:
    """Whether starting the agent leaves the workload at least half its limit, and MIN_FREE_TASKS, free."""
    if headroom is None:
        return True
    free, limit, _ = headroom
    return free - AGENT_TASKS >= max(MIN_FREE_TASKS, limit // 2)


def agent_serving(spool_dir: str, trusted_uids: frozenset[int] = frozenset(), mode: int = spool.PRIVATE_FILE_MODE,
                  notice: Callable[[str], None] | None = None) -> bool:
    """Whether an agent holds the spool's lock. The probe holds the lock for a few microseconds when it is free;
    an agent starting at that instant retries for a while (standalone.take_lock). A lock file planted by another
    user is replaced (`notice` told), or spool.LockRefused raised where it cannot be."""
    fd = spool.try_lock(spool_dir, trusted_uids=trusted_uids, mode=mode, notice=notice)
    if fd is None:
        return True
    os.close(fd)
    return False


def try_spawn_lock(spool_dir: str, trusted_uids: frozenset[int] = frozenset(), mode: int = spool.PRIVATE_FILE_MODE,
                   notice: Callable[[str], None] | None = None) -> int | None:
    """The job-wide right to start an agent now (flock on spawn.lock, released with the descriptor); None when
    another process has it. Opened as the agent lock is (spool.try_lock): a planted one replaced, or refused."""
    return spool.try_lock(spool_dir, SPAWN_LOCK_NAME, trusted_uids=trusted_uids, mode=mode, notice=notice)


def agent_command(spool_dir: str, explicit: bool, listen: str, workload_pid: int) -> list[str]:
    cmd = [sys.executable, "-m", "outrider", AGENT_COMMAND, "--workload-pid", str(workload_pid), "--detach"]
    if explicit:  # the default spool is the agent's default too; passing it would make it a "configured" one
        cmd += ["--spool-dir", spool_dir]
    if listen:
        cmd += ["--listen", listen]
    return cmd


def agent_environment() -> dict[str, str]:
    """The workload's environment (the agent reads the same OUTRIDER_* settings), with this copy of outrider first
    on the path: the agent must be the same version as the hook, wherever the workload found it."""
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # hook/ < outrider/
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = package_root + (os.pathsep + path if path else "")
    return env


def python_interpreter() -> str | None:
    """sys.executable when it is a Python interpreter; an embedding program (uWSGI, a C++ host) has its own
    binary there, which must not be started with `-m outrider`."""
    exe = sys.executable
    name = os.path.basename(exe or "")
    if exe and name.startswith(("python", "pypy")) and os.access(exe, os.X_OK):
        return exe
    return None


class SpawnedAgent:
    """The agent's process started with posix_spawn, where a green-thread library patched subprocess or os: gevent's
    Popen waits in its hub (its child watchers work on the main thread's loop only) and breaks the standard
    library's Popen it leaves behind. The same start as Popen's: a new session, stdin and stdout on /dev/null,
    stderr the workload's, no other descriptor. One difference: Python's posix_spawn has no change of directory,
    so this agent keeps the workload's working directory (Popen's starts in /); the spool path it is given is
    absolute either way (hook.runtime.absolute_dir)."""

    def __init__(self, exe: str, command: list[str]) -> None:
        actions: list[tuple[Any, ...]] = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                           (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            with contextlib.suppress(OSError):
                if fd > 2 and os.get_inheritable(fd):
                    actions.append((os.POSIX_SPAWN_CLOSE, fd))
        env = agent_environment()
        # the interpreter path is absolute, and -m outrider finds the package on PYTHONPATH
        spawn = native.original("os", "posix_spawn")  # gevent wraps it in a child watcher of its loop
        self.pid = spawn(exe, command, env, file_actions=actions, setsid=True)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        waitpid = native.original("os", "waitpid")
        try:
            pid, status = waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by the green library's child watcher: it ended, how is unknown
            self.returncode = 0
            return 0
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class Election:
    def __init__(self, spool_dir: str, listen: str, explicit: bool, trusted_uids: frozenset[int]) -> None:
        self.spool_dir = spool_dir
        self.listen = listen
        self.explicit = explicit
        self.trusted_uids = trusted_uids
        self.started = 0  # agents this process started
        self._child: subprocess.Popen[bytes] | SpawnedAgent | None = None
        self._spawn_fd: int | None = None
        self._spawned_at = 0.0
        self._next_try = 0.0
        self._retry_s = ELECTION_RETRY_S
        self._warned = False
        self._said_replaced: set[str] = set()
        self.no_room = 0  # times the agent was not started for want of free threads

    def maybe_start_agent(self) -> None:
        """Called by the publisher thread every flush; does something every ELECTION_RETRY_S at most."""
        now = time.monotonic()
        if self._child is not None:
            self._settle(now)
            return
        if now < self._next_try:
            return
        self._next_try = now + self._retry_s * random.uniform(1.0, 1.2)  # spread the probes of many processes
        try:
            spool.prepare_dir(self.spool_dir, private=not self.explicit, trusted_uids=self.trusted_uids)
            mode = spool.shared_file_mode(self.spool_dir) if self.explicit else spool.PRIVATE_FILE_MODE
            if agent_serving(self.spool_dir, self.trusted_uids, mode, self._replaced):
                return
            fd = try_spawn_lock(self.spool_dir, self.trusted_uids, mode, self._replaced)
            if fd is None:
                return  # another process of this job is starting the agent
            if agent_serving(self.spool_dir, self.trusted_uids, mode, self._replaced):  # one started meanwhile
                os.close(fd)
                return
        except spool.LockRefused as e:  # a lock another user planted: no agent can own the spool until it goes
            self._failed(str(e))
            return
        except OSError:
            return  # the publisher says why the spool is unusable
        exe = python_interpreter()
        if exe is None:
            os.close(fd)
            self._failed(f"{sys.executable!r} is not a Python interpreter; run `outrider agent` beside it")
            return
        headroom = task_headroom()
        if not room_for_agent(headroom):
            os.close(fd)
            assert headroom is not None
            self.no_room += 1
            self._failed(f"it would take {AGENT_TASKS} of the {headroom[0]} threads this job may still start "
                         f"({headroom[2]}), which the workload may need; run `outrider agent` beside the job or "
                         "raise the limit")
            return
        try:
            command = agent_command(self.spool_dir, self.explicit, self.listen, os.getpid())
            if native.patched("subprocess") or native.patched("os"):
                self._child = SpawnedAgent(exe, command)
            else:
                self._child = subprocess.Popen(
                    command, executable=exe, env=agent_environment(), stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=None, close_fds=True, start_new_session=True, cwd="/")
        except Exception as e:  # OSError, a bad value, whatever a patched library raises: never the flush's
            os.close(fd)
            self._failed(str(e))
            return
        self._spawn_fd = fd
        self._spawned_at = now
        self.started += 1

    def _settle(self, now: float) -> None:
        """The started process exits once it holds the lock and has detached (0), or found an agent (3)."""
        assert self._child is not None
        code = self._child.poll()
        if code is None:
            if now - self._spawned_at < SPAWN_TIMEOUT_S:
                return
            # It could not detach (it is the agent itself, a child of ours) or its start is hung: let go, and look
            # again after a longer while (a hung start must not become one new process a minute); the subprocess
            # module reaps it whenever it ends.
            self._child = None
            self._release()
            self._failed(f"it has not settled after {SPAWN_TIMEOUT_S:g} s")
            return
        self._child = None
        self._release()
        if code in (0, spool.EXIT_ANOTHER_AGENT):
            self._retry_s, self._warned = ELECTION_RETRY_S, False
            self._next_try = now + ELECTION_RETRY_S
        else:
            self._failed(f"it exited with status {code}")

    def _replaced(self, what: str) -> None:
        """A lock file another user planted in the spool was replaced: said once per lock, since it was what kept
        agents out."""
        if what not in self._said_replaced and len(self._said_replaced) < 8:
            self._said_replaced.add(what)
            LOG.warning("outrider: %s", what)

    def _failed(self, why: str) -> None:
        self._retry_s = min(MAX_RETRY_S, self._retry_s * 2)
        self._next_try = time.monotonic() + self._retry_s
        if not self._warned:
            LOG.warning("outrider: could not start an agent for the spool %s (%s); metrics are still published "
                        "there, and the start is retried with back-off", self.spool_dir, why)
        self._warned = True

    def _release(self) -> None:
        if self._spawn_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._spawn_fd)
            self._spawn_fd = None

    def stop(self) -> None:
        """At exit: the spawn lock goes; the agent, a process of its own, stops by itself once we are gone."""
        self._release()

    def after_fork_in_child(self) -> None:
        """The child holds nothing of the parent's start: closing its copy of the spawn lock's descriptor leaves
        the lock with the parent (flock locks belong to the open file), and the started process is not its child.
        Its first look is spread over one retry period, so a thousand forked workers do not probe at once."""
        if self._spawn_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._spawn_fd)
            self._spawn_fd = None
        self._child = None
        self.started = 0
        self._next_try = time.monotonic() + random.uniform(0.0, ELECTION_RETRY_S)
        self._retry_s, self._warned = ELECTION_RETRY_S, False
