"""The kernel's view of the clock (adjtimex, read-only): whether a daemon (NTP, chrony, PTP) keeps it synchronised,
and the kernel's bound on its error. Read through the C library's adjtimex(2) with no mode bits set, which changes
nothing and needs no privilege (containers included)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import NamedTuple

TIME_ERROR = 5  # adjtimex's return: the clock is not synchronised
STA_UNSYNC = 0x0040  # status bit: the clock is not synchronised (set by the kernel when nothing disciplines it)


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """struct timex (linux/timex.h, as glibc declares it): longs and ints in the kernel's order, and 11 ints of
    padding the kernel reserves."""

    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time", _Timeval), ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long),
                ("shift", ctypes.c_int), ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long),
                ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long),
                ("tai", ctypes.c_int), ("_reserved", ctypes.c_int * 11)]


class ClockState(NamedTuple):
    synchronized: bool
    max_error_s: float


def state(result: int, status: int, maxerror_us: int) -> ClockState:
    """What adjtimex's answer says: synchronised unless it returned TIME_ERROR or its status has STA_UNSYNC (as
    node_exporter's timex collector reads it); the error bound in seconds."""
    return ClockState(result != TIME_ERROR and not status & STA_UNSYNC, maxerror_us / 1e6)


_adjtimex: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]


def read_clock() -> ClockState:
    """The clock's state now. Raises OSError where adjtimex cannot be called (not Linux, no C library, a seccomp
    profile that refuses it)."""
    global _adjtimex
    if _adjtimex is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = getattr(libc, "adjtimex", None)
        if fn is None:
            raise OSError("adjtimex is not in this C library")
        fn.argtypes = [ctypes.POINTER(_Timex)]
        fn.restype = ctypes.c_int
        _adjtimex = fn
    tx = _Timex()  # modes 0: read only
    result = _adjtimex(ctypes.byref(tx))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"adjtimex: {os.strerror(err)}")
    return state(result, tx.status, tx.maxerror)
