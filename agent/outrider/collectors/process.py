"""Process collector: the watched process tree (or every visible process), bounded to top N series plus "other".

Per-process series are bounded: N slots, each held by one process until it exits (sticky, so series do not
churn), filled by the busiest processes not yet shown. Everything else is summed under pid="other": gauges as
sums, counters as the deltas accumulated while a process was not shown, so "other" never goes backwards. The
tree totals (`outrider_watched_*`) keep counting processes that have exited since watching began.

A reading the agent may not take (another user's I/O and open fds, without CAP_SYS_PTRACE: a non-root node
agent) is absent, never 0: the process's series is left out and the drop counted. Sums ("other", the tree totals)
add only what could be read, and are absent while nothing of theirs could.
"""

from __future__ import annotations

from dataclasses import dataclass

from outrider.collectors.base import Collector, CollectorContext
from outrider.collectors.process_identity import ProcessIdentities
from outrider.kernel import procfs
from outrider.metrics.family import Family

OTHER = "other"


@dataclass
class _Reading:
    stat: procfs.ProcStat
    ctx: tuple[int, int] | None  # voluntary, involuntary; None: unreadable
    io: tuple[int, int] | None  # read, write bytes; None: unreadable
    fds: int | None

    def counters(self, before: tuple[float, ...]) -> tuple[float, float, int, int, int, int]:
        """Cumulative counters; an unreadable one keeps its last known value, so it neither counts as 0 nor
        jumps when it becomes readable again."""
        rd, wr = self.io if self.io is not None else (int(before[2]), int(before[3]))
        vol, invol = self.ctx if self.ctx is not None else (int(before[4]), int(before[5]))
        return (self.stat.user_s, self.stat.system_s, rd, wr, vol, invol)


ZERO = (0.0, 0.0, 0, 0, 0, 0)
IO, CTX = (2, 3), (4, 5)  # positions of the counters that may be unreadable


