"""The hook's SIGTERM path (hook/exit_signal.py) value by value, in this process and in forks of it: when it takes
SIGTERM and when it leaves it alone, the wakeup descriptor's rules, the watch's timing, what the handler and the
watch ask of the hook and in which order, and how the process ends. tests/hook/test_exit_paths.py proves the same
outcomes on real workloads; these pin each branch where a one-line change would show.

Whatever ends a process (the handler's re-raise, the watch's kill) runs in a forked child, which reports what the
hook was asked through a pipe before it dies; the parent reads how it ended. In this process every test starts from
SIGTERM's default disposition and no wakeup descriptor, and gets back the disposition, the descriptor and the
module's state it had."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from outrider.hook import exit_signal
from tests.helpers import on_another_thread

GRACE = exit_signal.WATCH_GRACE_S


class Hook:
    """The hook as the SIGTERM path calls it: each call is reported, in order, on the descriptor `report` (a child's
    pipe to the parent, which outlives the child's death by signal) or kept in `calls`."""

    def __init__(self, report: int = -1, defer: bool = False, fail: bool = False) -> None:
        self.report, self.defer, self.fail = report, defer, fail
        self.calls: list[str] = []

    def _note(self, call: str) -> None:
        self.calls.append(call)
        if self.report >= 0:
            os.write(self.report, f"{call}\n".encode())
        if self.fail:
            raise RuntimeError(call)

    def close(self) -> None:
        self._note("close")

    def flush_from_signal(self, timeout_s: float) -> None:
        self._note(f"flush_from_signal {timeout_s}")

    def close_from_signal(self, timeout_s: float) -> None:
        # what a second SIGTERM would meet meanwhile: the default disposition, which kills at once
        default = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        self._note(f"close_from_signal {timeout_s} {'default' if default else 'handled'}")

    def defer_exit_signal(self, signum: int) -> bool:
        self.calls.append(f"defer_exit_signal {signum}")
        if self.report >= 0:
            os.write(self.report, f"defer_exit_signal {signum}\n".encode())
        return self.defer


def in_child(body: Callable[[int], None]) -> tuple[int, list[str]]:
    """body(report) run in a fork of this process: (how the child ended, as os.waitstatus_to_exitcode says: minus
    the signal that killed it; the lines it reported). A body that raises reports its traceback and exits 70."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 0
        try:
            os.close(r)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(60)  # a child that hangs dies of SIGALRM instead of holding the test
            body(w)
        except BaseException:
            os.write(w, traceback.format_exc().encode())
            code = 70
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        lines = f.read().decode().splitlines()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), lines


def wakeup_fd() -> int:
    current = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(current)
    return current


@pytest.fixture(autouse=True)
def sigterm_state() -> Iterator[None]:
    """SIGTERM's default disposition, no wakeup descriptor and the module's first state; all put back after."""
    disposition = signal.getsignal(signal.SIGTERM)
    wakeup = signal.set_wakeup_fd(-1)
    state = exit_signal._hook_getter, exit_signal._wakeup_fd, exit_signal._sigterm_at
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    exit_signal._wakeup_fd, exit_signal._sigterm_at = -1, None
    yield
    signal.signal(signal.SIGTERM, disposition)
    signal.set_wakeup_fd(wakeup)
    exit_signal._hook_getter, exit_signal._wakeup_fd, exit_signal._sigterm_at = state


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """A pipe like the hook's waker: (read end, non-blocking write end)."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    yield r, w
    for fd in (r, w):
        with contextlib.suppress(OSError):
            os.close(fd)



def user_handler(signum: int, frame: Any) -> None:
    pass


# --- install ---------------------------------------------------------------------------------------------------


def test_install_takes_sigterm_over_the_default_with_the_hook_it_is_given() -> None:
    hook = Hook()
    assert exit_signal.install(lambda: hook) is True
    assert signal.getsignal(signal.SIGTERM) is exit_signal._on_sigterm
    assert exit_signal.installed()
    assert exit_signal._hook_getter() is hook


@pytest.mark.parametrize("disposition", [signal.SIG_IGN, user_handler])
def test_install_leaves_a_handler_of_the_users_and_an_ignored_sigterm_in_place(disposition: Any) -> None:
    signal.signal(signal.SIGTERM, disposition)
    before = exit_signal._hook_getter
    assert exit_signal.install(lambda: Hook()) is False
    assert signal.getsignal(signal.SIGTERM) is disposition
    assert not exit_signal.installed()
    assert exit_signal._hook_getter is before, "the hook is not taken either"


def test_install_never_takes_sigterm_in_pid_1(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(os, "getpid", lambda: 1)
        assert exit_signal.install(lambda: Hook()) is False
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_install_from_a_thread_but_the_main_one_is_refused_without_raising() -> None:
    assert on_another_thread(lambda: exit_signal.install(lambda: Hook())) is False
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_installed_is_false_once_a_handler_set_later_replaces_the_hooks() -> None:
    assert not exit_signal.installed()
    exit_signal.install(lambda: None)
    signal.signal(signal.SIGTERM, user_handler)
    assert not exit_signal.installed()


# --- the wakeup descriptor -------------------------------------------------------------------------------------


def test_the_wakeup_descriptor_is_not_taken_without_the_handler(pipe: tuple[int, int]) -> None:
    assert exit_signal.take_wakeup_fd(pipe[1]) is False
    assert wakeup_fd() == -1 and exit_signal._wakeup_fd == -1


def test_a_free_wakeup_descriptor_is_taken_and_taking_it_again_is_no_refusal(pipe: tuple[int, int]) -> None:
    exit_signal.install(lambda: None)
    assert exit_signal.take_wakeup_fd(pipe[1]) is True
    assert wakeup_fd() == pipe[1] and exit_signal._wakeup_fd == pipe[1]
    assert exit_signal.take_wakeup_fd(pipe[1]) is True
    assert wakeup_fd() == pipe[1]


def test_a_wakeup_descriptor_someone_else_holds_stays_theirs(pipe: tuple[int, int]) -> None:
    theirs_r, theirs_w = os.pipe()
    try:
        os.set_blocking(theirs_w, False)
        exit_signal.install(lambda: None)
        signal.set_wakeup_fd(theirs_w)
        assert exit_signal.take_wakeup_fd(pipe[1]) is False
        assert wakeup_fd() == theirs_w and exit_signal._wakeup_fd == -1
    finally:
        signal.set_wakeup_fd(-1)
        os.close(theirs_r)
        os.close(theirs_w)


def test_the_wakeup_descriptor_is_refused_from_a_thread_but_the_main_one(pipe: tuple[int, int]) -> None:
    exit_signal.install(lambda: None)
    assert on_another_thread(lambda: exit_signal.take_wakeup_fd(pipe[1])) is False
    assert wakeup_fd() == -1 and exit_signal._wakeup_fd == -1


def test_a_full_wakeup_pipe_prints_no_warning_on_each_signal() -> None:
    """The hook's thread may lag behind a burst of signals; a full pipe then loses bytes it does not need (one
    SIGTERM byte is enough), and Python must not print a warning into the workload's stderr for each."""
    def body(report: int) -> None:
        sys.stderr = os.fdopen(os.dup(report), "w", buffering=1)  # where Python warns (else pytest's capture)
        _, w = os.pipe()
        os.set_blocking(w, False)
        while True:
            try:
                os.write(w, b"\0" * 65536)
            except BlockingIOError:
                break
        exit_signal.install(lambda: None)
        signal.signal(signal.SIGUSR1, lambda s, f: None)
        assert exit_signal.take_wakeup_fd(w)
        os.kill(os.getpid(), signal.SIGUSR1)
        sys.stderr.write("signalled\n")
        sys.stderr.flush()

    code, lines = in_child(body)
    assert code == 0 and lines == ["signalled"], lines


# --- the watch: on_wakeup, due, check --------------------------------------------------------------------------


def test_the_watch_is_due_a_grace_after_the_first_sigterm_byte_read() -> None:
    exit_signal.install(lambda: None)
    assert exit_signal.due() is None
    exit_signal.on_wakeup(b"\0" + bytes([signal.SIGUSR1]), 10.0)
    assert exit_signal.due() is None, "the hook waking its own thread, another signal: nothing to watch"
    exit_signal.on_wakeup(bytes([signal.SIGUSR1, signal.SIGTERM]), 10.0)
    assert exit_signal.due() == 10.0 + GRACE
    exit_signal.on_wakeup(bytes([signal.SIGTERM]), 11.0)
    assert exit_signal.due() == 10.0 + GRACE, "a second SIGTERM does not put the watch off"


def test_a_sigterm_byte_is_nothing_to_watch_when_the_handler_is_not_the_hooks() -> None:
    exit_signal.on_wakeup(bytes([signal.SIGTERM]), 10.0)
    assert exit_signal.due() is None


def test_the_watch_does_nothing_when_no_sigterm_arrived() -> None:
    def body(report: int) -> None:
        exit_signal.install(lambda: Hook(report))
        exit_signal.check(1e9)
        os.write(report, b"alive\n")

    assert in_child(body) == (0, ["alive"])


def test_the_watch_waits_out_its_grace_then_closes_the_hook_and_dies_of_sigterm_from_its_thread() -> None:
    def body(report: int) -> None:
        exit_signal.install(lambda: Hook(report))
        exit_signal.on_wakeup(bytes([signal.SIGTERM]), 10.0)
        exit_signal.check(10.0 + GRACE - 1e-6)
        os.write(report, f"due {exit_signal.due()}\n".encode())
        on_another_thread(lambda: exit_signal.check(10.0 + GRACE))  # the hook's thread: Python's handler never runs
        os.write(report, b"alive\n")

    # only close(): had the handler run, it would have closed from the signal too
    assert in_child(body) == (-signal.SIGTERM, [f"due {10.0 + GRACE}", "close"])


def test_the_watch_kills_though_the_hooks_close_fails() -> None:
    def body(report: int) -> None:
        exit_signal.install(lambda: Hook(report, fail=True))
        exit_signal.on_wakeup(bytes([signal.SIGTERM]), 10.0)
        on_another_thread(lambda: exit_signal.check(10.0 + GRACE))
        os.write(report, b"alive\n")

    assert in_child(body) == (-signal.SIGTERM, ["close"])


def test_the_watch_kills_without_a_hook_too() -> None:
    def body(report: int) -> None:
        exit_signal.install(lambda: None)
        exit_signal.on_wakeup(bytes([signal.SIGTERM]), 10.0)
        on_another_thread(lambda: exit_signal.check(10.0 + GRACE))
        os.write(report, b"alive\n")

    assert in_child(body) == (-signal.SIGTERM, [])


def test_the_watch_dies_of_sigkill_when_sigterms_default_cannot_be_restored() -> None:
    def body(report: int) -> None:
        def no_libc(*args: Any, **kwargs: Any) -> Any:
            raise OSError("no C library")

        ctypes.CDLL = no_libc  # type: ignore[misc,assignment]  # this child's only
        exit_signal.install(lambda: Hook(report))
        exit_signal.on_wakeup(bytes([signal.SIGTERM]), 10.0)
        on_another_thread(lambda: exit_signal.check(10.0 + GRACE))
        os.write(report, b"alive\n")

    assert in_child(body) == (-signal.SIGKILL, ["close"])


def test_the_watch_stands_down_when_the_handler_ran_or_was_replaced() -> None:
    def body(report: int) -> None:
        exit_signal.install(lambda: Hook(report))
        exit_signal.on_wakeup(bytes([signal.SIGTERM]), 10.0)
        signal.signal(signal.SIGTERM, user_handler)
        on_another_thread(lambda: exit_signal.check(10.0 + GRACE))
        os.write(report, f"due {exit_signal.due()}\n".encode())

    assert in_child(body) == (0, ["due None"])


# --- the handler -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fail", [False, True])
def test_a_handler_that_chains_to_the_hooks_gets_a_flush_and_the_process_lives_on(fail: bool) -> None:
    def body(report: int) -> None:
        exit_signal.install(lambda: Hook(report, fail=fail))
        found = signal.getsignal(signal.SIGTERM)

        def graceful(signum: int, frame: Any) -> None:  # PyTorch Lightning's SignalConnector
            assert callable(found)
            found(signum, frame)
            os.write(report, b"graceful\n")

        signal.signal(signal.SIGTERM, graceful)
        os.kill(os.getpid(), signal.SIGTERM)
        os.write(report, f"{'graceful' if signal.getsignal(signal.SIGTERM) is graceful else 'replaced'}\n".encode())

    code, lines = in_child(body)
    assert (code, lines) == (0, [f"flush_from_signal {exit_signal.FLUSH_TIMEOUT_S}", "graceful", "graceful"])


def test_a_chained_call_without_a_hook_does_nothing() -> None:
    def body(report: int) -> None:
        exit_signal.install(lambda: None)
        signal.signal(signal.SIGTERM, user_handler)
        exit_signal._on_sigterm(signal.SIGTERM, None)
        os.write(report, b"alive\n")

    assert in_child(body) == (0, ["alive"])


@pytest.mark.parametrize("fail", [False, True])
def test_the_handler_restores_the_default_closes_the_hook_and_dies_of_sigterm(fail: bool) -> None:
    def body(report: int) -> None:
        exit_signal.install(lambda: Hook(report, fail=fail))
        os.kill(os.getpid(), signal.SIGTERM)
        os.write(report, b"alive\n")

    code, lines = in_child(body)
    assert (code, lines) == (-signal.SIGTERM, [f"defer_exit_signal {signal.SIGTERM}",
                                               f"close_from_signal {exit_signal.FLUSH_TIMEOUT_S} default"])


def test_the_handler_without_a_hook_dies_of_sigterm() -> None:
    def body(report: int) -> None:
        exit_signal.install(lambda: None)
        os.kill(os.getpid(), signal.SIGTERM)
        os.write(report, b"alive\n")

    assert in_child(body) == (-signal.SIGTERM, [])


def test_the_handler_called_on_another_thread_reaches_the_hook_without_raising() -> None:
    """A framework that forwards the signal from a thread of its own calls the handler it found there, where
    signal.signal refuses to restore the default."""
    def body(report: int) -> None:
        exit_signal.install(lambda: Hook(report, defer=True))
        on_another_thread(lambda: exit_signal._on_sigterm(signal.SIGTERM, None))
        os.write(report, b"returned\n")

    assert in_child(body) == (0, [f"defer_exit_signal {signal.SIGTERM}", "returned"])


def test_a_sigterm_inside_the_hooks_flush_is_deferred_with_the_default_restored_and_the_watch_stood_down() -> None:
    def body(report: int) -> None:
        exit_signal.install(lambda: Hook(report, defer=True))
        exit_signal.on_wakeup(bytes([signal.SIGTERM]), 10.0)
        os.kill(os.getpid(), signal.SIGTERM)
        default = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        os.write(report, f"default {default} due {exit_signal.due()}\n".encode())

    assert in_child(body) == (0, [f"defer_exit_signal {signal.SIGTERM}", "default True due None"])


# --- after fork ------------------------------------------------------------------------------------------------


def test_a_forked_child_points_the_parents_pipe_at_dev_null_and_frees_the_wakeup_descriptor(
        pipe: tuple[int, int]) -> None:
    r, w = pipe
    exit_signal.install(lambda: None)
    exit_signal.on_wakeup(bytes([signal.SIGTERM]), 10.0)
    assert exit_signal.take_wakeup_fd(w)
    before = sorted(os.listdir("/proc/self/fd"))
    assert exit_signal.after_fork_in_child(w) is True
    assert wakeup_fd() == -1 and exit_signal._wakeup_fd == -1 and exit_signal.due() is None
    assert os.write(w, b"x") == 1, "a signal's byte goes nowhere, without an error"
    os.set_blocking(r, False)
    assert os.read(r, 10) == b"", "the parent's pipe has no writer left in the child"
    assert not os.get_inheritable(w)
    assert sorted(os.listdir("/proc/self/fd")) == before, "/dev/null's own descriptor is closed"
    assert exit_signal.after_fork_in_child(w) is False, "done once"


def test_a_forked_child_leaves_a_descriptor_that_is_not_the_hooks(pipe: tuple[int, int]) -> None:
    r, w = pipe
    exit_signal.install(lambda: None)
    exit_signal.on_wakeup(bytes([signal.SIGTERM]), 10.0)
    assert exit_signal.after_fork_in_child(w) is False, "the hook never took it"
    assert exit_signal.due() is None, "the parent's SIGTERM is not the child's"
    assert exit_signal.take_wakeup_fd(w)
    assert exit_signal.after_fork_in_child(w + 100) is False
    assert wakeup_fd() == w and exit_signal._wakeup_fd == w
    assert os.write(w, b"x") == 1 and os.read(r, 10) == b"x", "still the pipe"


def test_a_forked_child_puts_back_a_wakeup_descriptor_taken_over_since(pipe: tuple[int, int]) -> None:
    r, w = pipe
    theirs_r, theirs_w = os.pipe()
    try:
        os.set_blocking(theirs_w, False)
        exit_signal.install(lambda: None)
        assert exit_signal.take_wakeup_fd(w)
        signal.set_wakeup_fd(theirs_w)  # asyncio's loop took it over
        assert exit_signal.after_fork_in_child(w) is False
        assert wakeup_fd() == theirs_w and exit_signal._wakeup_fd == -1
        assert os.write(w, b"x") == 1 and os.read(r, 10) == b"", "the parent's pipe is still pointed away"
    finally:
        signal.set_wakeup_fd(-1)
        os.close(theirs_r)
        os.close(theirs_w)


def test_a_child_forked_from_another_thread_keeps_dev_null_in_place(pipe: tuple[int, int]) -> None:
    r, w = pipe
    exit_signal.install(lambda: None)
    assert exit_signal.take_wakeup_fd(w)
    assert on_another_thread(lambda: exit_signal.after_fork_in_child(w)) is False
    assert exit_signal._wakeup_fd == -1
    assert os.write(w, b"x") == 1 and os.read(r, 10) == b""


def test_a_pipe_on_descriptor_0_is_the_hooks_too() -> None:
    """A workload started with stdin closed gets descriptor 0 for a pipe end."""
    def body(report: int) -> None:
        _, w = os.pipe()
        os.dup2(w, 0)
        os.set_blocking(0, False)
        exit_signal.install(lambda: None)
        assert exit_signal.take_wakeup_fd(0)
        os.write(report, f"{exit_signal.after_fork_in_child(0)} {wakeup_fd()}\n".encode())

    assert in_child(body) == (0, ["True -1"])


def test_a_child_out_of_descriptors_still_frees_the_wakeup_descriptor() -> None:
    def body(report: int) -> None:
        import resource

        _, w = os.pipe()
        os.set_blocking(w, False)
        exit_signal.install(lambda: None)
        assert exit_signal.take_wakeup_fd(w)
        # its first call in this process before the descriptors run out: mutation testing notes each function's
        # first call in a file, which this test must be able to open (a descriptor that is no pipe's: nothing done)
        assert exit_signal.after_fork_in_child(-2) is False
        highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        while True:  # every descriptor below the limit taken: /dev/null cannot be opened
            try:
                os.dup(w)
            except OSError:
                break
        os.write(report, f"{exit_signal.after_fork_in_child(w)} {wakeup_fd()}\n".encode())

    assert in_child(body) == (0, ["True -1"])


def spoil(fd: int, how: str) -> None:
    """Someone else's wakeup descriptor, closed or made blocking since they set it: set_wakeup_fd refuses it back
    (OSError, ValueError)."""
    if how == "closed":
        os.close(fd)
    else:
        os.set_blocking(fd, True)


def nonblocking_pipe() -> int:
    _, w = os.pipe()
    os.set_blocking(w, False)
    return w


@pytest.mark.parametrize("how", ["closed", "blocking"])
def test_a_forked_child_lets_go_of_a_wakeup_descriptor_it_cannot_put_back(how: str) -> None:
    def body(report: int) -> None:
        w, theirs = nonblocking_pipe(), nonblocking_pipe()
        exit_signal.install(lambda: None)
        assert exit_signal.take_wakeup_fd(w)
        signal.set_wakeup_fd(theirs)
        spoil(theirs, how)
        os.write(report, f"{exit_signal.after_fork_in_child(w)} {wakeup_fd()}\n".encode())

    assert in_child(body) == (0, ["False -1"])


@pytest.mark.parametrize("how", ["closed", "blocking"])
def test_a_wakeup_descriptor_that_cannot_be_given_back_is_the_hooks(how: str) -> None:
    def body(report: int) -> None:
        w, theirs = nonblocking_pipe(), nonblocking_pipe()
        exit_signal.install(lambda: None)
        signal.set_wakeup_fd(theirs)
        spoil(theirs, how)
        taken = exit_signal.take_wakeup_fd(w)
        os.write(report, f"{taken} {wakeup_fd() == w} {exit_signal._wakeup_fd == w}\n".encode())

    assert in_child(body) == (0, ["True True True"])
