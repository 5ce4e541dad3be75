"""Where the process's CPU goes, by thread role, and how long its threads waited for a CPU (run delay).

Read by the publisher thread once a flush. The hook reads it, not the agent, because only the process knows which
of its threads are Python threads and which one runs the loop, and because a sidecar without a shared PID
namespace sees nothing of the workload's /proc.

Roles:
- **main**: the thread that runs the training loop (the one that completes steps; the process's main thread
  until one has);
- **intra_op**: threads Python did not start that carry the process's own name: compute pools that never name
  their threads (torch's intra-op pool: OpenMP / at::parallel workers; BLAS pools). The calling thread takes part
  in torch's parallel regions too, so main's CPU includes its share of the pool's work;
- **data_workers**: child processes and their descendants (DataLoader workers), all their threads, and the CPU of
  those already exited and reaped (the process's cutime + cstime), so a worker of a short epoch is not lost; how
  many processes they are is published beside their threads (a DataLoader worker runs three threads, so a role's
  demand per thread would read a worker decoding flat out as a third busy);
- **outrider**: the hook's own thread, named outrider-hook (by threading, or in the kernel where a green-thread
  library patched threading: hook/native.py);
- **other**: every other thread: Python threads of the workload, and native threads their library named
  (gloo_*, pt_autograd_*, pt_tcpstore_*, CUDA's).

What a flush costs grows with the process's threads only by what the kernel makes cheap: one CPU-clock read per
thread (clock_gettime on the thread's CPU clock: one system call, no file to open, the nanoseconds schedstat
shows), Python's list of its threads, and the name of a thread once, when it is first seen. A thread-per-request
service with 2,000 threads used to pay three /proc files per thread per flush (100 ms). Bounded per flush:
- the **task list** (/proc/PID/task, for the threads Python did not start) is read every LIST_EVERY flushes;
- a **look** at a thread (/proc/PID/task/TID/schedstat, its run delay: nanoseconds runnable but waiting for a CPU;
  and /proc/PID/task/TID/children, the processes it forked) is taken for at most LOOKS_PER_FLUSH threads, among
  those that ran since their last look (a thread that has not run has neither waited, unless it starves and is
  looked at once it runs, nor forked), the loop's thread first, then the others in the order they fell due; a
  delay read later is counted then, once; a child process found is remembered until it ends;
- **descendant processes** (the data workers) are read every n // DESCENDANTS_PER_FLUSH + 1 flushes.

Counters are cumulative per role: each thread's growth since its last reading is added, so they never go
backwards and nothing counts twice. Nothing is lost either: the process's own CPU clock counts every thread that
ever ran, ended ones too, so what the threads' readings do not explain (threads that ended since their last
reading, and threads that started and ended between two reads) goes, at each flush that lists the tasks, to the
roles of the threads that ended, by what each used in its last interval ("other" when none is known to have
ended); at a listing flush the roles add up to the process's CPU. A thread that ended takes with it only its run
delay since that was last read. Where thread CPU clocks are refused (a sandboxed kernel) or /proc is a fixture
tree, the same is read from the tasks' schedstat and stat files.

The demand of a role is its CPU plus its run delay: a thread that wants a CPU is either on one or queued for one,
so the demand of a saturated thread is one second per second whatever the neighbours do and however many cores
the machine has.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from outrider.kernel.procfs import parent_pid, read_cpu, read_schedstat, read_task, read_task_children

ROLES = ("main", "intra_op", "data_workers", "other", "outrider")
MAX_DESCENDANTS = 256
# A flush reads about this many descendant processes on average: a tree of n is read every n // 32 + 1 flushes
# (its counters carried meanwhile), so a workload with a thousand forked workers does not pay a thousand /proc
# reads a second for its own monitoring.
DESCENDANTS_PER_FLUSH = 32
# Threads a flush looks at (their run delay and their child processes: two /proc files each) at most: about
# 0.5 ms of the publisher's CPU.
LOOKS_PER_FLUSH = 24
# Threads Python did not start are found in /proc/PID/task, listed every LIST_EVERY flushes (2,000 threads: about
# 1.5 ms): a native thread is counted from its first listing (its CPU clock holds all it used), one that ended
# unlisted by the process clock at the next listing
LIST_EVERY = 8
MAX_DEPTH = 4
Key = tuple[int, int, int]  # (pid, tid, start ticks): a reused tid is a new thread


def python_threads() -> dict[int, str]:
    """Native id -> name of the threads Python started (threading's view; a green library's thread objects may
    have no native id: eventlet's)."""
    return {tid: t.name for t in threading.enumerate() if (tid := getattr(t, "native_id", None)) is not None}


class Clocks(Protocol):
    def thread_cpu(self, pid: int, tid: int) -> float | None:
        """CPU seconds of one thread of pid so far; None when it is gone."""

    def process_cpu(self, pid: int) -> float | None:
        """CPU seconds of the whole process so far, its ended threads included (not its children)."""


def thread_clock(tid: int) -> int:
    """The CPU clock id of a thread of this process (Linux's MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED))."""
    return ((~tid) << 3) | 6


class OwnClocks:
    """This process's CPU clocks: a thread's (thread_clock) is readable for the threads of the calling process
    only; the process's counts its ended threads too."""

    @staticmethod
    def thread_cpu(pid: int, tid: int) -> float | None:
        try:
            return time.clock_gettime_ns(thread_clock(tid)) / 1e9
        except OSError:  # EINVAL: no such thread (it ended)
            return None

    @staticmethod
    def process_cpu(pid: int) -> float | None:
        return time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID) / 1e9

    @classmethod
    def work(cls) -> bool:
        """Whether this kernel gives threads' CPU clocks, and they agree with /proc (a sandbox may not)."""
        tid = threading.get_native_id()
        own = cls.thread_cpu(0, tid)
        sched = read_schedstat(f"/proc/self/task/{tid}")
        return own is not None and (sched is None or abs(own - sched[0]) < 1.0)


