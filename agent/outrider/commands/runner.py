"""`outrider run -- CMD ...`: start CMD, watch it and all its descendants for its whole life, forward signals,
serve /metrics while it runs, and exit with CMD's exit code after a short summary.

How:
- CMD is started with posix_spawnp from an argument list: never through a shell.
- Outrider makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so descendants whose parent exits
  (daemonised helpers, data-loader workers orphaned by a crash) are re-parented to it and stay in the watched
  tree; it reaps them.
- Signals are handled synchronously: the main thread blocks them (every agent thread inherits the mask) and
  takes them with sigtimedwait, which says who sent each one. A SIGINT sent by the kernel (Ctrl-C at the
  terminal) already reached CMD through the shared process group and is not sent twice; any other SIGINT,
  SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2 is forwarded to CMD. CMD starts with an empty signal mask.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import resource
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from outrider.ground import peaks
from outrider.ground.config import Config, hook_environment
from outrider.kernel import cgroupfs, procfs
from outrider.kernel.cgroupfs import within
from outrider.kernel.kmsg import KernelLog
from outrider.metrics import units
from outrider.metrics.family import Family
from outrider.rules.notification import Notification
from outrider.runs.measured import Measured, measure
from outrider.runs.recorder import RunRecorder
from outrider.runs.store import AlertRecord, RunStore
from outrider.runs.verdict import RunVerdict, Segment, timeline_text
from outrider.wiring.agent import Agent

LOG = logging.getLogger("outrider.run")

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# taken by sigtimedwait on the main thread, blocked on every other
WAITED = frozenset({*FORWARDED, signal.SIGCHLD})
PR_SET_CHILD_SUBREAPER = 36


@dataclass
class RunSummary:
    command: list[str]
    pid: int
    exit_code: int
    signal: str | None  # the signal that ended CMD, if one did
    wall_s: float
    cpu_user_s: float
    cpu_system_s: float
    peak_tree_rss_bytes: int
    peak_process_rss_bytes: int
    read_bytes: int
    written_bytes: int
    max_processes: int
    signals_forwarded: list[str]
    metrics_url: str
    run_id: str = ""
    started: float = 0.0  # unix seconds
    measured: Measured = field(default_factory=Measured)  # what the hook measured, over the whole run
    oom_kills: int = 0  # processes the kernel's OOM killer ended during the run (this cgroup's, else the host's)
    oom_scope: str = ""  # where that count comes from: "cgroup" (the run's memory cgroup) or "host" (/proc/vmstat)
    oom_counter: str = ""  # the file that counted: memory.events (v2), memory.oom_control (v1), /proc/vmstat
    # the kernel log's names of the run's OOM-killed processes, where it is readable: "python3 (pid 18855) in memory
    # cgroup /a/b"
    oom_victims: list[str] = field(default_factory=list)
    alerts: list[AlertRecord] = field(default_factory=list)  # fired during the run (and resolved, or not)
    # fired before the run (restored from the agent's saved alert state) and resolved during it: not this run's
    carried_over: list[AlertRecord] = field(default_factory=list)
    verdict: RunVerdict = field(default_factory=lambda: RunVerdict("", "", {}))
    timeline: list[Segment] = field(default_factory=list)

    @property
    def oom_killed(self) -> bool:
        """CMD itself died of SIGKILL while the kernel's OOM killer struck (exit 137, and the run's cgroup's or the
        host's oom_kill rose)."""
        return self.signal == "SIGKILL" and self.oom_kills > 0

    def _oom_evidence(self) -> str:
        where = (f"this cgroup's {self.oom_counter or 'memory.events'}" if self.oom_scope == "cgroup"
                 else "the host's /proc/vmstat")
        named = f"; the kernel log: {', '.join(self.oom_victims[:3])}" if self.oom_victims else ""
        return f"oom_kill +{self.oom_kills} in {where}{named}"

    def text(self) -> str:
        """The end-of-run summary: what the run cost, what the agent measured, and last the verdict with its
        evidence. The demo prints the same; the report shows the same numbers."""
        cores = (self.cpu_user_s + self.cpu_system_s) / self.wall_s if self.wall_s > 0 else 0.0
        how = (f"exited with code {self.exit_code}" if self.signal is None
               else f"ended by signal {self.signal} (exit code {self.exit_code})")
        if self.oom_killed:
            how += f": OOM-killed ({self._oom_evidence()})"
        lines = [
            f"outrider: {' '.join(self.command)} {how} after {units.seconds(self.wall_s)}",
            f"  cpu        user {units.seconds(self.cpu_user_s)}, system {units.seconds(self.cpu_system_s)} "
            f"({units.cores(cores)} on average)",
            f"  memory     peak RSS {units.bytes_iec(self.peak_tree_rss_bytes)} (whole tree, sampled), "
            f"largest process {units.bytes_iec(self.peak_process_rss_bytes)}",
            f"  storage    read {units.bytes_iec(self.read_bytes)}, written {units.bytes_iec(self.written_bytes)}",
            f"  processes  up to {self.max_processes} at once",
        ]
        if self.oom_kills and not self.oom_killed:
            lines.append(f"  oom        {self._oom_evidence()}: a process of the run (a worker?) was OOM-killed")
        if self.run_id:
            lines.append(f"  record     {self.run_id}: outrider report {self.run_id}")
        lines += ["", "what the agent measured:"]
        lines += [f"  {topic:<10} {text}" for topic, text in self.measured.rows()]
        for topic, text in self.measured.profile_rows():
            lines += _wrapped(topic, [text], "")
        for i, alert in enumerate([a.text(self.started) for a in self.alerts] or ["none fired"]):
            lines += _wrapped("" if i else "alerts", [alert], "")
        if self.carried_over:  # their resolve went out during the run: said, apart, so that it is not a mystery
            lines += _wrapped("", ["carried over from before this run (the agent's saved alert state), not this "
                                   "run's: " + "; ".join(a.text(self.started) for a in self.carried_over)], "")
        v = self.verdict
        if self.oom_killed:  # what ended the run comes first; how it ran until then is the windows' verdict
            lines += ["", f"verdict: OOM-killed by the kernel ({self._oom_evidence()}): see the memory alerts and "
                          "the peak RSS above; the container's limit or a leak",
                      f"  {'until then':<10} {v.headline()}"]
        else:
            lines += ["", f"verdict: {v.headline()}"]
        if v.cls:
            if v.reason:
                lines.append(f"  {'why':<10} {v.reason}")
            lines += _wrapped("evidence", [f"{label} {value}" for label, value in v.evidence_rows()], ", ")
            if self.timeline:
                lines += _wrapped("timeline", [timeline_text(self.timeline, self.started)], "")
            lines += _wrapped("advice", [v.recommendation], "")
        return "\n".join(lines)


