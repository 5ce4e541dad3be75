"""Exit paths: the steps a process made since its last flush survive every way it can end but SIGKILL.

The hook's flush interval is the longest allowed (an hour), so no periodic flush publishes anything: what the spool
holds was written by the exit path under test. Real processes, real signals, real forks; the counts are read back
from the shards the processes left in the spool.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from outrider.shared import spool
from tests.conftest import need_binary
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

WORKLOAD = r"""
import os, pathlib, signal, sys, time
import outrider

mode, control = sys.argv[1], pathlib.Path(sys.argv[2])


def steps(n):
    for _ in range(n):
        with outrider.step(samples=2):
            pass


def wait_for(name):
    while not (control / name).exists():
        time.sleep(0.02)


if mode == "user-handler":
    def handler(signum, frame):
        (control / "user-handler-ran").touch()
        sys.exit(0)
    signal.signal(signal.SIGTERM, handler)
elif mode == "ignored":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
outrider.instrument()
steps(17)
if mode == "sys.exit":
    sys.exit(3)
elif mode == "os._exit-after-flush":
    outrider.flush()
    os._exit(4)
elif mode == "sigterm-inside-flush":
    from outrider.hook import api
    # The signal arrives while the main thread is inside the hook's flush (here: its last sampler), as when a
    # Pool worker's exit flush is under way and Pool.terminate() sends SIGTERM.
    api.S.hook.samplers.append(lambda: os.kill(os.getpid(), signal.SIGTERM))
    outrider.flush()
    sys.exit(9)  # never reached: the flush ends, then the process dies of the signal
elif mode == "sigterm-blocked-in-c":
    import ctypes
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: glibc's PTHREAD_MUTEX_INITIALIZER, a normal mutex
    libc.pthread_mutex_lock(mutex)
    (control / "ready").touch()
    libc.pthread_mutex_lock(mutex)  # the main thread waits in C for ever; a signal does not interrupt the wait
elif mode == "child-sigterm":
    from outrider.hook import exit_signal
    pid = os.fork()
    if pid == 0:
        steps(7)
        time.sleep(60)
        os._exit(0)
    time.sleep(0.5)
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    (control / "child").write_text(f"{pid} {os.waitstatus_to_exitcode(status)}")
    time.sleep(exit_signal.WATCH_GRACE_S + 1.0)  # what the parent's watch would wait before acting
elif mode == "chained-handler":
    # A framework that installs its handler after instrument() and calls the one it found (PyTorch Lightning's
    # SignalConnector): SIGTERM asks the loop to stop gracefully, and the process must live to do it.
    previous = signal.getsignal(signal.SIGTERM)
    stop = []
    def graceful(signum, frame):
        stop.append(signum)
        if callable(previous):
            previous(signum, frame)
    signal.signal(signal.SIGTERM, graceful)
    (control / "ready").touch()
    while not stop:
        time.sleep(0.02)
    steps(5)  # the last steps before a graceful stop (a checkpoint, in Lightning)
    (control / "graceful").touch()
    sys.exit(0)
elif mode == "pid-1":
    # PID 1 of its namespace (a container's command with no init): the kernel drops a SIGTERM it has no handler
    # for, so it trains on through one; so it must with the hook.
    assert os.getpid() == 1
    outrider.flush()
    (control / "ready").touch()
    wait_for("release")  # SIGTERM arrives while this waits
    steps(5)
    outrider.flush()
    (control / "trained").touch()
    wait_for("finish")
elif mode in ("sigterm", "user-handler", "ignored"):
    (control / "ready").touch()
    wait_for("release")  # SIGTERM arrives while this waits
elif mode == "fork":
    pid = os.fork()
    if pid == 0:
        steps(7)
        sys.exit(0)  # the child's own exit: atexit runs in it too
    (control / "child").write_text(str(pid))
    os.waitpid(pid, 0)
elif mode == "multiprocessing":
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=steps, args=(9,))  # a Process child leaves through os._exit
    p.start()
    p.join()
    (control / "child").write_text(str(p.pid))
    with ctx.Pool(2) as pool:  # leaving the block terminates the workers with SIGTERM
        pool.map(steps, [3, 4], chunksize=1)
