"""The loop profiler (hook/profiler.py) value by value, in process and without torch: each class decided from real
stacks whose files are chosen (code compiled under a torch, site-packages or user path), the samples counted and
published through a real registry, the frame table's and the kinds cache's bounds at their edges, the idle window,
the GIL's wait told by this thread's own context switches (or its wait for a CPU), and the loop thread's clocks read
from a real thread blocked on an event (whose schedstat and CPU clock do not move). test_profiler.py shows the
shares on real loops; this pins what each step of the sampler computes."""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from outrider.hook import profiler
from outrider.hook.profiler import (
    GIL_WAIT_S,
    IDLE_S,
    IDLE_STEPS,
    MAX_DEPTH,
    MAX_FILE_KINDS,
    MAX_FRAME_SERIES,
    MAX_FRAMES,
    MAX_LABEL,
    ON_CPU,
    TOP_PUBLISHED,
    WHERE,
    LoopProfiler,
    file_kind,
    frame_label,
)
from outrider.hook.progress import Progress
from outrider.hook.registry import Registry

T = TypeVar("T")
SITE = "/usr/lib/python3/site-packages"
TORCH = f"{SITE}/torch"
USER = "/home/me/proj/train.py"
OUTRIDER = profiler._OUTRIDER_DIR  # the package's directory, as the profiler knows it


class Workload:
    """What the profiler reads of the hook: the process's progress and the registry its counters go to (both real)."""

    def __init__(self) -> None:
        self.progress = Progress()
        self.registry = Registry()

    def counters(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {labels: s.total()[0] for (n, labels), s in self.registry._series.items() if n == name}


def stepping(w: Workload, steps: int = 1, typical: float = 0.1, ago: float = 0.0) -> None:
    w.progress.record_steps(steps, time.perf_counter() - ago, [typical])


def profiler_of(w: Workload, tid: int = 0, hz: float = 100.0) -> LoopProfiler:
    return LoopProfiler(w, lambda: tid, hz)


def active(p: LoopProfiler) -> bool:
    """Whether a flush's sampler finds the loop stepping."""
    p.sample()
    return p.active


def clock_of(p: LoopProfiler) -> int | None:
    return p._clock


def schedstat(native: int) -> list[int]:
    with open(f"/proc/self/task/{native}/schedstat") as f:
        return [int(x) for x in f.read().split()]


@pytest.fixture
def blocked() -> Iterator[threading.Thread]:
    """A thread of the workload waiting on an event: its schedstat and CPU clock stand still while it waits."""
    release = threading.Event()
    started = threading.Event()

    def wait_in_users_code() -> None:
        started.set()
        release.wait()

    t = threading.Thread(target=wait_in_users_code, name="blocked-loop")
    t.start()
    assert started.wait(10)
    # blocked once it is in the wait: its run time no longer grows
    deadline = time.monotonic() + 10
    before = schedstat(t.native_id or 0)
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = schedstat(t.native_id or 0)
        if now[:2] == before[:2]:
            break
        before = now
    yield t
    release.set()
    t.join(10)


def fixed_clock(monkeypatch: pytest.MonkeyPatch, now: list[float]) -> None:
    """The profiler's perf_counter reads `now[0]` (every other clock of the time module stays real): the edges of
    the idle window and of ON_CPU, which a moving clock never lands on."""
    clock = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith("_")})
    clock.perf_counter = lambda: now[0]
    monkeypatch.setattr(profiler, "time", clock)


# --- stacks whose files are chosen ----------------------------------------------------------------------------------

def stack(paths: list[str], look: Callable[[types.FrameType], T], blank: int = 0) -> Callable[[], T]:
    """The outermost of a chain of functions, one in each file of `paths` (outermost first), each named after its
    place (`f0` outermost) and calling the next on its line 2 + blank; the innermost calls `look` with its frame."""
    inner: Callable[[], T] = lambda: look(sys._getframe(1))  # noqa: E731
    for i, path in reversed(list(enumerate(paths))):
        ns: dict[str, Any] = {"inner": inner}
        exec(compile("\n" * blank + f"def f{i}():\n    return inner()\n", path, "exec"), ns)
        inner = ns[f"f{i}"]
    return inner