def _wrapped(topic: str, items: list[str], sep: str, width: int = 118) -> list[str]:
    """`  topic      item, item, ...` wrapped under itself."""
    return textwrap.wrap(sep.join(items), width, initial_indent=f"  {topic:<10} ", subsequent_indent=" " * 13,
                         break_on_hyphens=False)


class OomWatch:
    """The kernel's OOM kills during the run: the run's memory cgroup's counter and the host's, read before CMD
    starts and after it ends, and the kernel log's lines in between (kmsg_path, where readable).

    The cgroup's count is its subtree's (v2 memory.events counts the cgroups below; on v1 the counters of the live
    cgroups below are added, so a command that moves itself into a child cgroup is counted). The log names the
    killed processes of the run: CMD's pid, or any process charged to the run's cgroup or one below it (only where
    the hierarchy is the host's, whose paths and pids the kernel writes: not inside a container's namespaces).
    """

    def __init__(self, config: Config) -> None:
        self._config = config
        self._cgroup: cgroupfs.MemoryCgroup | None = None
        self._scope: str | None = None  # the run's cgroup, relative to the hierarchy's root (a host view only)
        with contextlib.suppress(OSError, ValueError):
            self._cgroup = cgroupfs.find_memory_cgroup(config.proc_root, config.sys_root)
            hierarchy = cgroupfs.memory_hierarchy(config.sys_root)
            if self._cgroup is not None and hierarchy is not None and cgroupfs.is_kernel_root(hierarchy) \
                    and hierarchy.version == self._cgroup.version:
                rel = os.path.relpath(self._cgroup.path, hierarchy.path)
                self._scope = "/" if rel == "." else "/" + rel
        self.before = self.counts()
        self._log = KernelLog(config.kmsg_path) if config.kmsg_path else None
        if self._log is not None and not self._log.open():
            LOG.debug("the kernel log %s is not readable (%s): OOM kills are counted, not named", self._log.path,
                      self._log.error)

    def counts(self) -> tuple[int | None, int | None]:
        """The kernel's OOM-kill counters now: (the run's memory cgroup and those below it, the host); None where
        unreadable."""
        cgroup = host = None
        with contextlib.suppress(OSError, ValueError):
            cgroup = cgroupfs.subtree_oom_kills(self._cgroup) if self._cgroup is not None else None
        with contextlib.suppress(OSError, ValueError):
            host = procfs.read_vmstat(self._config.proc_root, keys=("oom_kill",)).get("oom_kill")
        return cgroup, host

    def finish(self, child: int) -> tuple[int, str, str, list[str]]:
        """(kills during the run, scope, the file that counted them, the log's names of the run's victims)."""
        kills, scope = _oom_kills_during(self.before, self.counts())
        counter = ""
        if scope == "cgroup" and self._cgroup is not None:
            counter = cgroupfs.OOM_KILL_FILE[self._cgroup.version]
        elif scope == "host":
            counter = "/proc/vmstat"
        victims: list[str] = []
        if self._log is not None and self._scope is not None:  # the log's paths and pids are the host's
            summaries, killed = self._log.oom_kills()
            self._log.close()
            memcg = {r.pid: r.memcg for r in summaries}
            for rec in killed or summaries:
                where = rec.memcg or memcg.get(rec.pid)
                if rec.pid == child or self._within_run(where):
                    victims.append(f"{rec.task} (pid {rec.pid})" + (f" in memory cgroup {where}" if where else ""))
        return kills, scope, counter, victims

    def _within_run(self, memcg: str | None) -> bool:
        return self._scope is not None and memcg is not None and within(memcg, self._scope)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()


