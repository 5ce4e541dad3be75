"""The workload first: the hook under green threads (real gevent and eventlet), outrider.flush() and shutdown() from
signal handlers (real signals, landing inside the hook's own flush), and thread limits (a real pids cgroup).

Every case runs a real workload process and reads back what it published in its shard; none judges wall time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrider.hook import election
from outrider.kernel import cgroupfs, procfs
from outrider.shared import spool
from tests.helpers import REPO, wait_until

pytestmark = pytest.mark.integration


def env_for(sp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    env.update(PYTHONPATH=str(REPO / "agent"), OUTRIDER_SPOOL_DIR=str(sp), OUTRIDER_STANDALONE="false")
    env.update(extra)
    return env


def shard(sp: Path, pid: int) -> spool.ShardSnapshot:
    (path,) = [p for p in sp.glob(f"outrider-{pid}-*.shard")]
    return spool.decode(path.read_bytes())


def counter(snap: spool.ShardSnapshot, name: str) -> float:
    return sum(values[0] for n, _, _, values, *_ in snap.series if n == name)


def finish(p: subprocess.Popen[str], timeout_s: float = 120.0) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout_s)
    finally:
        p.kill()
    return p.returncode, out, err


# --- green threads -------------------------------------------------------------------------------------------

GREEN = r"""
import sys
library = sys.argv[1]
if library == "gevent":
    from gevent import monkey
    monkey.patch_all()
    import gevent
    yield_now = lambda: gevent.sleep(0.001)
else:
    import eventlet
    eventlet.monkey_patch()
    yield_now = lambda: eventlet.sleep(0.001)
import os, pathlib, time
import outrider

control = pathlib.Path(sys.argv[2])
assert outrider.instrument()
print("instrumented", flush=True)
for _ in range(40):
    with outrider.step():
        yield_now()
# CPU-bound, never yielding to the hub: the hook's thread is an OS thread and keeps publishing meanwhile
(control / "busy").touch()
while not (control / "seen").exists():
    pass
print("tasks", len(os.listdir("/proc/self/task")), flush=True)
(control / "ready").touch()
while True:  # waits for SIGTERM in the hub
    yield_now()
"""


@pytest.mark.parametrize("library", ["gevent", "eventlet"])
def test_green_threads_instrument_returns_the_hook_publishes_while_the_loop_never_yields_and_sigterm_closes(
        tmp_path: Path, library: str) -> None:
    """gunicorn -k gevent and eventlet workers: instrument() used to never return under gevent (the hook's SIGTERM
    watch, a greenlet, blocked the only OS thread in os.read), and under eventlet the hook's thread was a greenlet
    that published only when the workload yielded."""
    pytest.importorskip(library)
    sp, control = tmp_path / "spool", tmp_path / "control"
    control.mkdir()
    script = tmp_path / "green.py"
    script.write_text(GREEN)
    p = subprocess.Popen([sys.executable, "-W", "ignore", str(script), library, str(control)],
                         env=env_for(sp, OUTRIDER_FLUSH_INTERVAL_S="0.1"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (control / "busy").exists() or p.poll() is not None, timeout_s=60,
                   what="instrument() to return and 40 steps")
        assert p.poll() is None, finish(p)
        first = wait_until(lambda: _heartbeat(sp, p.pid), timeout_s=60, what="a shard")
        # the main greenlet spins without yielding: heartbeats must still move (several flushes)
        wait_until(lambda: (_heartbeat(sp, p.pid) or 0) > first, timeout_s=60,
                   what="a heartbeat while the workload never yields")
        (control / "seen").touch()
        wait_until(lambda: (control / "ready").exists() or p.poll() is not None, timeout_s=60, what="ready")
        os.kill(p.pid, signal.SIGTERM)  # to the workload itself, once
        code, out, err = finish(p)
    finally:
        p.kill()
    assert code == -signal.SIGTERM, err
    assert "tasks 2" in out, f"one OS thread for the hook beside the workload's: {out}"
    snap = shard(sp, p.pid)
    assert snap.header.steps == 40 and snap.header.flags & spool.FLAG_CLOSED, "SIGTERM's final flush, closed"


def _heartbeat(sp: Path, pid: int) -> int | None:
    try:
        return shard(sp, pid).header.heartbeat_ns
    except (ValueError, OSError):
        return None


# --- signal handlers -----------------------------------------------------------------------------------------

HANDLERS = r"""
import os, signal, sys, time
import outrider
from outrider.hook import api

