"""Where a process's CPU goes, by thread role (hook/threads.py): against a fixture /proc tree (roles by what Python
knows and by name, counters that never go backwards, reaped workers kept) and against this very process."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from outrider.hook.runtime import Hook
from outrider.hook.settings import HookSettings
from outrider.hook.threads import OwnClocks, ThreadCpuAccounting

TCK = os.sysconf("SC_CLK_TCK")
PID = 100


def stat_line(tid: int, pid: int, name: str, cpu_s: float, reaped_s: float = 0.0, start: int = 1000) -> str:
    """A stat file (CPU split evenly into user and system ticks); the parent is PID, or 1 for PID itself."""
    ticks = round(cpu_s * TCK)
    fields = ["S", "1" if pid == PID else str(PID), str(pid), str(pid), "0", "-1", "0", "0", "0", "0", "0",
              str(ticks // 2), str(ticks - ticks // 2), str(round(reaped_s * TCK)), "0", "20", "0", "1", "0",
              str(start)] + ["0"] * 32
    return f"{tid} ({name}) {' '.join(fields)}\n"


def write_task(root: Path, pid: int, tid: int, name: str, cpu_s: float, delay_s: float | None = None,
               start: int = 1000, children: str = "", reaped_s: float = 0.0) -> None:
    """A task's stat, schedstat (nanoseconds) and children. The leader's stat is the process's too, until
    write_process says what all its threads used."""
    task = root / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    (task / "stat").write_text(stat_line(tid, pid, name, cpu_s, reaped_s, start))
    if delay_s is not None:
        (task / "schedstat").write_text(f"{round(cpu_s * 1e9)} {round(delay_s * 1e9)} 10\n")
    (task / "children").write_text(children)
    if tid == pid:
        (root / str(pid) / "stat").write_text((task / "stat").read_text())


def write_process(root: Path, pid: int, cpu_s: float, reaped_s: float = 0.0) -> None:
    """The process's stat: the CPU of all its threads, ended ones included, and its reaped children's (cutime)."""
    (root / str(pid) / "stat").write_text(stat_line(pid, pid, "python", cpu_s, reaped_s))


def tree(root: Path, main_cpu: float = 5.0, pool_cpu: float = 3.0, worker_cpu: float = 2.0, reaped_s: float = 0.0,
         with_worker: bool = True) -> None:
    write_task(root, PID, PID, "python", main_cpu, 1.0, children="200" if with_worker else "", reaped_s=reaped_s)
    write_task(root, PID, 101, "python", pool_cpu, 0.5)  # an OpenMP worker: native, the process's own name
    write_task(root, PID, 102, "gloo_tcp_loop", 0.4, 0.1)  # a native thread its library named
    write_task(root, PID, 103, "python", 0.2, 0.0)  # a Python thread of the workload
    write_task(root, PID, 104, "python", 0.1, 0.0)  # the hook's publisher
    write_process(root, PID, main_cpu + pool_cpu + 0.4 + 0.2 + 0.1, reaped_s)
    if with_worker:
        write_task(root, 200, 200, "pt_data_worker", worker_cpu, 0.3)


def sampler(root: Path, tmp_path: Path) -> tuple[ThreadCpuAccounting, Hook]:
    hook = Hook(HookSettings(spool_dir=str(tmp_path / "spool"), standalone=False))
    hook.progress.steps = 1
    python = {PID: "MainThread", 103: "loader-prefetch", 104: "outrider-hook"}
    return ThreadCpuAccounting(hook, lambda: 0, str(root), lambda: dict(python), lambda: PID), hook


def published(hook: Hook, name: str) -> dict[str, float]:
    return {dict(labels)["role"]: s.total()[0] for (n, labels), s in hook.registry._series.items() if n == name}


def test_roles_from_what_python_knows_and_from_names(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    tree(root)
    s, hook = sampler(root, tmp_path)
    s.sample()
    cpu = published(hook, "outrider_thread_cpu_seconds_total")
    assert cpu == pytest.approx({"main": 5.0, "intra_op": 3.0, "data_workers": 2.0, "other": 0.6, "outrider": 0.1})
    delay = published(hook, "outrider_thread_run_delay_seconds_total")
    assert delay == pytest.approx({"main": 1.0, "intra_op": 0.5, "data_workers": 0.3, "other": 0.1, "outrider": 0.0})
    assert published(hook, "outrider_threads") == {"main": 1, "intra_op": 1, "data_workers": 1, "other": 2,
                                                   "outrider": 1}
    assert processes(hook) == 1.0


def processes(hook: Hook) -> float:
    """The published count of child processes (the data workers), whose threads the roles count."""
    (value,) = [s.total()[0] for (n, _), s in hook.registry._series.items() if n == "outrider_child_processes"]
    return float(value)


def test_counters_never_go_backwards_and_reaped_workers_are_kept(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    tree(root)
    s, hook = sampler(root, tmp_path)
    s.sample()
    # the pool thread ends, a new thread reuses tid 103, and the worker exits and is reaped (its CPU in cutime)
    import shutil

    shutil.rmtree(root)
    write_task(root, PID, PID, "python", 6.0, 1.0, reaped_s=2.5)
    write_task(root, PID, 102, "gloo_tcp_loop", 0.4, 0.1)
    write_task(root, PID, 103, "python", 0.05, 0.0, start=5000)
    write_task(root, PID, 104, "python", 0.1, 0.0)
    s.sample()
    cpu = published(hook, "outrider_thread_cpu_seconds_total")
    assert cpu["main"] == pytest.approx(6.0)
    assert cpu["intra_op"] == pytest.approx(3.0), "an ended thread keeps what it used"
    assert cpu["other"] == pytest.approx(0.4 + 0.2 + 0.05), "a reused tid is a new thread, counted from zero"
    assert cpu["outrider"] == pytest.approx(0.1)
    assert cpu["data_workers"] == pytest.approx(2.5), "the reaped worker's full CPU, from cutime"
    assert processes(hook) == 0.0, "a reaped worker is no process any more"


def test_without_schedstat_cpu_comes_from_ticks_and_no_run_delay_is_claimed(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    write_task(root, PID, PID, "python", 4.0)
    s, hook = sampler(root, tmp_path)
    s.sample()
    assert published(hook, "outrider_thread_cpu_seconds_total")["main"] == pytest.approx(4.0)
    assert published(hook, "outrider_thread_run_delay_seconds_total") == {}


def test_nothing_is_published_before_the_process_does_anything(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    tree(root)
    s, hook = sampler(root, tmp_path)
    hook.progress.steps = 0
    s.sample()
    assert not hook.registry.has_data(), "no shard for a process that has not trained or served"


def test_this_process_threads_by_role(tmp_path: Path) -> None:
    """Real /proc: a Python thread's CPU lands in other, the loop thread's in main."""
    hook = Hook(HookSettings(spool_dir=str(tmp_path), standalone=False))
    hook.progress.steps = 1
    done = threading.Event()

    def spin() -> None:
        x = 0
        while not done.is_set():
            x += 1

    s = ThreadCpuAccounting(hook, threading.get_native_id)
    s.sample()
    before = published(hook, "outrider_thread_cpu_seconds_total")
    t = threading.Thread(target=spin, name="user-thread")
    t.start()
    try:
        sum(i * i for i in range(3_000_000))  # the loop thread's own work, while the other thread spins
        s.sample()  # (a thread that has ended keeps only what was read while it lived)
    finally:
        done.set()
        t.join()
    after = published(hook, "outrider_thread_cpu_seconds_total")
    assert after["main"] > before["main"] and after["other"] > before["other"]
    assert published(hook, "outrider_threads")["main"] == 1


def test_ended_threads_leave_nothing_behind_in_the_sampler(tmp_path: Path) -> None:
    """A thread-per-request process: real threads start and end between reads; what the sampler keeps per thread
    (its last reading) never outgrows the threads alive at the read."""
    hook = Hook(HookSettings(spool_dir=str(tmp_path), standalone=False))
    hook.progress.steps = 1
    s = ThreadCpuAccounting(hook, threading.get_native_id)
    kept = []
    for _ in range(30):
        release = threading.Event()
        threads = [threading.Thread(target=release.wait) for _ in range(20)]
        for t in threads:
            t.start()
        s.read()
        alive = len(os.listdir(f"/proc/{os.getpid()}/task"))  # ours are still alive: they wait for release
        kept.append((len(s.known), alive))
        release.set()
        for t in threads:
            t.join()
    s.read()
    assert all(n <= alive + 1 for n, alive in kept), kept  # (+1: a thread of pytest's that ended meanwhile)
    assert len(s.known) <= len(os.listdir(f"/proc/{os.getpid()}/task")) + 1
    assert len(s.known) < 30, "the 600 ended threads are gone from the sampler"


def test_a_large_tree_of_workers_is_read_every_few_flushes_and_counted_exactly_once(tmp_path: Path) -> None:
    """100 forked workers: the flush reads them every 100 // 32 + 1 = 4 flushes, carrying their last readings
    between, so the workload's own cost per flush stays about that of 32 workers, and no delay counts twice."""
    from outrider.hook import threads

    root, n = tmp_path / "proc", 100
    kids = " ".join(str(1000 + i) for i in range(n))
    write_task(root, PID, PID, "python", 5.0, 1.0, children=kids)
    for i in range(n):
        write_task(root, 1000 + i, 1000 + i, "pt_data_worker", 1.0, 0.5)
    s, hook = sampler(root, tmp_path)
    reads: list[int] = []
    real = s._tasks
    s._tasks = lambda pid: (reads.append(pid), real(pid))[1]  # type: ignore[method-assign]
    s.sample()
    first = sum(1 for pid in reads if pid != PID)
    assert first == n and threads.DESCENDANTS_PER_FLUSH == 32
    for i in range(n):  # every worker uses another second of CPU and waits another 0.5 s
        write_task(root, 1000 + i, 1000 + i, "pt_data_worker", 2.0, 1.0)
    reads.clear()
    for _ in range(3):
        s.sample()
    assert [pid for pid in reads if pid != PID] == [], "three flushes carry the last readings"
    assert published(hook, "outrider_threads")["data_workers"] == n
    assert processes(hook) == n, "the processes read last, carried like their threads"
    assert published(hook, "outrider_thread_run_delay_seconds_total")["data_workers"] == pytest.approx(0.5 * n)
    s.sample()  # the fourth reads them again: each worker's growth once
    assert published(hook, "outrider_thread_cpu_seconds_total")["data_workers"] == pytest.approx(2.0 * n)
    assert published(hook, "outrider_thread_run_delay_seconds_total")["data_workers"] == pytest.approx(1.0 * n)