def _oom_kills_during(before: tuple[int | None, int | None], after: tuple[int | None, int | None]
                      ) -> tuple[int, str]:
    """How many processes were OOM-killed during the run, by the narrowest counter that says so."""
    for (b, a), scope in zip(zip(before, after, strict=True), ("cgroup", "host"), strict=True):
        if a is not None and b is not None and a > b:
            return a - b, scope
    return 0, ""


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def _become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _spawn(cmd: Sequence[str], env: dict[str, str]) -> int:
    return os.posix_spawnp(cmd[0], list(cmd), env, setsigmask=())


def run(cmd: Sequence[str], config: Config, on_exit: Callable[[list[Family]], None] | None = None,
        summary_json: str | None = None, quiet: bool = False,
        listeners: Sequence[Callable[[list[Family]], None]] = (),
        listen_fallback: bool = False) -> tuple[int, RunSummary | None]:
    """Run CMD under watch. Returns (exit code, summary). on_exit gets a final sweep taken after CMD ended (its
    hooked processes' closing flushes included); listeners get every sweep. listen_fallback: config.listen is the
    default, and a busy port falls back to a free one (Agent's listen_fallback).

    Whatever way run() is left (CMD cannot start, the runner fails while CMD runs, an exception after it ended),
    what it started is undone in reverse order: CMD (ended and reaped if still running), the run record, the
    kernel log, the agent (its threads, its port, its hold on the spool), the signal mask, the run's own spool."""
    if not cmd:
        raise ValueError("no command given: outrider run [options] -- CMD [ARGS...]")
    if not _become_subreaper():
        LOG.warning("could not become a child subreaper: orphaned descendants will leave the watched tree")
    me = os.getpid()
    with contextlib.ExitStack() as undo:
        config = _with_spool(config, undo)
        _measure_cpu_peak(config)
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
        undo.callback(signal.pthread_sigmask, signal.SIG_SETMASK, old_mask)
        try:
            agent = Agent(config, roots=(me,), exclude_pids=frozenset({me}), listen_fallback=listen_fallback)
        except OSError as e:  # its address is held (a port asked for), or not this machine's: nothing ran
            print(f"outrider run: {e.strerror or e}", file=sys.stderr)
            return 1, None
        undo.callback(agent.stop)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        oom = OomWatch(config)
        undo.callback(oom.close)
        started = time.monotonic()
        try:
            child = Command(_spawn(cmd, _child_environment(config)))
        except OSError as e:
            return _not_started(cmd[0], e), None
        undo.callback(child.end, config.shutdown_timeout_s)
        store, run_id = _open_run_record(config, cmd)
        if store is not None:
            undo.callback(store.close)
            undo.callback(agent.stop)  # before the record closes: the agent's last sweep reaches the recorder
        recorder = RunRecorder(store, run_id, config.diagnosis_window_s)
        tree = TreeTotals()
        agent.sampler.listeners.extend([*listeners, recorder, tree.note_sweep])
        _record_alerts(agent, recorder)
        started_unix = time.time()
        agent.start()
        if not quiet:
            _say(f"outrider: watching {cmd[0]} (pid {child.pid}); metrics at {agent.server.url}/metrics")
        status = child.wait()
        wall = time.monotonic() - started
        final = agent.sampler.sweep()  # after CMD ended: its hooked processes' closing flushes included
        if on_exit is not None:
            on_exit(final)
        agent.stop()
        usage = _usage(before, resource.getrusage(resource.RUSAGE_CHILDREN), tree)
        summary = _summary(cmd, child, status, wall, usage, agent.server.url, started_unix, oom.finish(child.pid),
                           measure(final, recorder.waiting(), recorder.hooked), recorder)
        if store is not None:
            summary.run_id = run_id
            _finish_record(store, summary)
        _report(summary, quiet, summary_json)
        return summary.exit_code, summary