def in_a_thread(paths: list[str], look: Callable[[types.FrameType], T]) -> T:
    """look(the innermost frame of stack(paths)) with the chain a thread's target: no frame of this file (the
    user's) further out."""
    out: list[T] = []
    t = threading.Thread(target=stack(paths, lambda f: out.append(look(f))))
    t.start()
    t.join(10)
    return out[0]


def deep(outer: str, depth: int, look: Callable[[types.FrameType], T]) -> T:
    """`look` called from `depth` frames of a user's recursion, itself called by a function in `outer`."""
    ns: dict[str, Any] = {"look": look, "sys": sys}
    exec(compile("def rec(n):\n    if n > 1:\n        return rec(n - 1)\n    return look(sys._getframe())\n",
                 USER, "exec"), ns)
    exec(compile("def outer(n):\n    return rec(n)\n", outer, "exec"), ns)
    result: T = ns["outer"](depth)
    return result


def classified(p: LoopProfiler, paths: list[str], held: bool = False, on_cpu: bool | None = None,
               blank: int = 0) -> tuple[str, str]:
    return stack(paths, lambda f: p.classify(f, held=held, on_cpu=on_cpu), blank)()


# --- files and labels ---------------------------------------------------------------------------------------------

def test_each_file_kind() -> None:
    assert file_kind(f"{TORCH}/utils/data/dataloader.py") == "data"
    assert file_kind(f"{TORCH}/serialization.py") == "checkpoint"
    assert file_kind(f"{TORCH}/distributed/checkpoint/state_dict_saver.py") == "checkpoint"
    assert file_kind(f"{TORCH}/distributed/distributed_c10d.py") == "collective"
    assert file_kind(f"{TORCH}/optim/adam.py") == "optimizer"
    assert file_kind(f"{TORCH}/nn/modules/linear.py") == "torch"
    assert file_kind("/home/me/torch/model.py") == "torch", "a directory named torch is torch's, installed or not"
    assert file_kind(f"{SITE}/numpy/core/numeric.py") == "lib"
    assert file_kind("/usr/lib/python3/dist-packages/yaml/parser.py") == "lib"
    assert file_kind("<frozen importlib._bootstrap>") == "lib" and file_kind("<string>") == "lib"
    assert file_kind(threading.__file__) == "lib", "the standard library"
    assert file_kind(USER) == "user" and file_kind("train.py") == "user"
    assert file_kind(profiler.__file__) == "outrider"
    assert file_kind(os.path.join(os.path.dirname(profiler.__file__), "torch_data.py")) == "data", \
        "the hook's own timed __next__ is the DataLoader's"
    assert file_kind(OUTRIDER + "commands/demo/workload.py") == "user"
    assert file_kind(OUTRIDER + "commands/demo.py") == "outrider"


def test_a_windows_path_is_read_with_its_backslashes() -> None:
    assert file_kind("C:\\Python\\Lib\\site-packages\\torch\\optim\\adam.py") == "optimizer"
    assert file_kind("C:\\Python\\Lib\\site-packages\\numpy\\core.py") == "lib"
    assert frame_label("C:\\proj\\src\\train.py", 7, "step") == "src/train.py:7 step"


def test_a_label_is_the_last_two_parts_and_bounded_at_its_edge() -> None:
    assert frame_label("/home/me/proj/train.py", 42, "step") == "proj/train.py:42 step"
    assert frame_label("train.py", 3, "main") == "train.py:3 main"
    fits = "d/" + "a" * (MAX_LABEL - len("d/.py:1 f")) + ".py"
    assert len(frame_label("/x/" + fits, 1, "f")) == MAX_LABEL
    assert frame_label("/x/" + fits, 1, "f") == fits + ":1 f", "exactly MAX_LABEL: kept whole"
    over = "d/b" + fits[2:]
    assert frame_label("/x/" + over, 1, "f") == "..." + (over + ":1 f")[-(MAX_LABEL - 3):]
    assert len(frame_label("/x/" + over, 1, "f")) == MAX_LABEL


