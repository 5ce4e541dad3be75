"""Hook collector: merges the per-process shards in the spool directory into metrics.

Series of all processes are summed per metric, labels, training job and rank (so gunicorn workers or forked
helpers add up, and DDP ranks stay apart). Values in shards are cumulative; when a process is gone (its shard
marked closed, or its pid gone and its heartbeat stale), its last counter and histogram values are kept as
"retired" totals, its shard is deleted, and merged counters never go backwards while the agent lives. Retired
series that no live process shares expire after RETIRED_TTL_S, and at most MAX_RETIRED of them are held.

A process is identified by its pid and its start time (the shard's meta carries the start in clock ticks, as in
/proc/PID/stat): a pid reused by another process is never taken for the process that died. A shard that leaves
the spool while its process lives (the spool deleted, replaced or remounted: the hook re-creates it at its next
flush) is retired like a dead one, so merged counters do not dip; when the same process's shard comes back, what
was retired for it is taken back out (its cumulative values include it), so nothing is counted twice. A custom
metric name published with two shapes (kind or label names) by two processes is shown in one shape: that of the
longest-running live process publishing it; the other shape's series are left out and counted
(`shape_conflict`) until no live process publishes the first shape.

A duration histogram's values carry its log-bucketed sketch as their last element (outrider/shared/sketch.py: a Sketch,
or None where a shard has none: an older hook, or a sketch refused alone), merged like every other value: sketches add
bucket by bucket, and None absorbs (a merge with a process that sent no sketch has none). A merged sketch that
does not hold as many observations as the classic buckets is left out (the histogram is exported with its classic
buckets only), so a percentile is never taken from part of the values.

Shards are read through outrider.shared.spool, which trusts nothing in them: a shard that is unreadable (truncated,
corrupt, newer format, owned by a uid this agent does not trust, not a regular file, writable by others, too large)
is skipped and counted once while it stays the same file; a bad series in a good shard is dropped alone and
counted. Neither ever fails the collector.

Several agents on one spool (a node agent and a sidecar, `outrider run` beside an agent) each report every process
they read, live or finished: both endpoints carry full totals. The agent holding agent.lock (or started holding it:
the standalone agent) owns the cleanup: it deletes a finished process's shard only once every other live agent on
the spool has swept since it finished (spool.live_readers), or after spool.READER_GRACE_S; the others never delete
and take the lock over when its holder leaves. A finished shard seen again unchanged is not read again, so a reader
that may not delete it never counts it twice.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from typing import Any

from outrider.collectors.base import Collector, CollectorContext, StackDump
from outrider.collectors.goodput import GoodputAccount, Seen
from outrider.kernel import procfs
from outrider.metrics.catalog import CATALOG, CUSTOM_HELP, MetricDef, custom_definition
from outrider.metrics.family import Family, HistogramValue
from outrider.shared import spool
from outrider.shared.sketch import Sketch

# name, kind, labels (+training_job, rank), bounds
SeriesKey = tuple[str, str, tuple[tuple[str, str], ...], tuple[float, ...]]
RETIRED_TTL_S = 900.0
MAX_RETIRED = 10_000
TRUST_TTL_S = 30.0
MAX_ANCESTRY = 64
MAX_RETIRED_PATHS = 1024  # shards whose retired values are remembered, in case the same process's shard returns
START_SLACK_S = 2.0  # /proc/stat's boot time is whole seconds: the slack of a start time derived from it
Shape = tuple[str, tuple[str, ...]]  # kind, label names
STRAY_EVERY = 10  # sweeps between looks for pending shards left by processes killed while growing theirs


@dataclass
class ProcessState:
    path: str
    meta: dict[str, object]
    header: spool.ShardHeader
    state: str  # running, stalled, unresponsive, stopped, exited
    uid: int

    @property
    def rank(self) -> str:
        return _label_text(self.meta.get("rank", ""))

    @property
    def training_job(self) -> str:
        return _label_text(self.meta.get("training_job", ""))

    @property
    def worker(self) -> bool:
        """A helper of a rank (a spawned DataLoader worker): its series count for the rank, it never pages."""
        return self.meta.get("role") == "worker"


@dataclass
class Finished:
    """A finished process's shard still in the spool: retired here, waiting for every reader before deletion."""

    identity: spool.Identity | None
    seen_ns: int  # unix ns when this agent first saw it finished (compared with the readers' sweep starts)
    seen_s: float  # the same on the monotonic clock (for the grace period)
    kept: bool = False  # deletion refused (a sticky shared spool where it is not ours): not tried again


