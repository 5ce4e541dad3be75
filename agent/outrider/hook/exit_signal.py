"""The hook's SIGTERM: the final flush, then the same death SIGTERM would have given without the hook.

Installed by instrument() from the main thread, and only over the default disposition: a handler of the user's,
or SIG_IGN, is never replaced, and a handler the user sets later replaces this one. Never in PID 1 of a PID
namespace (a container's command with no init): the kernel drops a signal PID 1 has no handler for, so there the
default disposition ignores SIGTERM, and a handler of the hook's would turn a SIGTERM the workload trains on through
into a closed shard (the agent takes the process for finished) while it lives on. A handler set later that calls
the one it found (PyTorch Lightning's SignalConnector chains to it to stop training gracefully) gets a flush from
it and nothing more: the process lives on, as it would without the hook. The handler restores the default first
(a second SIGTERM kills at once, as the default does), has the hook closed by the hook's own thread, waiting for
at most FLUSH_TIMEOUT_S (the main thread may have been interrupted holding something the flush needs: the exit is
then delayed by that much, never forever), and raises SIGTERM again: the status is the signal's, and atexit
handlers do not run, as without the hook. Interrupted inside the hook's own flush, it lets that flush end first
(Hook.defer_exit_signal).

A Python handler runs when the main thread next executes Python code, which a main thread blocked in a C call
that signals do not interrupt (a collective that never completes) may never do; without the hook SIGTERM would
have killed it at once. So the hook's pipe is made the signal wakeup descriptor (signal.set_wakeup_fd, taken only
when no one else holds it: asyncio's loop, for one, takes it over, and the watch then stays idle), and the hook's
one thread, which waits on that pipe anyway (runtime.Hook's loop), hands every byte it reads to `on_wakeup`: when
SIGTERM arrived and our handler has still not run WATCH_GRACE_S later (`check`), it flushes from its own thread and
ends the process with SIGTERM's default action. No thread of its own: under a thread limit every thread the hook
takes is one the workload cannot have. Forked children never write into the parent's pipe (after_fork_in_child).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from typing import Any

FLUSH_TIMEOUT_S = 2.0
WATCH_GRACE_S = FLUSH_TIMEOUT_S + 1.0

_hook_getter: Callable[[], Any] = lambda: None  # noqa: E731 - replaced by install()
_wakeup_fd = -1  # the write end of the hook's pipe while it is the process's signal wakeup descriptor
_sigterm_at: float | None = None  # when the hook's thread read SIGTERM from the pipe (monotonic), until handled


def install(hook_getter: Callable[[], Any]) -> bool:
    """The handler; False where the hook must not take SIGTERM (see the module docstring)."""
    global _hook_getter
    try:  # signal.signal refuses (ValueError) on any thread but the main one, green threads' libraries or not
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL or os.getpid() == 1:
            return False
        _hook_getter = hook_getter
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):
        return False
    return True


def installed() -> bool:
    return signal.getsignal(signal.SIGTERM) is _on_sigterm  # any thread may ask (only setting is the main one's)


def take_wakeup_fd(write_fd: int) -> bool:
    """Makes the hook's pipe (its non-blocking write end) the signal wakeup descriptor, unless another one is set or
    this is not the main thread (set_wakeup_fd's rule); True when it is ours."""
    global _wakeup_fd
    if not installed():
        return False
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        return False
    if previous not in (-1, write_fd):  # someone else's (asyncio's): theirs stays
        try:
            signal.set_wakeup_fd(previous)
            return False
        except (ValueError, OSError):
            pass  # theirs closed or made blocking since: ours stays, known as ours (a fork then lets go of it)
    _wakeup_fd = write_fd
    return True


def on_wakeup(data: bytes, now: float) -> None:
    """The hook's thread read these signal numbers from its pipe (a 0 byte is the hook waking its own thread)."""
    global _sigterm_at
    if signal.SIGTERM in data and _sigterm_at is None and installed():
        _sigterm_at = now


def due() -> float | None:
    """When check() has something to do (monotonic), or None."""
    return None if _sigterm_at is None else _sigterm_at + WATCH_GRACE_S


def check(now: float) -> None:
    """On the hook's thread: SIGTERM arrived WATCH_GRACE_S ago and our handler has not run (it restores the default
    first): the main thread has run no Python code since, blocked in C. Its job, from here."""
    global _sigterm_at
    if _sigterm_at is None or now - _sigterm_at < WATCH_GRACE_S:
        return
    _sigterm_at = None
    if not installed():
        return  # our handler ran, or the user's replaced it
    default = _default_sigterm()
    with contextlib.suppress(Exception):  # a close that fails must not keep alive a process told to end
        h = _hook_getter()
        if h is not None:
            h.close()
    # SIGKILL where SIGTERM's default could not be restored: die all the same
    os.kill(os.getpid(), signal.SIGTERM if default else signal.SIGKILL)


def _on_sigterm(signum: int, frame: Any) -> None:
    global _sigterm_at
    chained = signal.getsignal(signal.SIGTERM) is not _on_sigterm
    h = _hook_getter()
    if chained:
        # A handler installed over ours called us as the one it found (PyTorch Lightning's SignalConnector does):
        # the process's fate is that handler's, which may well be a graceful stop. Publish, and do not kill.
        if h is not None:
            with contextlib.suppress(Exception):
                h.flush_from_signal(FLUSH_TIMEOUT_S)
        return
    with contextlib.suppress(Exception):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _sigterm_at = None  # handled here: the watch has nothing left to do
    if h is not None and h.defer_exit_signal(signum):
        return  # the main thread was inside the hook's own flush: it raises the signal again when that ends
    if h is not None:
        with contextlib.suppress(Exception):
            h.close_from_signal(FLUSH_TIMEOUT_S)
    os.kill(os.getpid(), signal.SIGTERM)


def _default_sigterm() -> bool:
    """SIGTERM's default disposition set from a thread other than the main one, through the C library (Python's
    signal.signal is main-thread only)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal.restype = ctypes.c_void_p
        return bool(libc.signal(int(signal.SIGTERM), 0) != ctypes.c_void_p(-1).value)
    except Exception:
        return False


def after_fork_in_child(inherited_write_fd: int) -> bool:
    """In a forked child, before its hook makes a pipe of its own: the inherited wakeup descriptor is the parent's
    pipe, and a signal in the child must never read as the parent's. It is pointed at /dev/null at once (whatever
    thread forked); then the process's wakeup descriptor is cleared if it was ours. True when the child may take
    the wakeup descriptor for its own pipe (the forking thread is the child's main thread)."""
    global _wakeup_fd, _sigterm_at
    _sigterm_at = None
    if _wakeup_fd < 0 or _wakeup_fd != inherited_write_fd:
        return False
    w = _wakeup_fd
    _wakeup_fd = -1
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        os.dup2(null, w, inheritable=False)
        os.close(null)
    try:
        current = signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        return False  # the /dev/null in place of the parent's pipe keeps the child harmless
    if current != w:  # not ours any more (asyncio's): put it back
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(current)
        return False
    return True