def test_this_threads_switches_are_counted_and_a_platform_without_them_says_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = profiler._thread_switches()
    assert isinstance(before, int) and before >= 0
    time.sleep(0.001)  # a sleep blocks the thread: one voluntary switch at least
    after = profiler._thread_switches()
    assert after is not None and after > before
    monkeypatch.setattr(profiler, "_RUSAGE_THREAD", None)
    assert profiler._thread_switches() is None
    assert profiler_of(Workload()).counted is False


def test_a_failing_count_of_switches_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(who: int) -> object:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(resource, "getrusage", refused)
    assert profiler._thread_switches() is None


# --- a new profiler, the flush's sampler, the idle window -----------------------------------------------------------

def test_a_new_profiler() -> None:
    w = Workload()
    p = profiler_of(w, hz=50.0)
    assert p.period == 1 / 50.0 and profiler_of(w, hz=0.5).period == 2.0 and profiler_of(w, hz=0.0).period == 0.0
    assert p.counts == dict.fromkeys(WHERE, 0) and list(p.counts) == list(WHERE)
    assert p.frames == {} and p.kinds == {} and p.registered == set()
    assert p.active is False and p.pid == os.getpid() and p.counted is True


def test_off_samples_nothing_and_publishes_nothing() -> None:
    w = Workload()
    stepping(w)
    p = profiler_of(w, tid=threading.get_native_id(), hz=0.0)
    p.counts["python"] = 3
    assert active(p) is False and p.period_s() == 0.0 and not w.registry._series