# A series' values: a counter's or gauge's one float; a histogram's bucket counts and sum, then its sketch (or None)
Values = list[Any]
Published = tuple[ProcessState, dict[SeriesKey, Values]]  # a live or exited process and its series


@dataclass
class Retired:
    values: Values
    at: float  # monotonic time it was last retired into


class HookCollector(Collector):
    name = "hook"
    description = "metrics the in-process hook publishes (steps, data wait, latency, allocator) from the spool"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        config = ctx.config
        self.spool = config.spool_dir or spool.default_dir()
        self._explicit = bool(config.spool_dir)
        self._trusted_uids = frozenset(config.spool_trusted_uids) | {os.geteuid()}
        self.reader = spool.ShardReader(self.spool, self._trusted)
        self._retired: dict[SeriesKey, Retired] = {}
        # path -> (what was retired for it, when): taken back out if that process's shard comes back
        self._retired_by_path: dict[str, tuple[dict[SeriesKey, Values], float]] = {}
        self._last: dict[str, dict[SeriesKey, Values]] = {}  # live shards of the last sweep and their series
        self._owners: dict[str, tuple[str, Shape]] = {}  # custom name -> (path of its shape's publisher, shape)
        self._conflicts: set[tuple[str, str]] = set()  # (path, name) counted as shape_conflict
        self._boot_s: float | None = None
        self._sweeps = 0
        self._strays: dict[str, float] = {}  # pending shards of processes gone -> when first seen so
        self._dynamic: dict[str, MetricDef] = {}
        self.shard_errors: dict[str, int] = {}
        self.processes: list[ProcessState] = []
        self._heartbeats: dict[str, tuple[int, float]] = {}  # path -> (heartbeat, monotonic time it changed)
        self._trust: dict[tuple[int, int], tuple[bool, float]] = {}  # (uid, pid) -> (verdict, when checked)
        self._finished: dict[str, Finished] = {}
        self._lock_fd: int | None = None
        self._mark: spool.ReaderMark | None = None  # while another agent owns the spool
        self.goodput = GoodputAccount()
        if ctx.hold_spool_lock:
            try:
                spool.prepare_dir(self.spool, private=not self._explicit, trusted_uids=self._trusted_uids)
                self._lock_fd = self._try_lock()
            except spool.LockRefused as e:
                self.drop("spool_lock", e)
            except OSError as e:
                self.drop("spool", e)
            if self._lock_fd is None:
                self._mark_reader()

    @property
    def owner(self) -> bool:
        """Whether this agent owns the spool's cleanup: it holds agent.lock, or was started holding it (the
        standalone agent, hold_spool_lock False)."""
        return not self.ctx.hold_spool_lock or self._lock_fd is not None

    # --- trust -----------------------------------------------------------------------------------------------
    def _trusted(self, uid: int, pid: int) -> bool:
        """A shard is read when its owner is this agent's user or a configured uid, or the uid of the live
        process it claims to be, when that process is one this agent watches."""
        if uid in self._trusted_uids:
            return True
        now = self.ctx.clock.monotonic()
        hit = self._trust.get((uid, pid))
        if hit is not None and now - hit[1] < TRUST_TTL_S:
            return hit[0]
        ok = self._process_uid(pid) == uid and self._watched(pid)
        if len(self._trust) > 4096:
            self._trust.clear()
        self._trust[(uid, pid)] = (ok, now)
        return ok

    def _process_uid(self, pid: int) -> int | None:
        """The uid the process's shard would be owned by: its effective uid (a file gets the creator's filesystem
        uid, which follows the effective one), not the real uid of a setuid process."""
        try:
            return procfs.read_proc_uids(self.ctx.config.proc_root, pid).effective
        except (OSError, ValueError):
            return None

    def _watched(self, pid: int) -> bool:
        roots = self.ctx.roots
        if not roots:
            return True  # this agent watches every process it can see
        for _ in range(MAX_ANCESTRY):
            if pid in roots:
                return True
            ppid = procfs.parent_pid(self.ctx.config.proc_root, pid)
            if ppid is None:
                return False
            pid = ppid
            if pid <= 1:
                return pid in roots
        return False

    def _count(self, reason: str, what: str, error: BaseException | str) -> None:
        self.shard_errors[reason] = self.shard_errors.get(reason, 0) + 1
        self.drop(f"{reason} {what}", error)

    # --- merging ---------------------------------------------------------------------------------------------
    def _usable(self) -> bool:
        """Whether the spool passes the safety checks now; an unsafe one is not read at all (said once)."""
        try:
            spool.check_dir(self.spool, private=not self._explicit, trusted_uids=self._trusted_uids)
        except FileNotFoundError:
            return False
        except OSError as e:
            self._count("spool_unsafe", "spool", e)
            return False
        return True

    def _mark_reader(self) -> None:
        """Another agent owns the spool: say that this one reads it too, so the owner waits for it before deleting
        a finished process's shard."""
        if self._mark is not None and self._mark.intact():
            return
        if self._mark is not None:
            self._mark.close()
            self._mark = None
        try:
            mode = spool.shared_file_mode(self.spool) if self._explicit else spool.PRIVATE_FILE_MODE
            self._mark = spool.ReaderMark(self.spool, mode)
        except OSError as e:
            self.drop("spool reader mark", e)

    def _try_lock(self) -> int | None:
        """agent.lock, as spool.try_lock takes it: a lock file another user planted (which kept this agent a mere
        reader that never deletes a finished shard) is replaced, said once, or refused (spool.LockRefused) with
        the reason, logged once and counted."""
        mode = spool.shared_file_mode(self.spool) if self._explicit else spool.PRIVATE_FILE_MODE
        return spool.try_lock(self.spool, trusted_uids=self._trusted_uids, mode=mode,
                              notice=lambda what: self.log.warning("hook: %s", what))

    def _take_over(self) -> None:
        """A reader takes agent.lock once its holder has left, and becomes the owner."""
        try:
            self._lock_fd = self._try_lock()
        except spool.LockRefused as e:
            self.drop("spool_lock", e)
            self._lock_fd = None
        except OSError:
            self._lock_fd = None
        if self._lock_fd is not None:
            if self._mark is not None:
                self._mark.close()
                self._mark = None
            self.log.info("hook: took over the spool %s (the agent that owned it is gone)", self.spool)
        elif os.path.isdir(self.spool):
            self._mark_reader()

    def _keep_lock(self) -> None:
        """A spool re-created under the agent (deleted, remounted) lost the lock with its old directory, and a
        workload would take it for a spool no agent serves: take it again in the new directory."""
        if self._lock_fd is None:
            if self.ctx.hold_spool_lock:
                self._take_over()
            return
        try:
            st, fst = os.lstat(os.path.join(self.spool, spool.LOCK_NAME)), os.fstat(self._lock_fd)
            if (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino):
                return
        except OSError:
            pass
        try:
            spool.prepare_dir(self.spool, private=not self._explicit, trusted_uids=self._trusted_uids)
            fd = self._try_lock()
        except OSError as e:
            self.drop("spool", e)
            return
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)
        self._lock_fd = fd
        if fd is None:  # another agent holds the lock at the name now (it took the re-created spool first)
            self.log.info("hook: another agent owns the spool %s now; this one reads it", self.spool)
            self._mark_reader()

    def collect(self) -> list[Family]:
        started_ns = self.ctx.clock.wall_ns()  # before the listing: what a reader's mark promises the owner it has seen
        self._keep_lock()
        live, ended, finished = self._read_spool()
        self._retire_gone({proc.path for proc, _ in (*live, *ended)})
        self._last = {proc.path: entries for proc, entries in live}
        self._finished = finished
        self._sweeps += 1
        self._tidy_spool(started_ns)
        self._quiet_helpers(live)
        merged = self._merge_live(live)
        self._expire_retired(merged)
        for key, retired in self._retired.items():
            if self._shape_ok(key):
                _accumulate(merged, key, retired.values)
        processes = [proc for proc, _ in live]
        self.processes = processes
        self.ctx.stalled_stacks[:] = self._stalled_stacks(processes)
        self.goodput.observe([_seen(p, e, False) for p, e in live] + [_seen(p, e, True) for p, e in ended],
                             _loop_totals(merged))
        return self._families(merged, processes) + self.goodput.families(self.ctx.clock.wall())

    def _read_spool(self) -> tuple[list[Published], list[Published], dict[str, Finished]]:
        """Every shard of the spool read, in the reader's order: the live processes' series, the series of those
        that exited (retired here), and the finished shards (final, read now or at an earlier sweep)."""
        live: list[Published] = []
        ended: list[Published] = []
        finished: dict[str, Finished] = {}
        for path in self.reader.paths() if self._usable() else ():
            done = self._finished.get(path)
            if done is not None and done.identity is not None and self.reader.identity(path) == done.identity:
                finished[path] = done  # final, retired already: not read (nor retired) again
                continue
            snap = self._read_shard(path)
            if snap is None:
                continue
            proc, entries = self._published(path, snap)
            if proc.state == "exited":
                ended.append((proc, entries))
                self._retire(entries, path)
                self._heartbeats.pop(path, None)
                self.reader.forget(path)  # final: no descriptor kept for it
                finished[path] = Finished(snap.identity, self.ctx.clock.wall_ns(), self.ctx.clock.monotonic())
                continue
            live.append((proc, entries))
        return live, ended, finished

    def _read_shard(self, path: str) -> spool.ShardSnapshot | None:
        """One shard's snapshot; None where it cannot be read now (counted by why, a refused shard once)."""
        try:
            return self.reader.read(path)
        except spool.ShardRejected:
            return None  # counted when it was first refused
        except spool.ShardFormatError as e:
            self._count(e.reason, f"shard {os.path.basename(path)}", e)
        except OSError as e:
            self._count("no_descriptors" if e.errno in (errno.EMFILE, errno.ENFILE) else "unreadable",
                        f"shard {os.path.basename(path)}", e)
        return None

    def _published(self, path: str, snap: spool.ShardSnapshot) -> Published:
        """The process a shard describes and its series, keyed with its training_job and rank labels."""
        name = os.path.basename(path)
        # Back after it was retired (its cumulative values include what was retired, taken back out), or a
        # heartbeat older than the last one seen (a stale copy, such as the spool's old directory seen again
        # when a volume mounted over it goes): no counter of this process may go backwards.
        unretired = self._unretire(path)
        before = self._heartbeats.get(path)
        floor = unretired or (self._last.get(path) if before and snap.header.heartbeat_ns < before[0] else None)
        for why in snap.rejected:
            self._count("invalid_series", f"series in {name}", why)
        proc = ProcessState(path, snap.meta, snap.header, self._state(path, snap.header, snap.meta), snap.uid)
        extra = (("training_job", proc.training_job), ("rank", proc.rank))
        entries: dict[SeriesKey, Values] = {
            (n, kind, (*sorted(labels.items()), *extra), bounds):
                [*values, snap.sketches.get(i)] if kind == "histogram" else values
            for i, (n, kind, labels, values, bounds) in enumerate(snap.series)}
        if floor:
            _not_backwards(entries, floor)
        return proc, entries

    def _retire_gone(self, present: set[str]) -> None:
        """The series of processes whose shard went without being retired here (the spool deleted or remounted,
        unreadable) are retired."""
        for path, entries in self._last.items():
            if path not in present:
                self._retire(entries, path)
                self._heartbeats.pop(path, None)

    def _tidy_spool(self, started_ns: int) -> None:
        """The owner deletes finished shards (and now and then strays); a reader says what it has seen."""
        if self.owner:
            self._clean_finished()
            if self._sweeps % STRAY_EVERY == 1:
                self._remove_strays()
        elif self._mark is not None:
            self._mark.swept(started_ns)

    def _merge_live(self, live: list[Published]) -> dict[SeriesKey, Values]:
        """The live processes' series summed by key, but for a custom name published in another shape than the
        one elected for it (left out, counted once)."""
        merged: dict[SeriesKey, Values] = {}
        left_out = self._elect_shapes(live)
        for proc, entries in live:
            out = left_out.get(proc.path)
            for key, values in entries.items():
                if not out or key[0] not in out:
                    _accumulate(merged, key, values)
                else:
                    self._shape_conflict(proc, key)
        return merged

    def _shape_conflict(self, proc: ProcessState, key: SeriesKey) -> None:
        if (proc.path, key[0]) in self._conflicts:
            return
        if len(self._conflicts) > 10_000:
            self._conflicts.clear()
        self._conflicts.add((proc.path, key[0]))
        self._count("shape_conflict", f"series {key[0]}",
                    f"pid {proc.header.pid} publishes it as a {key[1]} with other label names than "
                    "the process that published it first; left out while that one runs")

    # --- identity ----------------------------------------------------------------------------------------------
    def _start_ticks(self, pid: int) -> int | None:
        """The start time of the live process `pid` (clock ticks after boot, /proc/PID/stat field 22)."""
        return procfs.start_ticks(self.ctx.config.proc_root, pid)

    def _boot_time_s(self) -> float:
        if self._boot_s is None:
            self._boot_s = 0.0
            with contextlib.suppress(OSError, ValueError, IndexError):
                self._boot_s = procfs.read_boot_time(self.ctx.config.proc_root)
        return self._boot_s

    def _stopped(self, pid: int, meta: dict[str, object], start_ns: int) -> bool:
        """Whether the process that wrote the shard is stopped (/proc state T, or t under a tracer)."""
        return procfs.process_state(self.ctx.config.proc_root, pid) in ("T", "t") and \
            self._same_process(pid, meta, start_ns)

    def _same_process(self, pid: int, meta: dict[str, object], start_ns: int) -> bool:
        """Whether the live process `pid` is the one that wrote the shard: same pid and same start. The hook says
        its start in clock ticks (exact); a shard without it (an older hook) is matched on wall time: the live
        process must have started before the hook did."""
        ticks = self._start_ticks(pid)
        if ticks is None:
            return False
        said = meta.get("starttime")
        if isinstance(said, int) and not isinstance(said, bool) and said > 0:
            return ticks == said
        boot = self._boot_time_s()
        if not boot:
            return True  # cannot tell: the pid is visible, as before
        return boot + ticks / os.sysconf("SC_CLK_TCK") <= start_ns / 1e9 + START_SLACK_S

    # --- shapes of custom names ----------------------------------------------------------------------------------
    def _elect_shapes(self, live: list[tuple[ProcessState, dict[SeriesKey, Values]]]) -> dict[str, set[str]]:
        """Each custom name's shape: its current owner's while that process lives, else that of the
        longest-running live process publishing the name; with none live, the last owner's (its retired series).
        Returns the names each process publishes in another shape (by shard path). A process has one shape per
        name (its registry refuses a second), so one series per name tells it."""
        publishers: dict[str, dict[str, tuple[int, int, Shape]]] = {}
        for proc, entries in live:
            seen: set[str] = set()
            for key in entries:
                name = key[0]
                if name in seen:
                    continue
                seen.add(name)
                if name not in CATALOG:
                    publishers.setdefault(name, {})[proc.path] = (proc.header.start_ns, proc.header.pid, _shape(key))
        left_out: dict[str, set[str]] = {}
        for name, pubs in publishers.items():
            owner = self._owners.get(name)
            path = owner[0] if owner is not None and owner[0] in pubs else min(pubs, key=lambda p: pubs[p][:2])
            shape = pubs[path][2]
            self._owners[name] = (path, shape)
            for other, (_, _, theirs) in pubs.items():
                if theirs != shape:
                    left_out.setdefault(other, set()).add(name)
        if len(self._owners) > 10_000:  # names nobody publishes any more, and with nothing retired, go
            keep = set(publishers) | {key[0] for key in self._retired}
            self._owners = {n: o for n, o in self._owners.items() if n in keep}
        return left_out

    def _shape_ok(self, key: SeriesKey) -> bool:
        owner = self._owners.get(key[0])
        return owner is None or owner[1] == _shape(key)

    def _state(self, path: str, h: spool.ShardHeader, meta: dict[str, object]) -> str:
        if h.flags & spool.FLAG_CLOSED:
            return "exited"
        # The heartbeat's age on the agent's monotonic clock (since the value last changed), so a wall-clock jump
        # on the node neither retires a live process nor keeps a dead one.
        now = self.ctx.clock.monotonic()
        seen = self._heartbeats.get(path)
        if seen is None or seen[0] != h.heartbeat_ns:
            seen = self._heartbeats[path] = (h.heartbeat_ns, now)
        age_s = now - seen[1]
        flush_s = self.ctx.config.flush_interval_s
        if age_s > 3 * flush_s and not self._same_process(h.pid, meta, h.start_ns):
            # Killed or crashed (no closing flush), its pid gone or reused by another process. In a pod without a
            # shared process namespace no pid is visible: there, three missed heartbeats mean gone.
            return "exited"
        if age_s > 2 * flush_s and self._stopped(h.pid, meta, h.start_ns):
            # SIGSTOP, a shell's job control, a debugger: its publisher is stopped with it. Not stalled: it resumes
            # where it was when continued (one read of /proc/PID/stat, only for a process whose heartbeat ages).
            return "stopped"
        if age_s > max(10 * flush_s, 10.0):
            return "unresponsive"  # alive, but its publisher thread has not written for a while
        if h.flags & spool.FLAG_STALLED:
            return "stalled"
        return "running"

    def _remove_strays(self) -> None:
        """A process killed between creating a shard (or a larger generation of it) and renaming it leaves the
        file under its temporary name, up to the format's size: removed once its process is gone (pid and
        start), seen so on two looks."""
        seen: dict[str, float] = {}
        for path, pid, start_ns in self.reader.pending():
            if self._same_process(pid, {}, start_ns):
                continue
            if path in self._strays:
                try:
                    os.unlink(path)  # never follows a link
                except FileNotFoundError:
                    pass
                except OSError as e:  # a sticky shared spool where it is not ours to delete
                    self.drop("cleanup", e)
                continue
            seen[path] = self.ctx.clock.monotonic()
        self._strays = seen

    def _quiet_helpers(self, live: list[tuple[ProcessState, dict[SeriesKey, Values]]]) -> None:
        """A helper waiting for a first step it will never take (it inherited torchrun's environment) does not make
        its rank's outrider_train_first_step_pending 1: the gauge is summed over the rank's processes."""
        groups: dict[tuple[str, str], list[ProcessState]] = {}
        for proc, _ in live:
            groups.setdefault((proc.rank, proc.training_job), []).append(proc)
        for proc, entries in live:
            key: SeriesKey = ("outrider_train_first_step_pending", "gauge",
                              (("training_job", proc.training_job), ("rank", proc.rank)), ())
            pending = entries.get(key)
            if pending and pending[0] and self._helper(proc, groups[(proc.rank, proc.training_job)]):
                del entries[key]

    def _helper(self, p: ProcessState, procs: list[ProcessState]) -> bool:
        """Whether a process of a rank is a helper of it rather than the rank: a spawned worker (its meta says so),
        or one that never stepped and descends from another live process of the same rank (a helper started with
        subprocess, which inherits RANK and TORCHELASTIC_RUN_ID). A helper never makes its rank stalled."""
        if p.worker:
            return True
        if p.header.steps or len(procs) < 2:
            return False
        others = {q.header.pid for q in procs if q is not p}
        pid = p.header.pid
        for _ in range(MAX_ANCESTRY):
            ppid = procfs.parent_pid(self.ctx.config.proc_root, pid)
            if ppid is None:
                return False
            pid = ppid
            if pid in others:
                return True
            if pid <= 1:
                return False
        return False

    def _retire(self, entries: dict[SeriesKey, Values], path: str) -> None:
        now = self.ctx.clock.monotonic()
        kept: dict[SeriesKey, Values] = {}
        for key, values in entries.items():
            if key[1] not in ("counter", "histogram"):  # a gone process's gauges go with it
                continue
            have = self._retired.get(key)
            if have is None:
                self._retired[key] = Retired(list(values), now)
            elif len(have.values) == len(values):
                have.values = [_plus(a, b) for a, b in zip(have.values, values)]
                have.at = now
            else:
                continue
            kept[key] = values
        self._retired_by_path.pop(path, None)
        self._retired_by_path[path] = (kept, now)
        while len(self._retired_by_path) > MAX_RETIRED_PATHS:
            del self._retired_by_path[next(iter(self._retired_by_path))]

    def _unretire(self, path: str) -> dict[SeriesKey, Values] | None:
        """The shard of a process retired here is back (the spool re-created, a process taken for dead that was
        not): its cumulative values include what was retired for it, which is taken back out. Returns what was
        retired (the values its series may not fall below)."""
        hit = self._retired_by_path.pop(path, None)
        if hit is None or self.ctx.clock.monotonic() - hit[1] > RETIRED_TTL_S:
            return None
        for key, values in hit[0].items():
            have = self._retired.get(key)
            if have is not None and len(have.values) == len(values):
                have.values = [_minus(a, b) for a, b in zip(have.values, values)]
        return hit[0]

    def _expire_retired(self, live: dict[SeriesKey, Values]) -> None:
        """Bounded memory: a retired series no live process shares goes after RETIRED_TTL_S (its final value has
        been scraped many times by then), the oldest first beyond MAX_RETIRED. One a live process shares stays,
        or the merged counter would go backwards."""
        now = self.ctx.clock.monotonic()
        orphans = [(r.at, key) for key, r in self._retired.items() if key not in live]
        expired = {key for at, key in orphans if now - at > RETIRED_TTL_S}
        excess = len(self._retired) - len(expired) - MAX_RETIRED
        if excess > 0:
            expired.update(key for _, key in sorted(k for k in orphans if k[1] not in expired)[:excess])
        for key in expired:
            del self._retired[key]

    def _clean_finished(self) -> None:
        """The owner deletes finished processes' shards once every other live agent on the spool has started a
        sweep since it saw them finished (each has their final values then), or after READER_GRACE_S."""
        waiting = [(path, f) for path, f in self._finished.items() if not f.kept]
        if not waiting:
            return
        readers = spool.live_readers(self.spool)
        now = self.ctx.clock.monotonic()
        for path, f in waiting:
            if all(swept > f.seen_ns for swept in readers) or now - f.seen_s > spool.READER_GRACE_S:
                try:
                    self.reader.remove(path)
                except OSError as e:  # e.g. a sticky shared spool where the shard is not ours to delete
                    f.kept = True
                    self.drop("cleanup", e)
                else:
                    del self._finished[path]

    def _stalled_stacks(self, processes: list[ProcessState]) -> list[StackDump]:
        out: list[StackDump] = []
        for p in processes:
            if p.state == "running":
                continue
            text = self.reader.read_stacks(p.path, p.uid)
            if text:
                out.append((p.header.pid, p.rank, spool.stacks_path(p.path), text))
        return out

    # --- families --------------------------------------------------------------------------------------------
    def _defn(self, name: str, kind: str, label_names: tuple[str, ...]) -> MetricDef | None:
        defn = CATALOG.get(name)
        if defn is not None:
            return defn if defn.type == kind and set(defn.label_names) == set(label_names) else None
        hit = self._dynamic.get(name)
        if hit is None or hit.type != kind or set(hit.label_names) != set(label_names):
            # New, or its shape changed (the process that owned the old one is gone): the definition follows
            if hit is None and len(self._dynamic) >= 10_000:
                self._dynamic.clear()  # names seen long ago; the live ones are made again
            hit = custom_definition(name, kind, label_names, "hook", CUSTOM_HELP)
            self._dynamic[name] = hit
        return hit

    def _families(self, merged: dict[SeriesKey, Values], processes: list[ProcessState]) -> list[Family]:
        return self._series_families(merged) + self._state_families(processes)

    def _series_families(self, merged: dict[SeriesKey, Values]) -> list[Family]:
        """The processes' series, merged, as families (one per name; a series whose shape its definition refuses is
        counted and left out)."""
        fams: dict[str, Family] = {}
        for (name, kind, labels, bounds), values in merged.items():
            label_map = dict(labels)
            defn = self._defn(name, kind, tuple(label_map))
            if defn is None:
                self._count("invalid_series", f"series {name}", "kind or label names differ from the metric's "
                                                                "definition")
                continue
            fam = fams.get(name)
            if fam is None:
                fam = fams[name] = Family(defn)
            elif fam.defn.type != kind or set(fam.defn.label_names) != set(label_map):
                continue  # retired series of two shapes with no live publisher to choose: the first shape shown
            label_values = tuple(label_map[n] for n in defn.label_names)
            if kind == "histogram":
                fam.add(_histogram(bounds, values), *label_values)
            else:
                fam.add(values[0], *label_values)
        return list(fams.values())

    def _state_families(self, processes: list[ProcessState]) -> list[Family]:
        """The hooked processes' states, by rank and by process, and the collector's own counts."""
        states = Family("outrider_hook_processes")
        for state in ("running", "stalled", "unresponsive", "stopped"):
            states.add(sum(1 for p in processes if p.state == state), state)
        last_step = Family("outrider_train_last_step_timestamp_seconds")
        started = Family("outrider_train_start_timestamp_seconds")
        stalled = Family("outrider_hook_stalled")
        stopped = Family("outrider_hook_stopped")
        heartbeat = Family("outrider_hook_last_heartbeat_timestamp_seconds")
        by_rank: dict[tuple[str, str], list[ProcessState]] = {}
        for p in processes:
            by_rank.setdefault((p.rank, p.training_job), []).append(p)
        for (rank, job), procs in sorted(by_rank.items()):
            steps = [p.header.last_step_ns for p in procs if p.header.last_step_ns]
            if steps:
                last_step.add(max(steps) / 1e9, rank, job)
            started.add(min(p.header.start_ns for p in procs) / 1e9, rank, job)
            stalled.add(1 if any(p.state in ("stalled", "unresponsive") and not self._helper(p, procs)
                                 for p in procs) else 0, rank, job)
            stopped.add(1 if any(p.state == "stopped" and not self._helper(p, procs) for p in procs) else 0,
                        rank, job)
        for p in processes:
            heartbeat.add(p.header.heartbeat_ns / 1e9, p.rank, p.training_job, str(p.header.pid))
        errors = Family("outrider_hook_shard_errors_total")
        for reason, n in sorted(self.shard_errors.items()):
            errors.add(n, reason)
        retired = Family("outrider_hook_retired_series").add(len(self._retired))
        rejected = Family("outrider_hook_spool_rejected_files")
        for reason, n in sorted(self.reader.rejected().items()):
            rejected.add(n, reason)
        owner = Family("outrider_hook_spool_owner").add(1 if self.owner else 0)
        return [states, last_step, started, stalled, stopped, heartbeat, errors, retired, rejected, owner]

    def close(self) -> None:
        self.reader.close()
        if self._mark is not None:
            self._mark.close()
            self._mark = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None


