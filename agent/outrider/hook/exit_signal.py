"""The hook's SIGTERM: the final flush, then the same death SIGTERM would have given without the hook.

Installed by instrument() from the main thread, and only over the default disposition: a handler of the user's,
or SIG_IGN, is never replaced, and a handler the user sets later replaces this one. A handler set later that calls
the one it found (PyTorch Lightning's SignalConnector chains to it to stop training gracefully) gets a flush from
it and nothing more: the process lives on, as it would without the hook. The handler restores the
default first (a second SIGTERM kills at once, as the default does), closes the hook on a thread joined for at
most FLUSH_TIMEOUT_S (the main thread may have been interrupted holding a lock the flush needs: the exit is then
delayed by that much, never forever), and raises SIGTERM again: the status is the signal's, and atexit handlers do
not run, as without the hook. Interrupted inside the hook's own flush, it lets that flush end first
(Hook.defer_exit_signal).

A Python handler runs when the main thread next executes Python code, which a main thread blocked in a C call
that signals do not interrupt (a collective that never completes) may never do; without the hook SIGTERM would
have killed it at once. So the watch thread reads the signal wakeup descriptor (signal.set_wakeup_fd, taken only
when no one else holds it: asyncio's loop, for one, takes it over and the watch then stays idle): when SIGTERM
arrived and our handler has still not run WATCH_GRACE_S later, it flushes from its own thread and ends the process
with SIGTERM's default action. Forked children get a watch of their own, never the parent's descriptor.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

FLUSH_TIMEOUT_S = 2.0
WATCH_GRACE_S = FLUSH_TIMEOUT_S + 1.0

_handler: Callable[[int, Any], None] | None = None
_hook_getter: Callable[[], Any] = lambda: None  # noqa: E731 - replaced by install()
_wakeup_fd = -1  # the write end of our pipe while it is the process's signal wakeup descriptor
_read_fd = -1
_fork_handler_registered = False


def install(hook_getter: Callable[[], Any]) -> bool:
    """The handler and its watch; False where the hook must not take SIGTERM (see the module docstring)."""
    global _handler, _hook_getter, _fork_handler_registered
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return False
        _hook_getter = hook_getter
        _handler = _on_sigterm
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):
        return False
    if not _fork_handler_registered:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_handler_registered = True
    if _read_fd < 0:
        _start_watch()
    return True


def _on_sigterm(signum: int, frame: Any) -> None:
    try:
        chained = signal.getsignal(signal.SIGTERM) is not _on_sigterm
    except Exception:
        chained = False
    if chained:
        # A handler installed over ours called us as the one it found (PyTorch Lightning's SignalConnector does):
        # the process's fate is that handler's, which may well be a graceful stop. Publish, and do not kill.
        _flush_only(_hook_getter())
        return
    with contextlib.suppress(Exception):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    h = _hook_getter()
    if h is not None and h.defer_exit_signal(signum):
        return  # the main thread was inside the hook's own flush: it raises the signal again when that ends
    _flush_then_die(h)


def _flush_only(h: Any) -> None:
    """A flush on a thread, waited for at most FLUSH_TIMEOUT_S (the interrupted main thread may hold its lock)."""
    if h is None:
        return
    with contextlib.suppress(Exception):
        t = threading.Thread(target=h.flush, name="outrider-sigterm-flush", daemon=True)
        t.start()
        t.join(FLUSH_TIMEOUT_S)


def _flush_then_die(h: Any) -> None:
    if h is not None:
        try:
            t = threading.Thread(target=h.close, name="outrider-sigterm-flush", daemon=True)
            t.start()
            t.join(FLUSH_TIMEOUT_S)
        except Exception:  # no thread can start (the interpreter is shutting down): die without the flush
            pass
    os.kill(os.getpid(), signal.SIGTERM)


def _start_watch() -> None:
    """Our pipe as the signal wakeup descriptor and a thread reading it, unless another wakeup descriptor is set."""
    global _wakeup_fd, _read_fd
    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
    except OSError:
        return
    try:
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(r)
        os.close(w)
        return
    if previous != -1:  # someone else's (asyncio's): theirs stays
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
        return
    _wakeup_fd, _read_fd = w, r
    with contextlib.suppress(RuntimeError):  # no new thread at interpreter shutdown
        threading.Thread(target=_watch, args=(r,), name="outrider-sigterm-watch", daemon=True).start()


def _watch(r: int) -> None:
    while True:
        try:
            data = os.read(r, 512)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM not in data:
            continue  # another signal with a Python handler (SIGINT's default one): not ours to act on
        time.sleep(WATCH_GRACE_S)
        with contextlib.suppress(Exception):
            if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
                continue  # our handler ran (it restores the default first), or the user's replaced it
            # The main thread has not run Python code since the signal: blocked in C. Its job, from here.
            if _default_sigterm():
                _flush_then_die(_hook_getter())
            else:
                h = _hook_getter()
                if h is not None:
                    h.close()
                os.kill(os.getpid(), signal.SIGKILL)  # cannot restore SIGTERM's default: die all the same


def _default_sigterm() -> bool:
    """SIGTERM's default disposition set from a thread other than the main one, through the C library (Python's
    signal.signal is main-thread only)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal.restype = ctypes.c_void_p
        return bool(libc.signal(int(signal.SIGTERM), 0) != ctypes.c_void_p(-1).value)
    except Exception:
        return False


def _after_fork_in_child() -> None:
    """The inherited wakeup descriptor is the parent's pipe: a signal in the child must never read as the
    parent's. It is pointed at /dev/null at once (whatever thread forked), then the child gets a watch of its own
    (the forking thread is the child's main thread)."""
    global _wakeup_fd, _read_fd
    if _wakeup_fd < 0:
        return
    w, r = _wakeup_fd, _read_fd
    _wakeup_fd = _read_fd = -1
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        os.dup2(null, w, inheritable=False)
        os.close(null)
    with contextlib.suppress(OSError):
        os.close(r)
    try:
        current = signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        return  # the /dev/null in place of the parent's pipe keeps the child harmless
    if current != w:  # not ours any more (asyncio's): put it back
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(current)
        return
    with contextlib.suppress(OSError):
        os.close(w)
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        _start_watch()
