"""The kernel log's OOM-kill records, read from /dev/kmsg: which process the OOM killer chose and in which memory
cgroup.

/dev/kmsg hands out one record per read(): `PRIORITY,SEQUENCE,TIMESTAMP_US,FLAGS;MESSAGE`, followed by continuation
lines starting with a space (KEY=VALUE). A reader opened once and moved to the end (SEEK_END) gets only what the kernel
logs afterwards; a reader that falls behind the ring buffer gets EPIPE once and continues with the oldest record still
there. The OOM killer writes two lines that matter here:

    oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/a,task_memcg=/a/b,task=python3,pid=18855,uid=0
    Memory cgroup out of memory: Killed process 18855 (python3) total-vm:78356kB, anon-rss:65152kB, ...

The first (Linux 4.19 and later; rate-limited with the rest of the OOM report) comes before the kill is counted in
/proc/vmstat and memory.events, and names the victim's memory cgroup; the second comes after, for every process
killed (an oom.group kill writes one per member), without the cgroup. The parsers are pure; `KernelLog` owns the
descriptor. A regular file works as well (tests append records to one).
"""

from __future__ import annotations

import errno
import os
from typing import NamedTuple

READ_SIZE = 8192  # a record is at most about 1 KiB of text plus its dictionary; read() of less fails with EINVAL


class OomKillRecord(NamedTuple):
    """One OOM kill the kernel logged."""

    pid: int
    task: str  # the process's name (comm, at most 15 characters)
    memcg: str | None  # the victim's memory cgroup, relative to the hierarchy's root; None: the line did not say
    timestamp_us: int  # microseconds since boot (the kernel's clock, as /dev/kmsg writes it)


def split_records(text: str) -> list[tuple[int, str]]:
    """(timestamp in µs, message) of each record in text read from /dev/kmsg (continuation lines dropped)."""
    out = []
    for line in text.split("\n"):
        if not line or line[0] == " ":
            continue
        prefix, sep, message = line.partition(";")
        if not sep:
            continue
        fields = prefix.split(",")
        try:
            ts = int(fields[2]) if len(fields) > 2 else 0
        except ValueError:
            ts = 0
        out.append((ts, message))
    return out


def parse_oom_kill_summary(message: str, timestamp_us: int = 0) -> OomKillRecord | None:
    """`oom-kill:...,task_memcg=/a/b,task=NAME,pid=N,uid=N`, or None. The fields' order is fixed: pid and uid are
    read from the end and the name from the cgroup on, since a process name may hold commas (even ",task=") and a
    cgroup path never holds ",task="."""
    at = message.find("oom-kill:")
    if at < 0:
        return None
    body = message[at + len("oom-kill:"):]
    uid_at = body.rfind(",uid=")
    pid_at = body.rfind(",pid=", 0, uid_at if uid_at >= 0 else len(body))
    memcg_at = body.find("task_memcg=")
    # the name starts at the first ",task=" after the cgroup (none is inside a path), else the last one
    task_at = body.find(",task=", memcg_at, pid_at) if memcg_at >= 0 else body.rfind(",task=", 0, pid_at)
    if pid_at < 0 or task_at < 0:
        return None
    pid_text = body[pid_at + len(",pid="):uid_at if uid_at >= 0 else len(body)]
    if not pid_text.isdigit():
        return None
    memcg = body[memcg_at + len("task_memcg="):task_at] if 0 <= memcg_at < task_at else None
    return OomKillRecord(int(pid_text), body[task_at + len(",task="):pid_at], memcg or None, timestamp_us)


def parse_killed_process(message: str, timestamp_us: int = 0) -> OomKillRecord | None:
    """`...Killed process PID (NAME) total-vm:...`, or None. NAME may hold parentheses: it ends at the last ")"
    before " total-vm:" (or the line's last ")")."""
    at = message.find("Killed process ")
    if at < 0:
        return None
    rest = message[at + len("Killed process "):]
    pid_text, sep, tail = rest.partition(" (")
    if not sep or not pid_text.isdigit():
        return None
    end = tail.find(") total-vm:")
    if end < 0:
        end = tail.rfind(")")
    if end < 0:
        return None
    return OomKillRecord(int(pid_text), tail[:end], None, timestamp_us)


class KernelLog:
    """New records of /dev/kmsg (or a file laid out as it is) since the last read, without ever blocking.

    Opened on the first read and moved to the end: what the kernel logged before that is history, not news. `error`
    says why it cannot be read (no such device in this container, EPERM without CAP_SYSLOG under dmesg_restrict);
    `lost` counts the times the ring buffer overwrote records before they were read.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.error: OSError | None = None
        self.lost = 0
        self._fd: int | None = None

    def open(self) -> bool:
        """Open and move to the end now (so that what follows is read); False, with `error` set, where it cannot."""
        if self._fd is not None:
            return True
        if self.error is not None:
            return False
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            self.error = e
            return False
        try:
            os.lseek(fd, 0, os.SEEK_END)
        except OSError as e:
            os.close(fd)
            self.error = e
            return False
        self._fd = fd
        return True

    def read_new(self, limit_bytes: int = 4 << 20) -> str:
        """The text of the records logged since the last read (at most about limit_bytes of it: a kernel flooding
        its log cannot make a sweep read forever)."""
        if not self.open():
            return ""
        assert self._fd is not None
        chunks: list[bytes] = []
        total = 0
        while total < limit_bytes:
            try:
                chunk = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten before we read it: go on with the oldest record left
                    self.lost += 1
                    continue
                self.error = e
                self.close()
                break
            if not chunk:
                break
            chunks.append(chunk)  # from /dev/kmsg one whole record, its lines each ending with a newline
            total += len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")

    def oom_kills(self) -> tuple[list[OomKillRecord], list[OomKillRecord]]:
        """The OOM kills logged since the last read: (the summaries naming the cgroup, the "Killed process" lines)."""
        summaries, killed = [], []
        for ts, message in split_records(self.read_new()):
            if "oom-kill:" in message:
                rec = parse_oom_kill_summary(message, ts)
                if rec is not None:
                    summaries.append(rec)
            elif "Killed process " in message:
                rec = parse_killed_process(message, ts)
                if rec is not None:
                    killed.append(rec)
        return summaries, killed

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