LOOP = "outrider_train_loop_seconds_total"


def _gauge(entries: dict[SeriesKey, Values], name: str, proc: ProcessState) -> float | None:
    values = entries.get((name, "gauge", (("training_job", proc.training_job), ("rank", proc.rank)), ()))
    return float(values[0]) if values else None


def _seen(proc: ProcessState, entries: dict[SeriesKey, Values], exited: bool) -> Seen:
    """What goodput needs of one process (collectors/goodput.py)."""
    h = proc.header
    return Seen((h.pid, h.start_ns), proc.training_job, proc.rank, exited,
                proc.state in ("stalled", "unresponsive") or bool(h.flags & spool.FLAG_STALLED), h.steps,
                h.start_ns / 1e9, h.heartbeat_ns / 1e9, h.last_step_ns / 1e9,
                _gauge(entries, "outrider_train_first_step_timestamp_seconds", proc),
                _gauge(entries, "outrider_train_time_to_first_step_seconds", proc), proc.worker)


def _loop_totals(merged: dict[SeriesKey, Values]) -> dict[tuple[str, str], dict[str, float]]:
    """The loop's totals by (training_job, rank) and part."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for (name, _, labels, _), values in merged.items():
        if name == LOOP:
            by = dict(labels)
            out.setdefault((by.get("training_job", ""), by.get("rank", "")), {})[by.get("part", "")] = values[0]
    return out


def _label_text(value: object) -> str:
    """A label value from a shard's meta: text, at most 128 characters, valid UTF-8 (else replaced)."""
    text = value if isinstance(value, str) else str(value)
    return text[: spool.MAX_LABEL_VALUE].encode("utf-8", "replace").decode("utf-8")