mode = sys.argv[1]
preempted = outrider.counter("preemption_notices")

def publish_now(signum, frame):  # a SLURM-style "preempted: publish now" handler
    preempted.inc()
    if mode == "shutdown":
        outrider.shutdown()
    else:
        outrider.flush()

signal.signal(signal.SIGUSR1, publish_now)
assert outrider.instrument()
for _ in range(11):
    with outrider.step():
        pass
if mode in ("flush", "shutdown"):
    # The signal lands while the main thread is inside its own flush (here: in its last sampler).
    fired = []
    api.S.hook.samplers.append(lambda: None if fired else (fired.append(1), os.kill(os.getpid(), signal.SIGUSR1)))
    outrider.flush()
    for _ in range(5):
        with outrider.step():
            pass
    outrider.flush()
    print("done", flush=True)
elif mode == "storm":
    print("ready", flush=True)
    n = 0
    deadline = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline:  # flushes of its own while another process signals it as fast as it can
        with outrider.step():
            pass
        n += 1
        if n % 50 == 0:
            outrider.flush()
    outrider.flush()
    print("steps", n + 11, flush=True)
    sys.stdin.readline()  # exits once the signals stopped: at interpreter exit Python restores SIGUSR1's default
"""


def _handlers(tmp_path: Path, mode: str, *args: str) -> tuple[subprocess.Popen[str], Path]:
    sp = tmp_path / "spool"
    script = tmp_path / "handlers.py"
    script.write_text(HANDLERS)
    p = subprocess.Popen([sys.executable, str(script), mode, *args], env=env_for(sp, OUTRIDER_FLUSH_INTERVAL_S="3600"),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p, sp


def test_flush_from_a_signal_handler_inside_the_loops_own_flush_does_not_deadlock_and_is_published(
        tmp_path: Path) -> None:
    """One signal was enough to deadlock the process on the hook's flush lock."""
    p, sp = _handlers(tmp_path, "flush")
    code, out, err = finish(p, timeout_s=60)
    assert code == 0 and "done" in out, err
    snap = shard(sp, p.pid)
    assert counter(snap, "preemption_notices_total") == 1, "the handler's flush published what it counted"
    assert snap.header.steps == 16


def test_shutdown_from_a_signal_handler_inside_a_flush_closes_once_that_flush_ends(tmp_path: Path) -> None:
    p, sp = _handlers(tmp_path, "shutdown")
    code, out, err = finish(p, timeout_s=60)
    assert code == 0 and "done" in out, err
    snap = shard(sp, p.pid)
    assert snap.header.flags & spool.FLAG_CLOSED and counter(snap, "preemption_notices_total") == 1
    assert snap.header.steps == 11, "closed at the handler's shutdown: the steps after it are not published"


def test_a_storm_of_signals_whose_handler_flushes_never_stops_the_loop(tmp_path: Path) -> None:
    p, sp = _handlers(tmp_path, "storm", "3")
    sent = 0
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        os.set_blocking(p.stdout.fileno(), False)
        said = ""
        while "steps" not in said and p.poll() is None:
            os.kill(p.pid, signal.SIGUSR1)
            sent += 1
            time.sleep(0.0005)
            said += p.stdout.readline()
        os.set_blocking(p.stdout.fileno(), True)
        code, out, err = finish(p, timeout_s=60)
    finally:
        p.kill()
    assert code == 0, err
    steps = int((said + out).split("steps")[1])
    snap = shard(sp, p.pid)
    assert sent > 100 and snap.header.steps == steps, "every step counted, whatever the handlers interrupted"
    assert 1 <= counter(snap, "preemption_notices_total") <= sent


# --- thread limits -----------------------------------------------------------------------------------------------

THREADS = r"""
import os, sys, threading, time
if sys.argv[1] != "none":
    import outrider
    assert outrider.instrument()
    with outrider.step():
        pass
    time.sleep(float(sys.argv[2]))  # the hook's flushes (and its election of an agent, when allowed) go first
release = threading.Event()
started = 0
while True:
    try:
        threading.Thread(target=release.wait, daemon=True).start()
    except RuntimeError:
        break
    started += 1
print("threads", started, flush=True)
release.set()
"""


