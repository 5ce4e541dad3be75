"""Where the process's CPU goes, by thread role, and how long its threads waited for a CPU (run delay).

Read by the publisher thread once a flush from the process's own /proc/PID/task/*: `stat` (name, start time, CPU
ticks) and `schedstat` (nanoseconds on a CPU, nanoseconds runnable but waiting for one). The hook reads them, not
the agent, because only the process knows which of its threads are Python threads and which one runs the loop,
and because a sidecar without a shared PID namespace sees nothing of the workload's /proc.

Roles:
- **main**: the thread that runs the training loop (the one that completes steps; the process's main thread
  until one has);
- **intra_op**: threads Python did not start that carry the process's own name: compute pools that never name
  their threads (torch's intra-op pool: OpenMP / at::parallel workers; BLAS pools). The calling thread takes part
  in torch's parallel regions too, so main's CPU includes its share of the pool's work;
- **data_workers**: child processes and their descendants (DataLoader workers), all their threads, and the CPU of
  those already exited and reaped (the process's cutime + cstime), so a worker of a short epoch is not lost;
- **outrider**: the hook's own threads, named outrider-*;
- **other**: every other thread: Python threads of the workload, and native threads their library named
  (gloo_*, pt_autograd_*, pt_tcpstore_*, CUDA's).

Counters are cumulative per role: each thread's growth since the last read is added (a thread that ended takes
at most its last flush interval with it), so they never go backwards. The demand of a role is its CPU plus its
run delay: a thread that wants a CPU is either on one or queued for one, so the demand of a saturated thread is
one second per second whatever the neighbours do and however many cores the machine has.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

ROLES = ("main", "intra_op", "data_workers", "other", "outrider")
MAX_DESCENDANTS = 256
# A flush reads about this many descendant processes on average: a tree of n is read every n // 32 + 1 flushes
# (its counters carried meanwhile), so a workload with a thousand forked workers does not pay a thousand /proc
# reads a second for its own monitoring.
DESCENDANTS_PER_FLUSH = 32
MAX_DEPTH = 4
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
Key = tuple[int, int, int]  # (pid, tid, start ticks): a reused tid is a new thread


def python_threads() -> dict[int, str]:
    """Native id -> name of the threads Python started (threading's view)."""
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def reaped_children_cpu(proc_dir: str) -> float:
    """CPU seconds of the process's children that have exited and been waited for (cutime + cstime)."""
    try:
        with open(f"{proc_dir}/stat", "rb") as fh:
            raw = fh.read()
        fields = raw[raw.rindex(b")") + 2:].split()
        return (int(fields[13]) + int(fields[14])) / CLK_TCK
    except (OSError, ValueError, IndexError):
        return 0.0


def read_task(task_dir: str) -> tuple[str, int, float, float | None] | None:
    """(name, start ticks, CPU seconds, run delay seconds or None) of one task; None when it is gone."""
    try:
        with open(f"{task_dir}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    try:
        close = raw.rindex(b")")
        name = raw[raw.index(b"(") + 1:close].decode("utf-8", "replace")
        fields = raw[close + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
        start = int(fields[19])
    except (ValueError, IndexError):
        return None
    delay: float | None = None
    try:
        with open(f"{task_dir}/schedstat", "rb") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        cpu, delay = int(run_ns) / 1e9, int(wait_ns) / 1e9  # nanoseconds: finer than the ticks of stat
    except (OSError, ValueError):
        pass  # a kernel without schedstats: CPU from stat, no run delay
    return name, start, cpu, delay


class ThreadSampler:
    def __init__(self, hook: Any, loop_tid: Callable[[], int], proc_root: str = "/proc",
                 threads: Callable[[], dict[int, str]] = python_threads, getpid: Callable[[], int] = os.getpid) -> None:
        """hook: where the series go and whether the process has anything to say yet; loop_tid: the native id of
        the thread that completes steps (0: none yet); proc_root, threads, getpid: where /proc is, Python's
        threads and this process (seams for a fixture tree)."""
        self.hook = hook
        self.loop_tid = loop_tid
        self.root = proc_root
        self.threads = threads
        self.getpid = getpid
        self.pid = 0
        self.last: dict[Key, tuple[float, float]] = {}
        self.cpu = dict.fromkeys(ROLES, 0.0)
        self.delay = dict.fromkeys(ROLES, 0.0)
        self.count = dict.fromkeys(ROLES, 0)
        self.has_delay = False
        self._skip = 0  # flushes left before the descendants are read again
        self._workers = 0  # descendants' threads at their last read

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

    def read(self) -> None:
        """Add each thread's growth since the last read to its role's totals."""
        pid = self.getpid()
        if pid != self.pid:  # first read, or a forked child: its parent's totals are the parent's
            self.pid = pid
            self._skip = 0
            self.last.clear()
            self.cpu = dict.fromkeys(ROLES, 0.0)
            self.delay = dict.fromkeys(ROLES, 0.0)
        seen: dict[Key, tuple[float, float]] = {}
        count = dict.fromkeys(ROLES, 0)
        main = self.loop_tid() or pid
        python = self.threads()
        own = self._tasks(pid)
        main_name = own.get(pid, ("", 0, 0.0, None))[0]
        for tid, (name, start, cpu, delay) in own.items():
            if tid == main:
                role = "main"
            elif tid in python:
                role = "outrider" if python[tid].startswith("outrider") else "other"
            else:
                role = "intra_op" if name == main_name else "other"
            self._add(seen, count, role, (pid, tid, start), cpu, delay)
        if self._skip > 0:  # not this flush: the descendants' last readings stand, to be compared with next time
            self._skip -= 1
            seen.update((key, v) for key, v in self.last.items() if key[0] != pid)
            count["data_workers"] = self._workers
        else:
            workers_cpu = reaped_children_cpu(f"{self.root}/{pid}")
            children = self._descendants(pid, list(own))
            for child in children:
                for tid, (_, start, cpu, delay) in self._tasks(child).items():
                    workers_cpu += cpu
                    self._add(seen, count, "data_workers", (child, tid, start), 0.0, delay)
            # Workers' CPU as a whole, not thread by thread: a reaped worker's CPU moves into cutime, so the sum
            # only grows (the max() absorbs the difference between schedstat's nanoseconds and cutime's ticks)
            self.cpu["data_workers"] = max(self.cpu["data_workers"], workers_cpu)
            self._skip = len(children) // DESCENDANTS_PER_FLUSH
            self._workers = count["data_workers"]
        self.last = seen
        self.count = count

    def _add(self, seen: dict[Key, tuple[float, float]], count: dict[str, int], role: str, key: Key, cpu: float,
             delay: float | None) -> None:
        if delay is not None:
            self.has_delay = True
        before = self.last.get(key, (0.0, 0.0))
        self.cpu[role] += max(0.0, cpu - before[0])
        self.delay[role] += max(0.0, (delay or 0.0) - before[1])
        seen[key] = (cpu, delay or 0.0)
        count[role] += 1

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

    def _descendants(self, pid: int, tids: list[int]) -> list[int]:
        """Child processes of every thread of pid, and theirs, breadth first (a fork server's children too)."""
        out: list[int] = []
        level = [(pid, tids)]
        for _ in range(MAX_DEPTH):
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
            with open(f"{self.root}/{pid}/task/{tid}/children", "rb") as fh:
                return [int(x) for x in fh.read().split()]
        except (OSError, ValueError):
            return []

    def _tasks_ids(self, pid: int) -> list[int]:
        try:
            return [int(e) for e in os.listdir(f"{self.root}/{pid}/task") if e.isdigit()]
        except OSError:
            return []