class ProcClocks:
    """The same from /proc files (a fixture tree, or a kernel that refuses thread clocks): a task's schedstat,
    else its stat's ticks; the process's stat."""

    def __init__(self, root: str) -> None:
        self.root = root

    def thread_cpu(self, pid: int, tid: int) -> float | None:
        task = read_task(f"{self.root}/{pid}/task/{tid}")
        return task[2] if task is not None else None

    def process_cpu(self, pid: int) -> float | None:
        stat = read_cpu(f"{self.root}/{pid}/stat")
        return stat[1] if stat is not None else None


class _Thread:
    """What the sampler keeps of one thread of its own process between flushes."""

    __slots__ = ("clock", "cpu", "cpu_at_look", "delay", "grew", "looked", "name", "pyname", "queued", "role")

    def __init__(self, tid: int, name: str | None) -> None:
        self.clock = thread_clock(tid)
        self.name = name  # as /proc had it when first seen; None for a Python thread (threading names those)
        self.role = "other"
        self.cpu = 0.0  # at the last flush
        self.grew = 0.0  # in the last flush's interval
        self.delay = 0.0  # run delay at its last look
        self.cpu_at_look = 0.0  # CPU at its last look: more since means it ran, and may have waited or forked
        self.looked = -1  # the flush of its last look (its run delay and its children)
        self.queued = False  # in the queue of threads due a look
        self.pyname: str | None = None  # threading's name when its role was last decided (a Python thread)


def _role(t: _Thread, name: str | None, main_name: str) -> str:
    """The role of a thread other than the loop's that ran since the last read; `name` is threading's name for it
    (None: a thread Python did not start)."""
    if name is not None:
        if name is not t.pyname or t.role == "main":  # threading's name: the same object until renamed
            t.pyname = name
            t.role = "outrider" if name.startswith("outrider") else "other"
        return t.role
    if t.name is None:  # a Python thread threading has let go of, on its way out: still what it was
        return t.role
    if t.name.startswith("outrider"):  # the hook's thread where threading does not know it (gevent)
        return "outrider"
    return "intra_op" if t.name == main_name else "other"