@contextlib.contextmanager
def pids_cgroup(limit: int) -> Iterator[Path]:
    """A pids cgroup of our own (v2 or v1's pids controller) limited to `limit` tasks; removed after."""
    unified = Path("/sys/fs/cgroup")
    base = unified if (unified / "cgroup.controllers").exists() else unified / "pids"
    group = base / f"outrider-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "pids.max").write_text(str(limit))
    except OSError as e:
        pytest.skip(f"no pids cgroup can be made here ({e}): this needs root and a writable pids controller")
    try:
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        wait_until(lambda: not (group / "cgroup.procs").read_text().split() or None, timeout_s=30,
                   what="the cgroup's processes gone")
        group.rmdir()


def in_cgroup(group: Path, *command: str) -> list[str]:
    """The command, moved into the cgroup before it starts (the shell moves itself, then execs it)."""
    return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *command]


def threads_in(tmp_path: Path, limit: int, mode: str, **env: str) -> tuple[int, str, list[str]]:
    """(threads the workload could start, its stderr, the command lines of the other processes in its cgroup)."""
    script = tmp_path / "threads.py"
    script.write_text(THREADS)
    sp = tmp_path / f"spool-{mode}"
    with pids_cgroup(limit) as group:
        procs_file = group / "cgroup.procs"
        p = subprocess.Popen(in_cgroup(group, sys.executable, str(script), mode, "3"), env=env_for(sp, **env),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        code, out, err = finish(p)
        assert code == 0, err
        others = []
        for pid in procs_file.read_text().split():
            with contextlib.suppress(OSError):
                others.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return int(out.split()[1]), err, others


def test_under_a_pids_limit_the_hook_takes_one_thread_and_no_agent_takes_the_workloads_last_ones(
        tmp_path: Path) -> None:
    """Under a limit of 30 a workload started 28 threads alone, 25 with the hook, 18 with the standalone agent."""
    alone, _, _ = threads_in(tmp_path, 30, "none")
    hooked, _, _ = threads_in(tmp_path, 30, "hook", OUTRIDER_FLUSH_INTERVAL_S="0.2")
    allowed, err, others = threads_in(tmp_path, 30, "hook", OUTRIDER_FLUSH_INTERVAL_S="0.2",
                                      OUTRIDER_STANDALONE="true")
    assert alone > 20
    assert hooked == alone - 1, "the hook's one thread"
    assert allowed == hooked and not any("outrider standalone" in c for c in others), "no agent was started"
    assert err.count("could not start an agent") == 1 and "pids cgroup allows 30" in err, err


def test_with_room_to_spare_the_standalone_agent_is_still_started(tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    script = tmp_path / "threads.py"
    script.write_text("import outrider, time\nassert outrider.instrument()\nwith outrider.step(): pass\n"
                      "time.sleep(4)\n")
    with pids_cgroup(4096) as group:
        p = subprocess.Popen(in_cgroup(group, sys.executable, str(script)),
                             env=env_for(sp, OUTRIDER_FLUSH_INTERVAL_S="0.2", OUTRIDER_STANDALONE="true"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        code, _, err = finish(p)
    assert code == 0 and "started one" in err, err


def test_headroom_is_the_tightest_of_the_users_limit_and_the_pids_cgroup(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """RLIMIT_NPROC counts every thread of the real user (root is exempt); a fixture /proc and cgroup tree."""
    import resource

    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    for pid, uid, threads in ((10, 1000, 7), (11, 1000, 5), (12, 0, 40), (13, 1000, 1)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nThreads:\t{threads}\n")
    (proc / "self").mkdir()
    (proc / "self" / "cgroup").write_text("0::/kubepods/pod1/ctr\n")
    for path, limit, current in (("kubepods/pod1", "100", "90"), ("kubepods/pod1/ctr", "max", "3")):
        (sys_root / "fs" / "cgroup" / path).mkdir(parents=True, exist_ok=True)
        (sys_root / "fs" / "cgroup" / path / "pids.max").write_text(limit + "\n")
        (sys_root / "fs" / "cgroup" / path / "pids.current").write_text(current + "\n")
    (sys_root / "fs" / "cgroup" / "cgroup.controllers").write_text("pids memory\n")
    assert procfs.tasks_of_user(str(proc), 1000) == 13
    assert cgroupfs.pids_limit(str(proc), str(sys_root)) == cgroupfs.PidsLimit(100, 90), "the pod's, not 'max'"
    monkeypatch.setattr(resource, "getrlimit", lambda which: (30, 30))
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    assert election.task_headroom(str(proc), str(sys_root)) == (10, 100, "the pids cgroup allows 100: 90 in use")
    monkeypatch.setattr(resource, "getrlimit", lambda which: (20, 30))
    assert election.task_headroom(str(proc), str(sys_root)) == (7, 20, "ulimit -u 20: this user runs 13 threads")
    monkeypatch.setattr(os, "getuid", lambda: 0)
    assert election.task_headroom(str(proc), str(sys_root))[2].startswith("the pids cgroup"), "root is exempt"


@pytest.mark.parametrize(("free", "limit", "room"), [
    (None, None, True),
    (64 + election.AGENT_TASKS, 100, True), (63 + election.AGENT_TASKS, 100, False),
    (2000 + election.AGENT_TASKS, 4000, True), (1999 + election.AGENT_TASKS, 4000, False),
    (27, 30, False),
])
def test_the_agent_needs_half_the_limit_and_64_threads_left_after_its_own(free: int | None, limit: int | None,
                                                                         room: bool) -> None:
    headroom = None if free is None or limit is None else (free, limit, "")
    assert election.room_for_agent(headroom) is room


# --- the profiler's wake-ups ---------------------------------------------------------------------------------

IDLE = r"""
import sys, threading, time
import outrider
assert outrider.instrument()
hook_tid = next(t.native_id for t in threading.enumerate() if t.name == "outrider-hook")
print(hook_tid, flush=True)
end = time.monotonic() + 2.0
while time.monotonic() < end:  # stepping: the loop is sampled
    with outrider.step():
        time.sleep(0.002)
print("stepped", flush=True)
sys.stdin.readline()  # idle from here
"""


def _switches(pid: int, tid: int) -> int:
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no switch count")


def test_the_hook_thread_samples_a_stepping_loop_and_wakes_only_to_flush_when_it_idles(tmp_path: Path) -> None:
    """An idle process paid 0.8% of a core for a 50 Hz profiler, and 1,100 of them starved their own publishers.
    Measured as wake-ups per flush (the shard's heartbeats), never as time."""
    sp = tmp_path / "spool"
    script = tmp_path / "idle.py"
    script.write_text(IDLE)
    p = subprocess.Popen([sys.executable, str(script)], env=env_for(sp, OUTRIDER_FLUSH_INTERVAL_S="0.2",
                                                                    OUTRIDER_PROFILE_HZ="50"),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdin is not None
        tid = int(p.stdout.readline())
        assert p.stdout.readline().strip() == "stepped"
        samples = counter(shard(sp, p.pid), "outrider_train_loop_samples_total")
        assert samples > 20, "sampled while it stepped"
        # idle: the loop's idle window (IDLE_S) must pass before the sampling stops; then count wake-ups per flush
        time.sleep(12)
        before = shard(sp, p.pid)
        beats0, woke0 = before.header.heartbeat_ns, _switches(p.pid, tid)
        samples = counter(before, "outrider_train_loop_samples_total")
        flushes = 0
        last = beats0
        while flushes < 15:
            time.sleep(0.05)
            beat = shard(sp, p.pid).header.heartbeat_ns
            if beat != last:
                flushes, last = flushes + 1, beat
        woke = _switches(p.pid, tid) - woke0
        idle_samples = counter(shard(sp, p.pid), "outrider_train_loop_samples_total")
        p.stdin.write("\n")
        p.stdin.flush()
        code, _, err = finish(p)
    finally:
        p.kill()
    assert code == 0, err
    assert woke <= 3 * flushes, f"{woke} wake-ups for {flushes} flushes: the idle loop is still sampled at 50 Hz"
    assert idle_samples - samples <= 1, "no samples while it idles"