def test_the_loop_is_active_while_it_steps_within_the_idle_window(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    fixed_clock(monkeypatch, now)
    w = Workload()
    p = profiler_of(w, tid=threading.get_native_id())
    assert active(p) is False and p.period_s() == 0.0, "no step yet"
    w.progress.record_steps(1, now[0] - IDLE_S, [0.1])
    assert active(p) is True and p.period_s() == 0.01, "a step exactly IDLE_S ago: still stepping"
    now[0] += 0.001
    assert active(p) is False and p.period_s() == 0.0, "just past the window"
    # slow steps: the window is IDLE_STEPS of the median step when that is longer
    slow = IDLE_S  # a step of IDLE_S: the window is IDLE_STEPS * IDLE_S
    now[0] = 2048.0
    w.progress.record_steps(2, now[0] - IDLE_STEPS * slow, [slow, slow])
    assert w.progress.typical_step_s() == slow
    assert active(p) is True
    now[0] += 1 / 1024
    assert active(p) is False


def test_a_loop_not_known_is_not_active_and_an_open_phase_or_checkpoint_is(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    fixed_clock(monkeypatch, now)
    w = Workload()
    w.progress.record_steps(1, now[0] - 3600, [0.1])  # stepped an hour ago: idle
    known = [0]
    p = LoopProfiler(w, lambda: known[0], 100.0)
    w.progress.open_phases["eval"] = now[0]
    assert active(p) is False, "the loop's thread not known yet"
    known[0] = threading.get_native_id()
    assert active(p) is True, "an open phase: the loop works without stepping"
    w.progress.open_phases.clear()
    assert active(p) is False
    w.progress.checkpoint_since = now[0] - 600
    assert active(p) is True, "a checkpoint being written"


def test_period_is_zero_in_a_forked_child_until_its_flush_starts_afresh(blocked: threading.Thread) -> None:
    w = Workload()
    stepping(w)
    p = profiler_of(w, tid=blocked.native_id or 0)
    p.sample()
    p.tick(held=False)
    p.publish()
    p._own_delay_ns()
    sched, delay = p._sched_fd, p._delay_fd
    assert sched >= 0 and delay >= 0 and p._native == blocked.native_id and p.registered
    p.pid = -1  # as a forked child sees its parent's profiler: another process's
    assert p.period_s() == 0.0, "the parent's samples are not the child's to take"
    p.sample()
    assert p.pid == os.getpid() and p.period_s() == 0.01
    assert p.counts == dict.fromkeys(WHERE, 0) and p.frames == {} and p.registered == set()
    assert p._native == -1 and p._sched_fd == -1 and p._delay_fd == -1 and p._delay_tid == 0
    for fd in (sched, delay):
        with pytest.raises(OSError):
            os.fstat(fd)
    p.tick(held=False)
    assert p.counts["waiting"] == 1 and p._native == blocked.native_id, "the child samples its own loop afresh"


# --- publishing -----------------------------------------------------------------------------------------------------

def test_counts_are_published_as_they_stand_and_only_where_nonzero() -> None:
    w = Workload()
    stepping(w)
    p = profiler_of(w, tid=threading.get_native_id())
    p.count("python", "a.py:1 f")
    p.count("python", "a.py:1 f")
    p.count("waiting", "b.py:2 g")
    p.sample()
    assert w.counters("outrider_train_loop_samples_total") == {(("where", "python"),): 2.0,
                                                                 (("where", "waiting"),): 1.0}
    assert w.counters("outrider_train_loop_frame_samples_total") == {
        (("frame", "a.py:1 f"), ("where", "python")): 2.0, (("frame", "b.py:2 g"), ("where", "waiting")): 1.0}
    p.count("python", "a.py:1 f")
    p.publish()
    assert w.counters("outrider_train_loop_samples_total")[(("where", "python"),)] == 3.0, "a total, not an increment"


def test_the_top_frames_are_published_and_the_series_ever_registered_are_bounded() -> None:
    w = Workload()
    p = profiler_of(w)

    def published() -> dict[str, float]:
        return {dict(k)["frame"]: v for k, v in w.counters("outrider_train_loop_frame_samples_total").items()}

    # TOP_PUBLISHED + 5 frames, frame i counted i + 1 times: the TOP_PUBLISHED most counted go out
    p.frames = {("python", f"top{i}"): i + 1 for i in range(TOP_PUBLISHED + 5)}
    p.publish()
    assert published() == {f"top{i}": i + 1 for i in range(5, TOP_PUBLISHED + 5)}
    # new hotter frames until MAX_FRAME_SERIES are registered (frames of later flushes, each hotter than the last)
    hotter = 1000
    for _ in range(MAX_FRAME_SERIES // TOP_PUBLISHED + 1):  # bounded: a registry that never fills fails, not hangs
        room = min(TOP_PUBLISHED, MAX_FRAME_SERIES - len(p.registered))
        p.frames = {("python", f"r{hotter + i}"): hotter + i for i in range(room)}
        p.publish()
        hotter += 1000
    assert len(p.registered) == MAX_FRAME_SERIES and len(published()) == MAX_FRAME_SERIES
    # at the bound: a new frame, hotter than all, is not registered; a registered one, less hot, is still updated
    p.frames = {("python", "newest"): 10**6, ("python", "top24"): 500}
    p.publish()
    assert "newest" not in published() and ("python", "newest") not in p.registered
    assert published()["top24"] == 500 and len(p.registered) == MAX_FRAME_SERIES


# --- the GIL's wait -------------------------------------------------------------------------------------------------

def test_the_gils_wait_is_a_second_voluntary_switch() -> None:
    p = profiler_of(Workload())
    mark = p.before_wait()
    assert mark[1] == 0 and isinstance(mark[0], int)
    n = profiler._thread_switches()
    assert n is not None
    assert p.after_wait((n - 2, 0), 0.0) is True, "blocked twice: once in its wait, once for the GIL"
    assert p.after_wait((n - 1, 0), 1.0) is False, "blocked once (its own wait), however late it woke"
    assert p.after_wait((n, 0), 1.0) is False


def test_without_a_count_of_switches_the_wake_up_lag_not_spent_waiting_for_a_cpu_decides(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiler, "_RUSAGE_THREAD", None)
    p = profiler_of(Workload())
    assert p.counted is False
    before = schedstat(threading.get_native_id())[1]
    switches, delay = p.before_wait()
    assert switches is None and before <= delay <= schedstat(threading.get_native_id())[1]
    later = 10**18  # a mark past any delay this thread will have: none of the lag was a wait for a CPU
    assert p.after_wait((None, later), GIL_WAIT_S) is True, "exactly GIL_WAIT_S late"
    assert p.after_wait((None, later), GIL_WAIT_S * 0.99) is False
    # the time this thread waited for a CPU since the mark (1 us at least here) is not the GIL's
    now = p._own_delay_ns()
    assert p.after_wait((None, now - 1000), 1.0) is True
    assert p.after_wait((None, now - 1000), GIL_WAIT_S + 0.5e-6) is False
    assert p.after_wait((None, now - 2 * 10**9), 1.0) is False, "two seconds waiting for a CPU: a late wake-up"


def test_a_count_that_fails_after_the_wait_falls_back_to_the_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    p = profiler_of(Workload())
    n = profiler._thread_switches()
    assert n is not None
    monkeypatch.setattr(profiler, "_RUSAGE_THREAD", None)
    assert p.after_wait((n - 5, 10**18), 1.0) is True and p.after_wait((n - 5, 10**18), 0.0) is False


def test_this_threads_wait_for_a_cpu_is_read_from_its_schedstat() -> None:
    p = profiler_of(Workload())
    tid = threading.get_native_id()
    before = schedstat(tid)[1]
    got = p._own_delay_ns()
    assert before <= got <= schedstat(tid)[1]
    fd = p._delay_fd
    assert fd >= 0 and p._delay_tid == tid
    assert p._own_delay_ns() >= got and p._delay_fd == fd, "the file stays open for the next sample"
    seen: list[tuple[int, int, int]] = []

    def elsewhere() -> None:
        seen.append((p._own_delay_ns(), p._delay_fd, p._delay_tid))

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join(10)
    assert seen and seen[0][2] == t.native_id and seen[0][1] == p._delay_fd >= 0
    assert os.readlink(f"/proc/self/fd/{p._delay_fd}").endswith(f"/task/{t.native_id}/schedstat")
    if seen[0][1] != fd:  # the other thread's file replaced this one's (the number is free again only if closed)
        with pytest.raises(OSError):
            os.fstat(fd)
    p._close_delay()
    assert p._delay_fd == -1 and p._delay_tid == 0
    with pytest.raises(OSError):
        os.fstat(seen[0][1])


def test_a_schedstat_that_cannot_be_read_is_no_wait() -> None:
    p = profiler_of(Workload())
    p._delay_tid = threading.get_native_id()  # as after an open that failed: no file
    assert p._delay_fd == -1 and p._own_delay_ns() == 0
    p._delay_tid = 0
    assert p._own_delay_ns() >= 0 and p._delay_fd >= 0
    os.close(p._delay_fd)  # read now fails (EBADF)
    assert p._own_delay_ns() == 0
    p._delay_fd = -1


# --- the loop thread's clocks ---------------------------------------------------------------------------------------

def test_the_loop_thread_is_found_by_its_native_id_and_its_schedstat_read(blocked: threading.Thread) -> None:
    native = blocked.native_id or 0
    p = profiler_of(Workload(), tid=native)
    main = threading.main_thread()
    assert main.ident != blocked.ident
    assert p._loop_ident() == blocked.ident and p._native == native
    run, wait = schedstat(native)[:2]
    assert p._sched_fd >= 0 and p._clock is None
    assert p._demand == (run + wait) / 1e9 and p._loop_demand() == (run + wait) / 1e9
    assert 0 < time.perf_counter() - p._at < 60
    fd = p._sched_fd
    assert p._loop_ident() == blocked.ident and p._sched_fd == fd, "the same thread: the same file"


def test_a_loop_thread_that_is_no_python_thread_is_the_main_threads(blocked: threading.Thread) -> None:
    """A native id no Python thread has (a thread started by C code): the main thread's frames, its CPU clock."""
    known = [blocked.native_id or 0]
    p = LoopProfiler(Workload(), lambda: known[0], 100.0)
    p._loop_ident()
    fd = p._sched_fd
    known[0] = 2**22 + 12_345  # above Linux's largest thread id: no such thread, no schedstat
    assert p._loop_ident() == threading.main_thread().ident
    with pytest.raises(OSError):
        os.fstat(fd)
    assert p._sched_fd == -1 and p._clock is not None
    assert 0 < p._demand <= time.clock_gettime(p._clock)
    known[0] = 0
    assert p._loop_ident() == threading.main_thread().ident and p._sched_fd == -1 and p._clock is not None


def test_the_loop_threads_cpu_clock_where_its_schedstat_cannot_be_read(blocked: threading.Thread) -> None:
    p = profiler_of(Workload(), tid=blocked.native_id or 0)
    p._loop_ident()
    p._close_sched()
    assert p._sched_fd == -1
    p._clock = time.pthread_getcpuclockid(blocked.ident or 0)
    assert p._loop_demand() == time.clock_gettime(p._clock)
    p._clock = None
    assert p._loop_demand() == -1.0, "neither: unknown"


def test_a_loop_thread_that_ended_has_no_clock_and_no_sample() -> None:
    release = threading.Event()
    t = threading.Thread(target=release.wait)
    t.start()
    w = Workload()
    p = profiler_of(w, tid=t.native_id or 0)
    assert p._loop_ident() == t.ident and p._sched_fd >= 0
    clock = time.pthread_getcpuclockid(t.ident or 0)
    release.set()
    t.join(10)
    fd = p._sched_fd
    assert p._loop_demand() == -1.0 and p._sched_fd == -1, "its schedstat gone"
    with pytest.raises(OSError):
        os.fstat(fd)
    p._clock = clock
    assert p._loop_demand() == -1.0 and clock_of(p) is None, "its CPU clock gone"
    p.tick(held=True)
    assert sum(p.counts.values()) == 0 and p.frames == {}, "no frames of a thread that ended"


# --- a sample -------------------------------------------------------------------------------------------------------

def test_no_sample_before_the_loop_thread_is_known() -> None:
    p = profiler_of(Workload(), tid=0)
    p.tick(held=True)
    assert sum(p.counts.values()) == 0 and p._native == -1 and p._sched_fd == -1


def test_a_loop_blocked_since_the_last_sample_is_waiting_whatever_the_gil(blocked: threading.Thread) -> None:
    p = profiler_of(Workload(), tid=blocked.native_id or 0)
    p.tick(held=True)
    p.tick(held=False)
    assert p.counts == {**dict.fromkeys(WHERE, 0), "waiting": 2}
    ((where, frame), n), = p.frames.items()
    assert where == "waiting" and n == 2 and frame.endswith(" wait_in_users_code"), frame
    assert frame.startswith("diagnosis/test_profiler_values.py:"), "the user's frame, not threading's wait"


def test_on_the_cpu_a_fifth_of_the_time_or_more(blocked: threading.Thread, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop thread's demand (CPU time and wait for a CPU) since the last sample against ON_CPU of the time
    between them: at or above it, the GIL decides (python or native); below, waiting. The thread is blocked, so its
    demand stands still; the profiler's last reading and the clock are set around it."""
    now = [1000.0]
    fixed_clock(monkeypatch, now)
    p = profiler_of(Workload(), tid=blocked.native_id or 0)
    p._loop_ident()
    demand = p._loop_demand()

    def one(held: bool, before: float, over: float) -> str:
        p.counts = dict.fromkeys(WHERE, 0)
        p._demand, p._at = before, now[0] - over
        p.tick(held=held)
        assert p._demand == demand and p._at == now[0], "the reading kept for the next sample"
        (where, n), = ((w, n) for w, n in p.counts.items() if n)
        assert n == 1
        return where

    assert demand > 0
    assert one(True, demand, 0.0) == "python", "no time between: nothing to be below"
    # all of its demand since a reading of 0: on the CPU over a little less than demand / ON_CPU, not a little more
    assert one(True, 0.0, demand / ON_CPU * 0.95) == "python" and one(False, 0.0, demand / ON_CPU * 0.95) == "native"
    assert one(True, 0.0, demand / ON_CPU * 1.05) == "waiting" and one(False, 0.0, demand / ON_CPU * 1.05) == "waiting"


def test_a_demand_unknown_then_or_now_leaves_the_gil_to_decide(blocked: threading.Thread) -> None:
    p = profiler_of(Workload(), tid=blocked.native_id or 0)
    p._loop_ident()
    p._demand = -1.0  # the last reading unknown
    p.tick(held=True)
    assert p.counts["python"] == 1, "a blocked thread, but nothing to compare with"
    p._close_sched()
    p._clock = None
    p._demand = 5.0  # now unknown (neither clock), known before
    p.tick(held=False)
    assert p.counts["native"] == 1 and p._demand == -1.0


# --- the class and the frame of one stack ---------------------------------------------------------------------------

def test_the_gil_and_the_cpu_decide_outside_the_special_classes() -> None:
    p = profiler_of(Workload())
    user = [USER]
    assert classified(p, user, held=True, on_cpu=None) == ("python", "proj/train.py:2 f0")
    assert classified(p, user, held=True, on_cpu=True)[0] == "python"
    assert classified(p, user, held=False, on_cpu=True)[0] == "native"
    assert classified(p, user, held=False, on_cpu=None)[0] == "native"
    assert classified(p, user, held=True, on_cpu=False)[0] == "waiting"
    assert classified(p, user, held=False, on_cpu=False)[0] == "waiting"


def test_the_frame_shown_is_the_innermost_of_the_users_code() -> None:
    p = profiler_of(Workload())
    paths = [USER, "/home/me/proj/model.py", f"{TORCH}/nn/modules/linear.py", f"{TORCH}/nn/functional.py"]
    assert classified(p, paths, held=False, blank=3) == ("native", "proj/model.py:5 f1")
    no_user = [f"{SITE}/numpy/core/numeric.py", f"{TORCH}/nn/functional.py"]
    got = in_a_thread(no_user, lambda f: p.classify(f, held=True, on_cpu=None))
    assert got == ("python", "nn/functional.py:2 f1"), "no user code on the stack: the innermost frame"


def test_the_outermost_special_frame_decides_the_class() -> None:
    p = profiler_of(Workload())
    dataset = [USER, f"{TORCH}/utils/data/dataloader.py", "/home/me/proj/dataset.py", f"{TORCH}/functional.py"]
    assert classified(p, dataset, held=True, on_cpu=False) == ("data", "proj/dataset.py:2 f2")
    both = [USER, f"{TORCH}/distributed/c10d.py", f"{TORCH}/optim/adam.py"]
    assert classified(p, both)[0] == "collective"
    assert classified(p, [USER, f"{TORCH}/optim/adam.py", f"{TORCH}/distributed/c10d.py"])[0] == "optimizer"
    assert classified(p, [USER, f"{TORCH}/serialization.py"], on_cpu=False)[0] == "checkpoint"


def test_a_stack_is_walked_to_max_depth() -> None:
    p = profiler_of(Workload())
    data = f"{TORCH}/utils/data/dataloader.py"

    def look(f: types.FrameType) -> tuple[str, str]:
        return p.classify(f, held=True, on_cpu=None)

    # the DataLoader's frame the MAX_DEPTH-th from the innermost: seen; one further out: not
    assert deep(data, MAX_DEPTH - 1, look) == ("data", "proj/train.py:4 rec")
    assert deep(data, MAX_DEPTH, look) == ("python", "proj/train.py:4 rec")


def test_file_kinds_are_cached_up_to_their_bound() -> None:
    p = profiler_of(Workload())
    assert p._kind(USER) == "user" and p.kinds == {USER: "user"}
    assert p._kind(USER) == "user"
    p.kinds = {f"/x/{i}.py": "lib" for i in range(MAX_FILE_KINDS - 1)}
    assert p._kind(f"{TORCH}/optim/sgd.py") == "optimizer" and len(p.kinds) == MAX_FILE_KINDS
    assert p._kind(f"{TORCH}/optim/adam.py") == "optimizer" and len(p.kinds) == MAX_FILE_KINDS, "full: not kept"
    assert f"{TORCH}/optim/adam.py" not in p.kinds


# --- the bounded frame table ----------------------------------------------------------------------------------------

def test_counts_and_the_frame_table_at_its_bound() -> None:
    p = profiler_of(Workload())
    p.count("python", "a")
    p.count("python", "a")
    p.count("native", "a")
    assert p.counts == {**dict.fromkeys(WHERE, 0), "python": 2, "native": 1}
    assert p.frames == {("python", "a"): 2, ("native", "a"): 1}
    # MAX_FRAMES - 1 frames counted 5..: one more is added as it is, the next takes the least counted's place
    p.frames = {("python", f"f{i}"): 5 + i for i in range(MAX_FRAMES - 1)}
    p.count("python", "last")
    assert len(p.frames) == MAX_FRAMES and p.frames[("python", "last")] == 1
    p.count("python", "late")
    assert len(p.frames) == MAX_FRAMES and ("python", "last") not in p.frames
    assert p.frames[("python", "late")] == 2, "the evicted entry's count, and this sample"
    p.count("python", "later")
    assert ("python", "late") not in p.frames and p.frames[("python", "later")] == 3
    assert ("python", "f0") in p.frames and p.frames[("python", f"f{MAX_FRAMES - 2}")] == MAX_FRAMES + 3


def test_this_file_is_the_users() -> None:
    """The stacks above are told apart by their files: this test's own must read as the user's."""
    assert file_kind(__file__) == "user" and Path(__file__).name == "test_profiler_values.py"


# --- descriptors and clocks at their edges --------------------------------------------------------------------------

def test_descriptor_0_is_a_file_like_any_other(blocked: threading.Thread) -> None:
    """A process whose stdin is closed (a daemon's): the schedstat files it opens take descriptor 0, and are read
    and closed as any other."""
    saved = os.dup(0)
    try:
        os.close(0)
        native = blocked.native_id or 0
        p = profiler_of(Workload(), tid=native)
        p._loop_ident()
        assert p._sched_fd == 0 and p._clock is None
        run, wait = schedstat(native)[:2]
        assert p._loop_demand() == (run + wait) / 1e9
        p._close_sched()
        assert p._sched_fd == -1
        with pytest.raises(OSError):
            os.fstat(0)
        tid = threading.get_native_id()
        before = schedstat(tid)[1]
        got = p._own_delay_ns()
        assert p._delay_fd == 0 and before <= got <= schedstat(tid)[1]
        p._close_delay()
        assert p._delay_fd == -1
        with pytest.raises(OSError):
            os.fstat(0)
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_descriptors_closed_under_it_are_let_go_quietly(blocked: threading.Thread) -> None:
    """A library that closes every descriptor (daemonising, or before an exec): the profiler's own close of them
    fails, and must not raise."""
    p = profiler_of(Workload(), tid=blocked.native_id or 0)
    p._loop_ident()
    p._own_delay_ns()
    os.close(p._sched_fd)
    os.close(p._delay_fd)
    p._close_sched()
    p._close_delay()
    assert p._sched_fd == -1 and p._delay_fd == -1


def test_a_process_out_of_descriptors_samples_without_them(blocked: threading.Thread) -> None:
    """No descriptor left (RLIMIT_NOFILE reached): no schedstat; the loop thread's CPU clock instead, no wait for a
    CPU (0), and nothing raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest)
    p = profiler_of(Workload(), tid=blocked.native_id or 0)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
    try:
        assert p._own_delay_ns() == 0 and p._delay_fd == -1
        assert p._loop_ident() == blocked.ident and p._sched_fd == -1 and p._clock is not None
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert p._loop_demand() == time.clock_gettime(p._clock)


def test_where_the_cpu_clock_cannot_be_had_the_demand_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    """A platform without pthread_getcpuclockid, and no schedstat for the loop thread: its demand is unknown (-1),
    and the GIL alone decides."""
    clock = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time)
                                     if not n.startswith("_") and n != "pthread_getcpuclockid"})
    monkeypatch.setattr(profiler, "time", clock)
    p = profiler_of(Workload(), tid=2**22 + 12_345)  # no such thread: no schedstat
    assert p._loop_ident() == threading.main_thread().ident
    assert p._sched_fd == -1 and p._clock is None and p._demand == -1.0 and p._loop_demand() == -1.0


def test_the_wait_for_a_cpu_is_in_nanoseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiler, "_RUSAGE_THREAD", None)
    p = profiler_of(Workload())
    now = p._own_delay_ns()
    # two seconds of it since the mark: a wake-up 2 s + GIL_WAIT_S late, less a nanosecond, is not the GIL's
    assert p.after_wait((None, now - 2 * 10**9), GIL_WAIT_S + 2.0 - 1e-9) is False


def test_a_frame_without_line_numbers_is_shown_at_line_0() -> None:
    """Code compiled without a line table (generated code): its frames have no line number."""
    def where() -> types.FrameType:
        return sys._getframe()

    bare = types.FunctionType(where.__code__.replace(co_linetable=b""), globals())
    frame = bare()
    assert frame.f_lineno is None
    p = profiler_of(Workload())
    assert p.classify(frame, held=True, on_cpu=None)[1] == "diagnosis/test_profiler_values.py:0 where"