def test_what_a_thread_used_after_its_last_reading_is_kept_when_it_ends(tmp_path: Path) -> None:
    """The pool thread is read at 3 s, uses another 0.5 s and ends before the next read: the process's CPU (its
    stat, all threads ever) still holds that half second, and the next flush that lists the tasks gives it to the
    ended thread's role."""
    root = tmp_path / "proc"
    tree(root)
    s, hook = sampler(root, tmp_path)
    s.sample()
    import shutil

    from outrider.hook import threads

    shutil.rmtree(root / str(PID) / "task" / "101")
    write_task(root, PID, PID, "python", 6.0, 1.0, children="200")
    write_process(root, PID, 6.0 + 3.5 + 0.4 + 0.2 + 0.1)
    s.sample()
    assert published(hook, "outrider_thread_cpu_seconds_total")["intra_op"] == pytest.approx(3.0), \
        "given at a flush that lists the tasks (a thread started unlisted would be in the process clock too)"
    for _ in range(threads.LIST_EVERY - 1):
        s.sample()
    cpu = published(hook, "outrider_thread_cpu_seconds_total")
    assert cpu["intra_op"] == pytest.approx(3.5), "the ended thread's last half second"
    assert cpu["main"] == pytest.approx(6.0) and cpu["other"] == pytest.approx(0.6)
    assert published(hook, "outrider_threads")["intra_op"] == 0