def _measure_cpu_peak(config: Config) -> None:
    """The CPU's peak FLOP rate, for the MFU of ranks on the CPU: measured in a child process before the command
    starts (so nothing of the command's competes with it), where torch is installed and no figure is configured or
    cached for this machine (outrider/ground/peaks.py); the efficiency collector reads the cache."""
    if not config.cpu_peak_measure or config.cpu_peak_gflops > 0 or config.peak_flops or not peaks.torch_version():
        return
    try:
        model = procfs.read_cpu_model(config.proc_root)
    except OSError:
        model = ""
    key = peaks.machine_key(model)
    if peaks.cached_cpu_peak(key) is not None:
        return
    measured = peaks.measure_cpu_in_child()
    if measured is None:
        LOG.info("the CPU's peak could not be measured (torch failed in a child process): no MFU on the CPU")
        return
    peaks.cache_cpu_peak(key, measured)
    LOG.info("measured this CPU's peak for MFU once: %s with %d threads, in %s (cached in %s)",
             units.flop_rate(measured.flops), measured.threads, units.seconds(measured.cost_s), peaks.cache_dir())


def _with_spool(config: Config, undo: contextlib.ExitStack) -> Config:
    """The configuration with a spool: the configured one, else one of this run's own (removed on the way out), so
    the command's hooked processes publish to this runner."""
    if config.spool_dir:
        return config
    own = tempfile.mkdtemp(prefix="outrider-run-")
    undo.callback(shutil.rmtree, own, ignore_errors=True)
    return dataclasses.replace(config, spool_dir=own)


def _child_environment(config: Config) -> dict[str, str]:
    """CMD's environment: this one, with the hook's settings from this configuration (a file's flush_interval_s
    reaches the children) and the spool."""
    return {**os.environ, **hook_environment(config), "OUTRIDER_SPOOL_DIR": config.spool_dir}


def _not_started(program: str, e: OSError) -> int:
    """The exit code a shell gives a command it cannot start (127: not found, 126: found but not runnable), after
    saying why."""
    if isinstance(e, FileNotFoundError):
        print(f"outrider run: command not found: {program}", file=sys.stderr)
        return 127
    if isinstance(e, PermissionError):
        print(f"outrider run: permission denied: {program}", file=sys.stderr)
        return 126
    print(f"outrider run: cannot run {program}: {e.strerror or e}", file=sys.stderr)
    return 126


