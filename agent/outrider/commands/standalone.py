"""The standalone agent: the process a hooked workload starts when no agent serves its spool (`outrider standalone`).

Started by outrider/hook/election.py as `python -m outrider standalone --workload-pid PID --detach`, it is the
agent of every process publishing to the spool (all ranks of a job on the node, all workers of a server), in a
process of its own (decision 9): the workload holds none of its sockets, threads, descriptors or memory.

In order: it lowers its priority (nice 19, then SCHED_IDLE where the platform has it), raises its own soft
descriptor limit to the hard one (one descriptor per shard: 1,100 workers need more than a usual 1024), takes the
spool's lock (retrying briefly, since a hook's probe may hold it for microseconds; a second agent exits
spool.EXIT_ANOTHER_AGENT, at once and quietly), builds the agent (a configuration error or a listen address that is not
ours exits non-zero, which the starting hook logs once and backs off on), then detaches: it forks once and the
first process exits 0, so the agent is never a child of the workload. It serves until neither a publishing process
nor the starting process (known by pid and start time) has been alive for lifecycle.grace_s, then does a final
sweep and flush and exits.

Collectors: host, process (the starting workload's process tree, not the agent), hook, alerts, and self, which
measures this process (the agent's own, never the workload's). Alert rules are evaluated only if
OUTRIDER_RULE_FILES (or a config file) asks: by default alerting is left to a sidecar, `outrider run` or
Prometheus. Once the workload is gone the agent lets go of the stderr it inherited, so a pipe reading the
workload's output (`| tee`) ends with the workload.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Sequence

from outrider.ground.config import Config, LoadedConfig, load
from outrider.ground.logs import setup_logging
from outrider.kernel import procfs
from outrider.metrics.family import Family
from outrider.shared import spool
from outrider.wiring import lifecycle
from outrider.wiring.agent import Agent

LOG = logging.getLogger("outrider.standalone")
COLLECTORS = ("host", "process", "hook", "alerts", "self")
LOCK_WAIT_S = 2.0
NICEST = 19
MAX_DESCRIPTORS = 1 << 20


def standalone_config(loaded: LoadedConfig, spool_dir: str | None, listen: str | None) -> Config:
    """The agent's configuration from the environment it shares with the workload, with the standalone choices."""
    config = loaded.config
    rule_files = config.rule_files if loaded.sources["rule_files"] != "default" else ()
    # exit_when_workload_exits off: the standalone agent watches its workload itself (workload_watch).
    return dataclasses.replace(config, spool_dir=spool_dir or config.spool_dir, collectors=COLLECTORS,
                               listen=listen or config.listen, rule_files=rule_files, exit_when_workload_exits=False)


def _start_ticks(proc_root: str, pid: int) -> int | None:
    """The process's start time, which with its pid identifies it across pid reuse; None when it is gone."""
    try:
        st = procfs.read_proc_stat(proc_root, pid)
    except (OSError, ValueError, IndexError):
        return None
    return None if st.state in ("Z", "X") else st.start_ticks


def workload_watch(config: Config, workload_pid: int,
                   clock: Callable[[], float] = time.monotonic) -> lifecycle.WorkloadWatch:
    """What keeps the agent alive: the live publishing processes (any of the spool) and the starting process,
    known by pid and start time (a pid reused by another process after the workload exits keeps nothing alive).
    It counts as seen from the start: the workload was alive when it started the agent, and one that exits before
    the first sweep is still one the agent exits after."""
    publishers = lifecycle.live_processes(config.proc_root, ())
    identity = _start_ticks(config.proc_root, workload_pid) if workload_pid > 0 else None

    def live(families: Sequence[Family]) -> int:
        starter = identity is not None and _start_ticks(config.proc_root, workload_pid) == identity
        return publishers(families) + int(starter)

    watch = lifecycle.WorkloadWatch(live, lifecycle.grace_s(config.interval_s), clock=clock)
    watch.seen = True
    return watch


def lower_priority() -> None:
    """The lowest CPU priority the platform allows; each step may be refused (a container's seccomp, no
    SCHED_IDLE), which leaves the others."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, 0, NICEST)
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def raise_descriptor_limit(cap: int = MAX_DESCRIPTORS) -> None:
    """The soft descriptor limit up to the hard one (capped): the agent keeps shard descriptors and connections up
    to a quarter of it each, and it inherits the workload's soft limit (often 1024) while a job may have more
    publishing processes than that."""
    with contextlib.suppress(OSError, ValueError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def take_lock(spool_dir: str, private: bool, trusted_uids: frozenset[int], wait_s: float = LOCK_WAIT_S) -> int | None:
    """The spool's agent lock, retried for wait_s; None when another agent keeps it. A lock file another user
    planted is replaced (said), or spool.LockRefused raised where it cannot be."""
    spool.prepare_dir(spool_dir, private=private, trusted_uids=trusted_uids)
    mode = spool.PRIVATE_FILE_MODE if private else spool.shared_file_mode(spool_dir)
    deadline = time.monotonic() + wait_s
    while True:
        fd = spool.try_lock(spool_dir, trusted_uids=trusted_uids, mode=mode, notice=LOG.warning)
        if fd is not None or time.monotonic() >= deadline:
            return fd
        time.sleep(0.02)


def detach() -> bool:
    """Fork once; the parent exits 0 (telling the starting hook the agent holds the lock), the child goes on,
    reparented away from the workload. Refused when threads run (forking them is unsafe): then it stays a child."""
    if threading.active_count() > 1:
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() > 0:
        os._exit(0)
    return True


def release_stderr() -> None:
    """/dev/null in place of the inherited stderr (the workload's terminal or pipe)."""
    with contextlib.suppress(OSError):
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 2)
        os.close(fd)


def run(workload_pid: int, spool_dir: str | None, listen: str | None, detach_first: bool) -> int:
    lower_priority()
    raise_descriptor_limit()
    loaded = load()
    config = standalone_config(loaded, spool_dir, listen)
    setup_logging(config.log_level if loaded.sources["log_level"] != "default" else "warning")
    path = config.spool_dir or spool.default_dir()
    try:
        lock_fd = take_lock(path, not config.spool_dir, frozenset(config.spool_trusted_uids))
    except OSError as e:
        print(f"outrider: cannot use the spool {path}: {e}", file=sys.stderr)
        return 1
    if lock_fd is None:
        return spool.EXIT_ANOTHER_AGENT
    try:
        try:
            # the default address may be held (another job's agent): a free port then; one asked for, or none
            fallback = not listen and loaded.sources["listen"] == "default"
            agent = Agent(config, roots=(workload_pid,) if workload_pid > 0 else (), listen_fallback=fallback,
                          hold_spool_lock=False)
        except OSError as e:
            print(f"outrider: the agent for {path} could not start: {e.strerror or e}", file=sys.stderr)
            return 1
        if detach_first:
            detach()
        agent.sampler.ctx.exclude_pids = frozenset({os.getpid()})  # a descendant of the workload while attached
        watch = workload_watch(config, workload_pid)
        watch.on_empty = release_stderr
        agent.sampler.listeners.append(watch.on_sweep)
        agent.workload = watch  # run_until_signal stops the agent when it says the workload is gone
        print(f"outrider: no agent found on {path}; started one (pid {os.getpid()}) serving {agent.server.url}/metrics"
              f"; it exits after the last instrumented process", file=sys.stderr, flush=True)
        return agent.run_until_signal()
    finally:
        with contextlib.suppress(OSError):
            os.close(lock_fd)