class CountingClocks:
    """Thread CPU clocks as a dict the test sets (as OwnClocks, no /proc file per thread), counting reads."""

    def __init__(self) -> None:
        self.cpu: dict[int, float] = {}
        self.process = 0.0

    def thread_cpu(self, pid: int, tid: int) -> float | None:
        return self.cpu.get(tid)

    def process_cpu(self, pid: int) -> float | None:
        return self.process


def test_a_flush_looks_at_a_bounded_number_of_threads_and_counts_each_delay_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """200 threads that all ran: a flush reads the run delay (a /proc file) of at most LOOKS_PER_FLUSH of them, the
    loop's thread every time, the others longest unseen first, so within ceil(199 / 31) flushes each was read, its
    delay counted once; a thread that did not run since is not read again; CPU comes from the clocks every flush."""
    from outrider.hook import threads

    root, n = tmp_path / "proc", 200
    clocks = CountingClocks()
    write_task(root, PID, PID, "python", 1.0, 0.5)
    clocks.cpu[PID] = 1.0
    for i in range(1, n):
        write_task(root, PID, PID + i, "python", 1.0, 0.5)
        clocks.cpu[PID + i] = 1.0
    clocks.process = 1.0 * n
    hook = Hook(HookSettings(spool_dir=str(tmp_path / "spool"), standalone=False))
    hook.progress.steps = 1
    s = ThreadCpuAccounting(hook, lambda: 0, str(root), dict, lambda: PID, clocks)
    looked: list[int] = []
    real = threads.read_schedstat
    monkeypatch.setattr(threads, "read_schedstat", lambda d: (looked.append(int(d.rsplit("/", 1)[1])), real(d))[1])
    per_flush = []
    flushes = -(-(n - 1) // (threads.LOOKS_PER_FLUSH - 1))
    for _ in range(flushes):
        looked.clear()
        s.sample()
        per_flush.append(list(looked))
    assert all(len(f) <= threads.LOOKS_PER_FLUSH for f in per_flush), [len(f) for f in per_flush]
    assert all(f[0] == PID for f in per_flush[:1]), "the loop's thread first"
    assert sorted(t for f in per_flush for t in f if t != PID) == list(range(PID + 1, PID + n)), "each once"
    assert published(hook, "outrider_thread_run_delay_seconds_total")["intra_op"] == pytest.approx(0.5 * (n - 1))
    assert published(hook, "outrider_thread_cpu_seconds_total")["intra_op"] == pytest.approx(1.0 * (n - 1))
    looked.clear()
    s.sample()  # nothing ran since: the loop's thread was looked at already, and no other is due
    assert looked == []
    for i in range(1, 11):  # ten threads run (and wait) again
        write_task(root, PID, PID + i, "python", 2.0, 0.75)
        clocks.cpu[PID + i] = 2.0
    clocks.process += 10.0
    s.sample()
    assert sorted(looked) == list(range(PID + 1, PID + 11))
    assert published(hook, "outrider_thread_run_delay_seconds_total")["intra_op"] == pytest.approx(
        0.5 * (n - 1) + 0.25 * 10)
    assert published(hook, "outrider_thread_cpu_seconds_total")["intra_op"] == pytest.approx(1.0 * (n - 1) + 10)


def test_this_process_cpu_adds_up_with_threads_that_ended_between_flushes(tmp_path: Path) -> None:
    """Real threads that burn CPU and end between two reads, some never seen by a read at all: at a read that lists
    the tasks, the roles' CPU adds up to the process's CPU clock (all its threads, ended ones included), never
    less, and at most what the process used until the read returned; the ended Python threads' share is other's."""
    hook = Hook(HookSettings(spool_dir=str(tmp_path), standalone=False))
    hook.progress.steps = 1
    s = ThreadCpuAccounting(hook, threading.get_native_id)
    assert isinstance(s.clocks, OwnClocks)
    own = ("main", "intra_op", "other", "outrider")

    def burn(seconds: float, started: threading.Event | None = None, go: threading.Event | None = None) -> None:
        if started is not None and go is not None:
            started.set()
            go.wait()
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    def read_to_a_listing() -> tuple[float, float]:
        """Reads until one lists the tasks (one in LIST_EVERY): the process's CPU just before it and just after."""
        while True:
            before = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
            s.read()
            after = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
            if s._listed == s.flushes:
                return before, after

    s.read()
    other_before = s.cpu["other"]
    for _ in range(3):
        started, go = threading.Event(), threading.Event()
        seen = threading.Thread(target=burn, args=(0.05, started, go))  # read while alive, then burns and ends
        seen.start()
        started.wait()
        s.read()
        go.set()
        seen.join()
        unseen = threading.Thread(target=burn, args=(0.05,))  # starts and ends between two reads
        unseen.start()
        unseen.join()
        for t in (seen, unseen):  # join() returns before the kernel's thread is gone: a thread threading no
            while os.path.exists(f"/proc/self/task/{t.native_id}"):  # longer knows reads as a native one
                time.sleep(0.001)
        before, after = read_to_a_listing()
        total = sum(s.cpu[r] for r in own)
        assert before <= total + 1e-6 and total <= after + 1e-6, (before, total, after)
    assert s.cpu["other"] - other_before >= 0.3 - 1e-3, "six ended threads' 50 ms each"


def test_a_native_thread_started_between_two_listings_is_counted_once(tmp_path: Path) -> None:
    """A pool thread torch starts between two listings of the tasks (Python does not know it) is in the process
    clock at once, and counted as itself at the next listing: what the clock says is unexplained meanwhile is not
    given to the role of a thread that ended, so the new thread's CPU counts once, as intra_op."""
    from outrider.hook import threads

    root, clocks = tmp_path / "proc", CountingClocks()
    write_task(root, PID, PID, "python", 1.0, 0.0)
    write_task(root, PID, 103, "python", 0.5, 0.0)  # a Python thread of the workload, about to end
    clocks.cpu = {PID: 1.0, 103: 0.5}
    clocks.process = 1.5
    hook = Hook(HookSettings(spool_dir=str(tmp_path / "spool"), standalone=False))
    hook.progress.steps = 1
    s = ThreadCpuAccounting(hook, lambda: 0, str(root), lambda: {PID: "MainThread", 103: "worker"}, lambda: PID, clocks)
    s.sample()
    import shutil

    shutil.rmtree(root / str(PID) / "task" / "103")  # ends, having used 0.1 s more
    del clocks.cpu[103]
    write_task(root, PID, 150, "python", 2.0, 0.0)  # starts, unlisted, and uses 2 s
    clocks.cpu[150] = 2.0
    clocks.process = 1.5 + 0.1 + 2.0
    for _ in range(threads.LIST_EVERY):
        s.sample()
    cpu = published(hook, "outrider_thread_cpu_seconds_total")
    assert cpu["intra_op"] == pytest.approx(2.0), "the new pool thread, once"
    assert cpu["other"] == pytest.approx(0.6), "the ended thread's last 0.1 s, not the pool thread's 2 s"
    assert sum(cpu[r] for r in ("main", "intra_op", "other", "outrider")) == pytest.approx(clocks.process)


def test_the_look_queue_stays_bounded_when_threads_come_and_go(tmp_path: Path) -> None:
    """Threads that run once and end (a thread per request), 100 new ones each flush, beside 200 that run every
    flush (more than a flush looks at, so the ended ones' places fall behind the living): what waits for a look
    never outgrows a bound of the threads alive, and the living are still looked at in turn."""
    from outrider.hook import threads

    root, clocks = tmp_path / "proc", CountingClocks()
    python: dict[int, str] = {}
    for i in range(200):
        write_task(root, PID, PID + i, "python", 1.0, 0.1)
        python[PID + i] = f"pool-{i}"
    hook = Hook(HookSettings(spool_dir=str(tmp_path / "spool"), standalone=False))
    hook.progress.steps = 1
    s = ThreadCpuAccounting(hook, lambda: 0, str(root), lambda: dict(python), lambda: PID, clocks)
    looked: set[int] = set()
    tid = 10_000
    for flush in range(1, 61):
        for i in range(200):
            clocks.cpu[PID + i] = float(flush)  # the pool runs every flush
        for _ in range(100):  # requests' threads: alive at this read, gone by the next
            tid += 1
            write_task(root, PID, tid, "python", 0.01, 0.0)
            python[tid] = "request"
            clocks.cpu[tid] = 0.01
        clocks.process = 200.0 * flush + 0.01 * (tid - 10_000)
        s.read()
        looked.update(t for t in s.known if s.known[t].looked == s.flushes)
        assert len(s._due) <= 2 * len(s.known) + threads.LOOKS_PER_FLUSH
        for t in range(tid - 99, tid + 1):
            del clocks.cpu[t]
            del python[t]
    assert {PID + i for i in range(1, 200)} <= looked, "every pool thread was looked at"