class ProcessCollector(Collector):
    name = "process"
    description = "CPU, RSS, threads, fds, I/O and context switches of the watched process tree"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self._root = ctx.config.proc_root
        self._top_n = ctx.config.process_top_n
        self._last: dict[tuple[int, int], tuple[float, float, int, int, int, int]] = {}
        self._slots: list[tuple[int, int]] = []  # (pid, start_ticks) of processes shown one by one
        self._other = [0.0, 0.0, 0, 0, 0, 0]
        self._tree = [0.0, 0.0, 0, 0, 0, 0]
        # Which counter groups of "other" and of the tree were ever read (an absent sum is not a sum of 0).
        self._other_read: set[tuple[int, int]] = set()
        self._tree_read: set[tuple[int, int]] = set()
        self._identities = ProcessIdentities(self._root, arguments=ctx.config.process_command_arguments,
                                              full_command=ctx.config.process_full_command)

    def _pids(self) -> list[int]:
        roots = self.ctx.roots
        pids = procfs.descendants(self._root, roots) if roots else procfs.list_pids(self._root)
        excluded = self.ctx.exclude_pids
        return [p for p in pids if p not in excluded]

    def _read(self, pid: int) -> _Reading | None:
        try:
            stat = procfs.read_proc_stat(self._root, pid)
        except (FileNotFoundError, ProcessLookupError):
            return None  # exited between listing and reading: not an error
        except (OSError, ValueError, IndexError) as e:
            self.drop("stat", e)
            return None
        if stat.state in ("Z", "X"):
            return None  # exited, waiting to be reaped: nothing left to measure
        if not self.ctx.roots and (pid == 2 or stat.ppid == 2):
            return None  # kernel threads
        ctx: tuple[int, int] | None
        try:
            ctx = procfs.read_proc_ctx_switches(self._root, pid)
        except (FileNotFoundError, ProcessLookupError):
            return None
        except (OSError, ValueError, IndexError) as e:
            self.drop("status", e)
            ctx = None
        io: tuple[int, int] | None
        try:
            io = procfs.read_proc_io(self._root, pid)
        except (FileNotFoundError, ProcessLookupError):
            return None
        except (OSError, ValueError) as e:  # PermissionError for other users' processes without CAP_SYS_PTRACE
            self.drop("io", e)
            io = None
        fds: int | None
        try:
            fds = procfs.count_fds(self._root, pid)
        except (FileNotFoundError, ProcessLookupError):
            return None
        except OSError as e:
            self.drop("fd", e)
            fds = None
        return _Reading(stat, ctx, io, fds)

    def collect(self) -> list[Family]:
        readings = self._readings()
        deltas = self._advance(readings)
        self._fill_slots(readings, deltas)
        other = self._add_to_other(readings, deltas)
        t = self._tree
        tree_io = Family("outrider_watched_io_bytes_total")
        if IO in self._tree_read:
            tree_io.add(t[2], "read").add(t[3], "write")
        return [
            *self._process_families(readings, other),
            Family("outrider_watched_up").add(1 if readings else 0),
            Family("outrider_watched_processes").add(len(readings)),
            Family("outrider_watched_cpu_seconds_total").add(t[0], "user").add(t[1], "system"),
            Family("outrider_watched_memory_rss_bytes").add(sum(r.stat.rss_bytes for r in readings.values())),
            tree_io,
            Family("outrider_watched_threads").add(sum(r.stat.threads for r in readings.values())),
            *self._identities.families(self._slots, {k: readings[k].stat.name for k in self._slots}),
        ]

    def _readings(self) -> dict[tuple[int, int], _Reading]:
        """This sweep's readings, by (pid, start ticks): a pid reused by a new process is another key."""
        readings: dict[tuple[int, int], _Reading] = {}
        for pid in self._pids():
            r = self._read(pid)
            if r is not None:
                readings[(pid, r.stat.start_ticks)] = r
        return readings

    def _advance(self, readings: dict[tuple[int, int], _Reading]) -> dict[tuple[int, int], tuple[float, ...]]:
        """Each process's counter deltas since the last sweep, added to the tree totals; processes gone since
        are forgotten (their counts stay in the totals)."""
        deltas: dict[tuple[int, int], tuple[float, ...]] = {}
        for key, r in readings.items():
            before = self._last.get(key, ZERO)
            now = r.counters(before)
            deltas[key] = tuple(max(0, a - b) for a, b in zip(now, before))
            self._last[key] = now
            self._tree_read.update(_read_groups(r))
        for key in [k for k in self._last if k not in readings]:
            del self._last[key]
        for d in deltas.values():
            for i, v in enumerate(d):
                self._tree[i] += v
        return deltas

    def _fill_slots(self, readings: dict[tuple[int, int], _Reading],
                    deltas: dict[tuple[int, int], tuple[float, ...]]) -> None:
        """Slots of exited processes free up; free slots go to the busiest processes not shown yet (CPU, then RSS)."""
        self._slots = [k for k in self._slots if k in readings]
        free = self._top_n - len(self._slots)
        if free > 0:
            shown = set(self._slots)
            candidates = sorted((k for k in readings if k not in shown),
                                key=lambda k: (deltas[k][0] + deltas[k][1], readings[k].stat.rss_bytes),
                                reverse=True)
            self._slots.extend(candidates[:free])

    def _add_to_other(self, readings: dict[tuple[int, int], _Reading],
                      deltas: dict[tuple[int, int], tuple[float, ...]]) -> tuple[int, int, int | None]:
        """Adds the counter deltas of the processes not shown to "other"; returns their gauges summed (RSS,
        threads, open fds: None while none of their fds could be read)."""
        shown = set(self._slots)
        other_rss = other_threads = 0
        other_fds: int | None = None
        for key, r in readings.items():
            if key in shown:
                continue
            for i, v in enumerate(deltas[key]):
                self._other[i] += v
            self._other_read.update(_read_groups(r))
            other_rss += r.stat.rss_bytes
            other_threads += r.stat.threads
            if r.fds is not None:
                other_fds = (other_fds or 0) + r.fds
        return other_rss, other_threads, other_fds

    def _process_families(self, readings: dict[tuple[int, int], _Reading],
                          other: tuple[int, int, int | None]) -> list[Family]:
        """The per-process families: one series set per slot, then pid="other" while anything is summed there."""
        cpu = Family("outrider_process_cpu_seconds_total")
        rss = Family("outrider_process_memory_rss_bytes")
        threads = Family("outrider_process_threads")
        fds = Family("outrider_process_open_fds")
        io = Family("outrider_process_io_bytes_total")
        ctx = Family("outrider_process_context_switches_total")
        for key in self._slots:
            r = readings[key]
            p, n = str(key[0]), r.stat.name
            cpu.add(r.stat.user_s, p, n, "user").add(r.stat.system_s, p, n, "system")
            rss.add(r.stat.rss_bytes, p, n)
            threads.add(r.stat.threads, p, n)
            if r.fds is not None:
                fds.add(r.fds, p, n)
            if r.io is not None:
                io.add(r.io[0], p, n, "read").add(r.io[1], p, n, "write")
            if r.ctx is not None:
                ctx.add(r.ctx[0], p, n, "voluntary").add(r.ctx[1], p, n, "involuntary")
        if len(readings) > len(self._slots) or any(self._other):
            o = self._other
            other_rss, other_threads, other_fds = other
            cpu.add(o[0], OTHER, OTHER, "user").add(o[1], OTHER, OTHER, "system")
            rss.add(other_rss, OTHER, OTHER)
            threads.add(other_threads, OTHER, OTHER)
            if other_fds is not None:
                fds.add(other_fds, OTHER, OTHER)
            if IO in self._other_read:
                io.add(o[2], OTHER, OTHER, "read").add(o[3], OTHER, OTHER, "write")
            if CTX in self._other_read:
                ctx.add(o[4], OTHER, OTHER, "voluntary").add(o[5], OTHER, OTHER, "involuntary")
        return [cpu, rss, threads, fds, io, ctx]


def _read_groups(r: _Reading) -> list[tuple[int, int]]:
    return [g for g, v in ((IO, r.io), (CTX, r.ctx)) if v is not None]