"""


def _run(tmp_path: Path, mode: str, prefix: list[str] | None = None) -> tuple[subprocess.Popen[bytes], Path, Path]:
    sp, control = tmp_path / "spool", tmp_path / "control"
    control.mkdir()
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    env.update({"OUTRIDER_SPOOL_DIR": str(sp), "OUTRIDER_STANDALONE": "false", "OUTRIDER_FLUSH_INTERVAL_S": "3600"})
    p = subprocess.Popen([*(prefix or []), sys.executable, str(script), mode, str(control)], env=env,
                         stderr=subprocess.PIPE)
    return p, sp, control


def _pending_signals(pid: int) -> int:
    """The signals pending for the process, its own and its thread group's (a mask by signal number)."""
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)


def _shards(sp: Path) -> dict[int, spool.ShardSnapshot]:
    """Each process's last published state, by pid."""
    out = {}
    for path in sp.glob("*.shard"):
        snap = spool.decode(path.read_bytes())
        out[snap.header.pid] = snap
    return out


def _finish(p: subprocess.Popen[bytes]) -> tuple[int, str]:
    try:
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    return p.returncode, err.decode(errors="replace")


def test_sys_exit_publishes_the_steps_and_keeps_the_exit_status(tmp_path: Path) -> None:
    p, sp, _ = _run(tmp_path, "sys.exit")
    code, err = _finish(p)
    assert code == 3, err
    snap = _shards(sp)[p.pid]
    assert snap.header.steps == 17 and snap.header.flags & spool.FLAG_CLOSED


def test_os_exit_after_an_explicit_flush_publishes_the_steps(tmp_path: Path) -> None:
    p, sp, _ = _run(tmp_path, "os._exit-after-flush")
    code, err = _finish(p)
    assert code == 4, err
    snap = _shards(sp)[p.pid]
    assert snap.header.steps == 17
    assert not snap.header.flags & spool.FLAG_CLOSED, "a flush, not a close: the agent retires it as a dead pid"


def test_sigterm_publishes_the_steps_and_the_process_still_dies_of_sigterm(tmp_path: Path) -> None:
    p, sp, control = _run(tmp_path, "sigterm")
    try:
        wait_until(lambda: (control / "ready").exists(), timeout_s=60, what="the workload's steps")
        assert _shards(sp) == {}, "nothing was published before the signal"
        p.send_signal(signal.SIGTERM)
        code, err = _finish(p)
    finally:
        (control / "release").touch()
    assert code == -signal.SIGTERM, err  # the same status as without the hook
    snap = _shards(sp)[p.pid]
    assert snap.header.steps == 17 and snap.header.flags & spool.FLAG_CLOSED


def test_sigterm_inside_the_hooks_own_flush_lets_it_finish_then_dies_of_sigterm(tmp_path: Path) -> None:
    p, sp, _ = _run(tmp_path, "sigterm-inside-flush")
    code, err = _finish(p)
    assert code == -signal.SIGTERM, err
    assert _shards(sp)[p.pid].header.steps == 17


def test_sigterm_to_a_main_thread_blocked_in_c_still_flushes_and_dies_of_sigterm(tmp_path: Path) -> None:
    """Without the hook, SIGTERM kills a process whose main thread waits in C (a collective that never ends) at
    once; a Python handler alone would never run there. The watch thread does its job."""
    p, sp, control = _run(tmp_path, "sigterm-blocked-in-c")
    try:
        wait_until(lambda: (control / "ready").exists(), timeout_s=60, what="the main thread blocked in C")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == -signal.SIGTERM
    finally:
        p.kill()
        p.wait()
    assert _shards(sp)[p.pid].header.steps == 17


def test_a_forked_childs_sigterm_is_never_taken_for_the_parents(tmp_path: Path) -> None:
    p, sp, control = _run(tmp_path, "child-sigterm")
    code, err = _finish(p)
    assert code == 0, err  # the parent lived on past its watch's grace, then exited normally
    child, child_code = map(int, (control / "child").read_text().split())
    assert child_code == -signal.SIGTERM
    shards = _shards(sp)
    assert shards[child].header.steps == 7 and shards[p.pid].header.steps == 17


def test_a_sigterm_handler_of_the_users_is_left_in_place(tmp_path: Path) -> None:
    p, sp, control = _run(tmp_path, "user-handler")
    try:
        wait_until(lambda: (control / "ready").exists(), timeout_s=60, what="the workload's steps")
        p.send_signal(signal.SIGTERM)
        code, err = _finish(p)
    finally:
        (control / "release").touch()
    assert code == 0 and (control / "user-handler-ran").exists(), err
    assert _shards(sp)[p.pid].header.steps == 17, "the handler's sys.exit flushes through atexit"