def _shape(key: SeriesKey) -> Shape:
    # The labels of a key are sorted, then training_job and rank: their names in order are the shape's.
    return key[1], tuple([n for n, _ in key[2]])


def _not_backwards(entries: dict[SeriesKey, Values], floor: dict[SeriesKey, Values]) -> None:
    """One process's counters and histograms never go backwards: a series below what was seen of it before (a stale
    copy of the shard) keeps the earlier values."""
    for key, values in entries.items():
        before = floor.get(key)
        if before is None or len(before) != len(values) or key[1] == "gauge":
            continue
        buckets = len(key[3]) + 1
        if (before[0] > values[0]) if key[1] == "counter" else (sum(before[:buckets]) > sum(values[:buckets])):
            entries[key] = before


def _accumulate(into: dict[SeriesKey, Values], key: SeriesKey, values: Values) -> None:
    have = into.get(key)
    if have is None:
        into[key] = list(values)
    elif len(have) == len(values):
        for i, v in enumerate(values):
            have[i] = _plus(have[i], v)


def _plus(a: Any, b: Any) -> Any:
    """Two values of a series added: floats, or sketches (None, a sketch missing on either side, absorbs)."""
    if a is None or b is None:
        return None
    return a + b


def _minus(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    return a.since(b) if isinstance(a, Sketch) else a - b


def _histogram(bounds: tuple[float, ...], values: Values) -> HistogramValue:
    """The merged values of a histogram; its sketch kept only when it holds every observation the buckets do."""
    n = len(bounds) + 1
    counts = tuple(int(v) for v in values[:n])
    sketch = values[n + 1] if len(values) > n + 1 else None
    if not isinstance(sketch, Sketch) or sketch.count != sum(counts):
        sketch = None
    return HistogramValue(bounds, counts, values[n], sketch)
