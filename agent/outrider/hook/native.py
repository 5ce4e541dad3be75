"""The operating system's own threads, locks and waits for the hook, whatever a green-thread library did to the
standard library.

gevent's `monkey.patch_all()` (gunicorn -k gevent, crawlers) and eventlet's `monkey_patch()` turn threading.Thread
into a greenlet, threading.Lock into a greenlet lock, time.sleep and select.select into cooperative switches, all
on the process's one OS thread. The hook's thread must not be one of those: a greenlet that blocks in a system call
the library did not patch (os.read of the signal pipe) stops every greenlet, the main one included, for good (that
is how `instrument()` never returned under gevent), and one that waits cooperatively only runs when the workload
yields. So the hook takes the originals the libraries keep (gevent.monkey.get_original, eventlet.patcher.original)
when, and only when, the module was patched; otherwise the standard library's. Nothing is imported for it: a
library that is not in sys.modules patched nothing.

A raw OS thread started here is invisible to `threading.enumerate()` under a green library; it names itself in the
kernel (prctl PR_SET_NAME, what /proc/PID/task/TID/comm shows), so the hook's CPU accounting still sees it as the
hook's (hook/threads.py), and so do py-spy and top -H.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from collections.abc import Callable
from typing import Any

_PR_SET_NAME = 15


def patched(module: str) -> bool:
    """Whether gevent or eventlet replaced this standard module's functions (as far as either says)."""
    gevent = sys.modules.get("gevent.monkey")
    if gevent is not None:
        with contextlib.suppress(Exception):
            if gevent.is_module_patched(module):
                return True
    eventlet = sys.modules.get("eventlet.patcher")
    if eventlet is not None:
        with contextlib.suppress(Exception):
            if eventlet.is_monkey_patched(module):
                return True
    return False


def original(module: str, name: str) -> Any:
    """The standard library's `module.name` as it was before any green library patched it."""
    gevent = sys.modules.get("gevent.monkey")
    if gevent is not None:
        with contextlib.suppress(Exception):
            if gevent.is_module_patched(module):
                return gevent.get_original(module, name)
    eventlet = sys.modules.get("eventlet.patcher")
    if eventlet is not None:
        with contextlib.suppress(Exception):
            if eventlet.is_monkey_patched(module.lstrip("_")):
                return getattr(eventlet.original(module), name)
    return getattr(importlib.import_module(module), name)


def green() -> bool:
    """Whether threads are green here (threading was patched): the hook's threads must then be raw OS threads."""
    return patched("threading") or patched("_thread") or patched("thread")


def allocate_lock() -> Any:
    """A lock of the operating system's (blocking it blocks this OS thread, whatever greenlet runs on it)."""
    return original("_thread", "allocate_lock")()


def start_thread(target: Callable[[], None], name: str) -> bool:
    """Runs target on a new OS thread (a daemon: it never holds the interpreter's exit); False when none can start
    (a thread limit: RLIMIT_NPROC, a pids cgroup, memory)."""
    try:
        if not green():
            threading.Thread(target=target, name=name, daemon=True).start()
            return True
        start = original("_thread", "start_new_thread")

        def run() -> None:
            name_this_thread(name)
            target()

        start(run, ())
        return True
    except (RuntimeError, OSError, MemoryError):
        return False


def name_this_thread(name: str) -> None:
    """The calling OS thread's name in the kernel (at most 15 bytes), for a thread threading does not know."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def wait_readable(fd: int, timeout_s: float) -> bool:
    """Blocks this OS thread until fd is readable or timeout_s passes (select, the original); True if readable."""
    select = original("select", "select")
    try:
        ready, _, _ = select([fd], [], [], max(0.0, timeout_s))
    except (OSError, ValueError):
        sleep(timeout_s)
        return False
    return bool(ready)


def sleep(seconds: float) -> None:
    original("time", "sleep")(max(0.0, seconds))