def test_a_handler_that_chains_to_the_hooks_keeps_the_process_alive_to_stop_gracefully(tmp_path: Path) -> None:
    p, sp, control = _run(tmp_path, "chained-handler")
    wait_until(lambda: (control / "ready").exists(), timeout_s=60, what="the workload's steps")
    p.send_signal(signal.SIGTERM)
    code, err = _finish(p)
    assert code == 0 and (control / "graceful").exists(), f"the hook's handler killed the process ({code}): {err}"
    assert _shards(sp)[p.pid].header.steps == 22, "the steps before and after the signal, flushed at exit"


def test_an_ignored_sigterm_stays_ignored(tmp_path: Path) -> None:
    p, sp, control = _run(tmp_path, "ignored")
    try:
        wait_until(lambda: (control / "ready").exists(), timeout_s=60, what="the workload's steps")
        p.send_signal(signal.SIGTERM)
        # The process lives on through the signal; released, it ends normally, and flushes then.
        (control / "release").touch()
        code, err = _finish(p)
    finally:
        (control / "release").touch()
    assert code == 0, err
    assert _shards(sp)[p.pid].header.steps == 17


def test_a_pid_1_workload_trains_on_through_the_sigterm_it_ignores_and_its_shard_stays_open(tmp_path: Path) -> None:
    """PID 1 of a PID namespace (a container's command, with no init) ignores a SIGTERM it has no handler for: the
    kernel drops it. The hook must leave it so: had it taken SIGTERM there, its handler would close the shard and
    re-raise a signal the kernel drops again, and the process would train on unseen (its shard closed: the agent
    takes it for finished and retires its series)."""
    unshare = need_binary("unshare")
    probe = subprocess.run([unshare, "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace can be made here: {probe.stderr.strip()}")
    p, sp, control = _run(tmp_path, "pid-1", [unshare, "--user", "--map-root-user", "--pid", "--fork",
                                                "--mount-proc"])
    try:
        wait_until(lambda: (control / "ready").exists(), timeout_s=60, what="the workload's steps")
        (pid,) = map(int, Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split())  # its pid out here
        before = _shards(sp)[1]
        assert before.header.steps == 17 and not before.header.flags & spool.FLAG_CLOSED
        os.kill(pid, signal.SIGTERM)  # as the container runtime stops a container
        # Delivered (to a handler, which then runs before the loop's next look) or dropped: pending no more
        wait_until(lambda: not _pending_signals(pid) & (1 << (signal.SIGTERM - 1)), timeout_s=60,
                   what="SIGTERM delivered or dropped")
        (control / "release").touch()
        wait_until(lambda: (control / "trained").exists() or p.poll() is not None, timeout_s=60,
                   what="the steps after SIGTERM")
        assert p.poll() is None, "the workload died of the SIGTERM it ignores without the hook"
        during = _shards(sp)[1]
        assert not during.header.flags & spool.FLAG_CLOSED, "its shard was closed while it trained on"
        assert during.header.steps == 22, "the steps after the signal are published"
    finally:
        (control / "release").touch()
        (control / "finish").touch()
    code, err = _finish(p)
    assert code == 0, err
    after = _shards(sp)[1]
    assert after.header.steps == 22 and after.header.flags & spool.FLAG_CLOSED, "closed at its own exit"


def test_a_forked_child_publishes_its_own_steps_under_its_own_pid(tmp_path: Path) -> None:
    p, sp, control = _run(tmp_path, "fork")
    code, err = _finish(p)
    assert code == 0, err
    child = int((control / "child").read_text())
    shards = _shards(sp)
    assert set(shards) == {p.pid, child}
    assert shards[p.pid].header.steps == 17 and shards[child].header.steps == 7, "the parent's are not copied"
    assert shards[child].header.flags & spool.FLAG_CLOSED


def test_multiprocessing_children_publish_their_steps_on_os_exit_and_on_pool_termination(tmp_path: Path) -> None:
    p, sp, control = _run(tmp_path, "multiprocessing")
    code, err = _finish(p)
    assert code == 0, err
    child = int((control / "child").read_text())
    shards = _shards(sp)
    assert shards[p.pid].header.steps == 17
    assert shards[child].header.steps == 9 and shards[child].header.flags & spool.FLAG_CLOSED
    workers = {pid: s.header.steps for pid, s in shards.items() if pid not in (p.pid, child)}
    assert sum(workers.values()) == 3 + 4, workers