class ThreadCpuAccounting:
    def __init__(self, hook: Any, loop_tid: Callable[[], int], proc_root: str = "/proc",
                 threads: Callable[[], dict[int, str]] = python_threads, getpid: Callable[[], int] = os.getpid,
                 clocks: Clocks | None = None) -> None:
        """hook: where the series go and whether the process has anything to say yet; loop_tid: the native id of
        the thread that completes steps (0: none yet); proc_root, threads, getpid, clocks: where /proc is,
        Python's threads, this process and its CPU clocks (seams for a fixture tree; the clocks are the
        process's own where the kernel gives them, else read from proc_root)."""
        self.hook = hook
        self.loop_tid = loop_tid
        self.root = proc_root
        self.threads = threads
        self.getpid = getpid
        if clocks is None:
            clocks = OwnClocks() if proc_root == "/proc" and OwnClocks.work() else ProcClocks(proc_root)
        self.clocks = clocks
        self.pid = 0
        self.known: dict[int, _Thread] = {}  # the process's own threads at the last read
        self.children: dict[int, None] = {}  # child processes seen in a thread's children, until they end
        self.last: dict[Key, tuple[float, float]] = {}  # the descendants' threads: (CPU, delay) at their last read
        self.cpu = dict.fromkeys(ROLES, 0.0)
        self.delay = dict.fromkeys(ROLES, 0.0)
        self.count = dict.fromkeys(ROLES, 0)
        self.has_delay = False
        self.flushes = 0
        self._listed = -LIST_EVERY  # the flush that last listed /proc/PID/task
        self._process_cpu = 0.0  # the process's CPU clock at the last read
        self._unexplained = 0.0  # what the process used beyond its threads' readings, not yet given to a role
        self._ended = dict.fromkeys(ROLES, 0.0)  # by role, what the threads that ended since then used last
        self._due: collections.deque[int] = collections.deque()  # threads that ran since their last look, in turn
        self._skip = 0  # flushes left before the descendants are read again
        self._workers = 0  # descendants' threads at their last read
        self.processes = 0  # descendant processes (the data workers) at their last read

    def sample(self) -> None:
        p = self.hook.progress
        if not (p.steps or p.training or p.serving_seen):
            return  # nothing to describe yet (and no shard to create for it)
        self.read()
        series = self.hook.series
        for role in ROLES:
            labels = {"role": role}
            series("counter", "outrider_thread_cpu_seconds_total", labels, builtin=True).set_total(self.cpu[role])
            if self.has_delay:
                series("counter", "outrider_thread_run_delay_seconds_total", labels,
                       builtin=True).set_total(self.delay[role])
            series("gauge", "outrider_threads", labels, builtin=True).set(self.count[role])
        series("gauge", "outrider_child_processes", {}, builtin=True).set(self.processes)

    def read(self) -> None:
        """Add each thread's growth since the last read to its role's totals."""
        pid = self.getpid()
        if pid != self.pid:  # first read, or a forked child: its parent's totals are the parent's
            self.pid = pid
            self._skip = 0
            self.known.clear()
            self._due.clear()
            self.children.clear()
            self.last.clear()
            self.cpu = dict.fromkeys(ROLES, 0.0)
            self.delay = dict.fromkeys(ROLES, 0.0)
            self._process_cpu = self._unexplained = 0.0
            self._ended = dict.fromkeys(ROLES, 0.0)
            self._listed = -LIST_EVERY
        self.flushes += 1
        count = dict.fromkeys(ROLES, 0)
        self._own(pid, count)
        self._descendants_cpu(pid, count)
        self.count = count

    # --- the process's own threads ----------------------------------------------------------------------------

    def _own(self, pid: int, count: dict[str, int]) -> None:
        process_cpu = self.clocks.process_cpu(pid)  # before the threads: what they add meanwhile is theirs
        base = f"{self.root}/{pid}/task"
        leader = read_cpu(f"{self.root}/{pid}/stat")
        main_name = leader[0] if leader is not None else ""
        main = self.loop_tid() or pid
        python = self.threads()
        known, seen = self.known, {}
        listed, pairs = self._pairs(base, python)
        own_clocks = isinstance(self.clocks, OwnClocks)
        thread_cpu = self.clocks.thread_cpu
        clock = time.clock_gettime_ns
        queue = self._due
        # per role: [CPU seconds grown, threads]: one lookup per thread
        acc: dict[str, list[float]] = {role: [0.0, 0] for role in ROLES}
        for tid, t in pairs:
            if own_clocks:  # OwnClocks.thread_cpu, inline: this runs for every thread, every flush
                try:
                    now = clock(t.clock if t is not None else thread_clock(tid)) / 1e9
                except OSError:
                    continue  # ended: what it used since its last reading is the process clock's to tell
            else:
                reading = thread_cpu(pid, tid)
                if reading is None:
                    continue
                now = reading
            if t is not None and now == t.cpu and tid != main:  # idle since the last read: nothing to add
                t.grew = 0.0
                seen[tid] = t
                acc[t.role][1] += 1
                continue
            name = python.get(tid)
            if t is None or now < t.cpu:  # first seen, or a new thread on a reused tid: counted from zero
                t = _Thread(tid, None if name is not None else self._name(base, tid))
            if tid == main:
                role = "main"
            elif name is not None and name is t.pyname and t.role != "main":
                role = t.role  # a Python thread not renamed since its role was decided: most of them, no call
            else:
                role = _role(t, name, main_name)
            grew = now - t.cpu
            a = acc[role]
            a[0] += grew
            a[1] += 1
            t.cpu, t.grew, t.role = now, grew, role
            seen[tid] = t
            if not t.queued and tid != main and now > t.cpu_at_look:
                t.queued = True  # due a look: in line behind the threads that ran before it
                queue.append(tid)
        explained = 0.0
        for role, (grown, threads) in acc.items():
            self.cpu[role] += grown
            explained += grown
            count[role] += int(threads)
        self.known = seen
        self._look(base, main)
        self._note_ended(known, seen)
        if process_cpu is not None:
            self._settle(process_cpu, explained, listed)

    def _pairs(self, base: str, python: dict[int, str]) -> tuple[bool, list[tuple[int, _Thread | None]]]:
        """The threads to read this flush, each with what was kept of it (None: new), and whether the task list
        was read for them: every LIST_EVERY flushes; between listings, the threads of the last listing that live
        on and Python's (a new native one waits for the next listing)."""
        known = self.known
        if self.flushes - self._listed < LIST_EVERY:
            pairs: list[tuple[int, _Thread | None]] = list(known.items())
            pairs += [(tid, None) for tid in python if tid not in known]
            return False, pairs
        self._listed = self.flushes
        try:
            return True, [(tid, known.get(tid)) for tid in map(int, filter(str.isdigit, os.listdir(base)))]
        except OSError:
            return True, []

    def _note_ended(self, known: dict[int, _Thread], seen: dict[int, _Thread]) -> None:
        """The threads that ended since the last read: their roles share what the process clock says is left, by
        what each used in its last interval."""
        for tid, t in known.items():
            if tid not in seen:
                self._ended[t.role] += t.grew or 1e-9

    def _settle(self, process_cpu: float, explained: float, listed: bool) -> None:
        """What the process clock grew beyond the threads' readings (`explained`), kept until a flush that listed
        the tasks gives it to the ended threads' roles: before, a native thread that started since the last
        listing is in the process clock already, and counted as itself once listed."""
        self._unexplained += (process_cpu - self._process_cpu) - explained
        self._process_cpu = process_cpu
        if listed and self._unexplained > 0:
            self._credit_ended(self._unexplained)
            self._unexplained = 0.0

    def _name(self, base: str, tid: int) -> str:
        stat = read_cpu(f"{base}/{tid}/stat")
        return stat[0] if stat is not None else ""

    def _look(self, base: str, main: int) -> None:
        """A look at up to LOOKS_PER_FLUSH threads that ran since their last: their run delay, and the child
        processes they forked (remembered until they end). The loop's thread first, then the others in the order
        they fell due (a queue: the longest waiting first, each popped once)."""
        known = self.known
        loop = known.get(main)
        order = [main] if loop is not None and (loop.cpu > loop.cpu_at_look or loop.looked < 0) else []
        queue = self._due
        if len(queue) > 2 * len(known) + LOOKS_PER_FLUSH:  # ended threads' places pile up behind the live ones'
            queue = self._due = collections.deque(tid for tid in queue if tid in known and known[tid].queued)
        while queue and len(order) < LOOKS_PER_FLUSH:
            tid = queue.popleft()
            t = known.get(tid)
            if t is not None and t.queued:  # else it ended (or its tid is another thread's now)
                t.queued = False
                if tid != main:
                    order.append(tid)
        for tid in order:
            t = known[tid]
            t.cpu_at_look, t.looked = t.cpu, self.flushes
            for child in self._children(self.pid, tid):
                if len(self.children) < MAX_DESCENDANTS:
                    self.children[child] = None
            sched = read_schedstat(f"{base}/{tid}")
            if sched is None:
                continue
            self.has_delay = True
            self.delay[t.role] += max(0.0, sched[1] - t.delay)
            t.delay = sched[1]

    def _credit_ended(self, seconds: float) -> None:
        """CPU the process used that no live thread's reading holds: ended threads' last interval, and threads that
        lived between two reads. Split over the roles of the threads that ended since the last credit, by what each
        used in its last interval; "other" when none is known to have ended."""
        weights, self._ended = self._ended, dict.fromkeys(ROLES, 0.0)
        total = sum(weights.values())
        if not total:
            self.cpu["other"] += seconds
            return
        for role, w in weights.items():
            if w:
                self.cpu[role] += seconds * w / total

    # --- descendant processes (the data workers) ----------------------------------------------------------------

    def _descendants_cpu(self, pid: int, count: dict[str, int]) -> None:
        if self._skip > 0:  # not this flush: the descendants' last readings stand, to be compared with next time
            self._skip -= 1
            count["data_workers"] = self._workers
            return
        seen: dict[Key, tuple[float, float]] = {}
        leader = read_cpu(f"{self.root}/{pid}/stat")
        workers_cpu = leader[2] if leader is not None else 0.0  # those exited and reaped
        children = self._descendants(pid)
        for child in children:
            for tid, (_, start, cpu, delay) in self._tasks(child).items():
                workers_cpu += cpu
                if delay is not None:
                    self.has_delay = True
                key = (child, tid, start)
                self.delay["data_workers"] += max(0.0, (delay or 0.0) - self.last.get(key, (0.0, 0.0))[1])
                seen[key] = (cpu, delay or 0.0)
                count["data_workers"] += 1
        # Workers' CPU as a whole, not thread by thread: a reaped worker's CPU moves into cutime, so the sum only
        # grows (the max() absorbs the difference between schedstat's nanoseconds and cutime's ticks)
        self.cpu["data_workers"] = max(self.cpu["data_workers"], workers_cpu)
        self._skip = len(children) // DESCENDANTS_PER_FLUSH
        self._workers = count["data_workers"]
        self.processes = len(children)
        self.last = seen

    def _tasks(self, pid: int) -> dict[int, tuple[str, int, float, float | None]]:
        base = f"{self.root}/{pid}/task"
        out: dict[int, tuple[str, int, float, float | None]] = {}
        try:
            names = os.listdir(base)
        except OSError:
            return out
        for entry in names:
            if entry.isdigit():
                reading = read_task(f"{base}/{entry}")
                if reading is not None:
                    out[int(entry)] = reading
        return out

    def _descendants(self, pid: int) -> list[int]:
        """The child processes the threads' looks found, while they live (a pid reused by another process is not
        ours: its parent tells), and their children, breadth first (a fork server's children too)."""
        out: list[int] = []
        level: list[tuple[int, list[int]]] = []
        for child in list(self.children):
            tids = self._tasks_ids(child) if parent_pid(self.root, child) == pid else []
            if not tids:
                del self.children[child]
                continue
            out.append(child)
            level.append((child, tids))
        for _ in range(MAX_DEPTH - 1):
            nxt: list[tuple[int, list[int]]] = []
            for parent, parent_tids in level:
                for tid in parent_tids:
                    for child in self._children(parent, tid):
                        if len(out) < MAX_DESCENDANTS and child not in out:
                            out.append(child)
                            nxt.append((child, list(self._tasks_ids(child))))
            if not nxt:
                break
            level = nxt
        return out

    def _children(self, pid: int, tid: int) -> list[int]:
        try:
            return read_task_children(self.root, pid, tid)
        except (OSError, ValueError):
            return []

    def _tasks_ids(self, pid: int) -> list[int]:
        try:
            return [int(e) for e in os.listdir(f"{self.root}/{pid}/task") if e.isdigit()]
        except OSError:
            return []