class Command:
    """CMD's process while the runner watches it: its pid, the signals forwarded to it, its wait status once
    reaped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.forwarded: list[str] = []
        self.status: int | None = None

    def wait(self) -> int:
        """Forward the signals the runner receives until CMD ends; its wait status. Exited children are reaped on
        every SIGCHLD, and every half second in case one was coalesced."""
        while self.status is None:
            info = signal.sigtimedwait(WAITED, 0.5)
            if info is not None and info.si_signo != signal.SIGCHLD:
                self._forward(info)
            else:
                self.status = _reap(self.pid)
        return self.status

    def _forward(self, info: signal.struct_siginfo) -> None:
        sig = info.si_signo
        # si_pid 0: sent by the kernel, i.e. typed at the terminal; the child's process group got it too.
        if sig == signal.SIGINT and info.si_pid == 0 and os.getpgid(0) == _pgid(self.pid):
            return
        try:
            os.kill(self.pid, sig)
            self.forwarded.append(_signal_name(sig))
        except ProcessLookupError:
            pass

    def end(self, grace_s: float) -> None:
        """On a way out of run() before CMD ended (the runner itself failed): SIGTERM, grace_s to exit, then
        SIGKILL; reaped either way, so CMD is never left running unwatched."""
        if self.status is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while (status := _reap(self.pid)) is None and time.monotonic() < deadline:
            signal.sigtimedwait({signal.SIGCHLD}, 0.05)
        if status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                status = os.waitpid(self.pid, 0)[1]
        self.status = status


def _usage(before: resource.struct_rusage, after: resource.struct_rusage, tree: TreeTotals) -> dict[str, Any]:
    """RunSummary's cost fields: the kernel's accounting of the reaped children (getrusage), and the sweeps' peaks
    and totals, which also see the descendants still running or never reaped by the runner."""
    return dict(cpu_user_s=after.ru_utime - before.ru_utime, cpu_system_s=after.ru_stime - before.ru_stime,
                peak_tree_rss_bytes=max(tree.peak_rss, after.ru_maxrss * 1024),
                peak_process_rss_bytes=after.ru_maxrss * 1024,
                read_bytes=max((after.ru_inblock - before.ru_inblock) * 512, tree.io.get("read", 0)),
                written_bytes=max((after.ru_oublock - before.ru_oublock) * 512, tree.io.get("write", 0)),
                max_processes=max(tree.max_processes, 1))


def _summary(cmd: Sequence[str], child: Command, status: int, wall_s: float, usage: dict[str, Any], url: str,
             started_unix: float, oom: tuple[int, str, str, list[str]], measured: Measured,
             recorder: RunRecorder) -> RunSummary:
    """The run's summary from what its parts made: CMD's ending, its cost, the OOM watch, the hook's
    measurements and the recorder's alerts and verdict."""
    code = os.waitstatus_to_exitcode(status)
    ended_by = _signal_name(-code) if code < 0 else None
    if code < 0:  # killed by a signal: report it as a shell would
        code = 128 - code
    oom_kills, oom_scope, oom_counter, oom_victims = oom
    alerts = sorted(recorder.alerts, key=lambda a: a.fired)
    return RunSummary(
        command=list(cmd), pid=child.pid, exit_code=code, signal=ended_by, wall_s=wall_s,
        **usage, signals_forwarded=child.forwarded, metrics_url=url + "/metrics", started=started_unix,
        measured=measured, oom_kills=oom_kills, oom_scope=oom_scope, oom_counter=oom_counter,
        oom_victims=oom_victims, alerts=[a for a in alerts if a.fired >= started_unix],
        carried_over=[a for a in alerts if a.fired < started_unix], verdict=recorder.verdict(),
        timeline=recorder.timeline(),
    )


def _say(text: str) -> None:
    """A line for the person at the terminal. A stderr that went away (a closed terminal, a pipe whose reader left)
    loses the line, never the run: the command goes on, watched, and its exit code is still the run's."""
    # BrokenPipeError, EIO from a hung-up terminal; ValueError: stderr closed
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)


def _report(summary: RunSummary, quiet: bool, summary_json: str | None) -> None:
    """The summary on stderr (unless quiet), and as JSON where asked."""
    if not quiet:
        _say(summary.text())
    if summary_json:
        with open(summary_json, "w", encoding="utf-8") as fh:
            json.dump(asdict(summary), fh, indent=2)


def _finish_record(store: RunStore, summary: RunSummary) -> None:
    try:
        store.finish_run(summary.run_id, summary.exit_code, asdict(summary))
    except Exception as e:  # a record is a convenience: never fail the run over it
        LOG.warning("could not finish the run record: %s", e)


class TreeTotals:
    """The watched tree's peaks and totals, from the sweeps' families (the process collector's tree series)."""

    def __init__(self) -> None:
        self.max_processes = 0
        self.peak_rss = 0
        self.io: dict[str, int] = {}

    def note_sweep(self, families: list[Family]) -> None:
        for fam in families:
            name = fam.defn.name
            for labels, v in fam.samples:
                if not isinstance(v, float):
                    continue
                if name == "outrider_watched_processes":
                    self.max_processes = max(self.max_processes, int(v))
                elif name == "outrider_watched_memory_rss_bytes":
                    self.peak_rss = max(self.peak_rss, int(v))
                elif name == "outrider_watched_io_bytes_total":
                    self.io[labels[0]] = max(self.io.get(labels[0], 0), int(v))


def _open_run_record(config: Config, cmd: Sequence[str]) -> tuple[RunStore | None, str]:
    """The run store and this run's id; (None, "") if the store cannot be opened (the run goes on unrecorded)."""
    try:
        store = RunStore(config.runs_dir or None)
        return store, store.start_run(list(cmd))
    except Exception as e:
        LOG.warning("not keeping a record of this run: %s", e)
        return None, ""


def _record_alerts(agent: Agent, recorder: RunRecorder) -> None:
    """The recorder hears every alert transition of the agent's own rule evaluation, ahead of the notifiers."""
    if agent.alerting is None:
        return
    engine = agent.alerting.engine
    deliver = engine.notify

    def notify(n: Notification) -> None:
        recorder.on_alert(n)
        deliver(n)

    engine.notify = notify


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return -1


def _reap(child: int) -> int | None:
    """Reap every exited child (orphans included, as the subreaper must); return CMD's wait status if it ended."""
    status: int | None = None
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if pid == child:
            status = st
    return status
