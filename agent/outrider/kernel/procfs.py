"""Parsers for the procfs files the host and process collectors, the agent's lifecycle, `outrider run` and the hook
read: the one reader of each file of /proc.

Every function takes the procfs root as a parameter, so tests point it at fixture trees. Parsers read one file
each and return plain values; deciding what to export is the callers' business. Standard library only: the hook
imports it in the workload's process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's sector size

CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def read_text(path: str) -> str:
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8", "replace")


def is_procfs(root: str) -> bool:
    """True when `root` is a real procfs mount (not a fixture tree)."""
    real = os.path.realpath(root)
    try:
        mounts = read_text("/proc/self/mounts")
    except OSError:
        return False
    return any(f[1] == real and f[2] == "proc" for f in (line.split() for line in mounts.splitlines()) if len(f) > 2)


KERNEL_FS = ("proc", "sysfs", "cgroup", "cgroup2")


def on_kernel_fs(path: str) -> bool:
    """True when `path` lies on a filesystem the kernel generates on each read (procfs, sysfs, cgroupfs)."""
    try:
        mounts = read_mounts("/proc/self")
    except OSError:
        return False
    m = mount_of(path, mounts)
    return m is not None and m.fstype in KERNEL_FS


class KeptOpenReader:
    """Reads files of a real procfs (or sysfs, cgroupfs) through descriptors kept open and re-read from offset 0
    with pread.

    Saves the open/close pair and the file object per read on every sweep (measured: the host collector's
    sweep is about a third file opening). The kernel regenerates the content on each read at offset 0. On a
    fixture tree, where files are replaced between sweeps, it opens each time instead (`keep` says which; by
    default, whether `root` is a procfs mount).
    """

    def __init__(self, root: str, keep: bool | None = None) -> None:
        self.root = root
        self._keep = is_procfs(root) if keep is None else keep
        self._fds: dict[str, int] = {}

    def read(self, rel: str) -> str:
        return self.read_bytes(rel).decode("utf-8", "replace")

    def read_bytes(self, rel: str) -> bytes:
        path = f"{self.root}/{rel}"
        if not self._keep:
            with open(path, "rb") as fh:
                return fh.read()
        fd = self._fds.get(rel)
        if fd is None:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self._fds[rel] = fd
        try:
            chunks, offset = [], 0
            while True:
                chunk = os.pread(fd, 65536, offset)
                if not chunk:
                    break
                chunks.append(chunk)
                offset += len(chunk)
            return b"".join(chunks)
        except OSError:
            self._fds.pop(rel, None)
            os.close(fd)
            raise

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


Reader = Callable[[str], str] | None  # reads a path relative to the root (KeptOpenReader.read)


def _read(root: str, rel: str, read: Reader) -> str:
    return read(rel) if read is not None else read_text(f"{root}/{rel}")


# Readings built every sweep (per device, per process) are NamedTuples: a frozen dataclass's __init__ measured 4x
# the cost (1.7 against 0.4 us for nine fields).
class CpuStat(NamedTuple):
    seconds: dict[str, float]  # by mode, all CPUs together (guest time is already inside user/nice)
    logical_cpus: int
    context_switches: int
    procs_running: int
    procs_blocked: int


def pick(text: str, keys: Iterable[str], sep: str = " ") -> dict[str, int]:
    """The integer after `key` + `sep` at the start of a line, for each key present (a value followed by "kB" in
    bytes). It finds only what it is asked for: /proc/vmstat has some 190 lines, /proc/stat an interrupt line with
    a number per IRQ, and a sweep needs a handful of values; splitting every line was most of the host sweep."""
    out: dict[str, int] = {}
    for key in keys:
        head = key + sep
        if text.startswith(head):
            start = len(head)
        else:
            at = text.find("\n" + head)
            if at < 0:
                continue
            start = at + 1 + len(head)
        end = text.find("\n", start)
        fields = text[start:end if end >= 0 else len(text)].split()
        if not fields:
            continue
        value = int(fields[0])
        out[key] = value * 1024 if len(fields) > 1 and fields[1] == "kB" else value
    return out


def _lines_starting(text: str, prefix: str) -> int:
    return text.count("\n" + prefix) + text.startswith(prefix)


def read_stat(root: str, read: Reader = None) -> CpuStat:
    text = _read(root, "stat", read)
    at = 0 if text.startswith("cpu ") else text.find("\ncpu ") + 1
    if at == 0 and not text.startswith("cpu "):
        raise ValueError(f"{root}/stat has no aggregate cpu line")
    end = text.find("\n", at)
    ticks = text[at:end if end >= 0 else len(text)].split()[1:]
    seconds = {mode: int(t) / CLOCK_TICKS for mode, t in zip(CPU_MODES, ticks)}
    if not seconds:
        raise ValueError(f"{root}/stat has no aggregate cpu line")
    cpus = _lines_starting(text, "cpu") - _lines_starting(text, "cpu ")  # cpu0, cpu1, ...: not the aggregate
    f = pick(text, ("ctxt", "procs_running", "procs_blocked"))
    return CpuStat(seconds, cpus, f.get("ctxt", 0), f.get("procs_running", 0), f.get("procs_blocked", 0))


def read_meminfo(root: str, read: Reader = None, keys: Iterable[str] | None = None) -> dict[str, int]:
    """Fields of /proc/meminfo in bytes: those named in `keys`, or all of them."""
    text = _read(root, "meminfo", read)
    if keys is not None:
        return pick(text, keys, ":")
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if not fields:
            continue
        value = int(fields[0])
        if len(fields) > 1 and fields[1] == "kB":
            value *= 1024
        out[name.strip()] = value
    return out


def read_vmstat(root: str, read: Reader = None, keys: Iterable[str] | None = None) -> dict[str, int]:
    """Counters of /proc/vmstat: those named in `keys`, or all of them."""
    text = _read(root, "vmstat", read)
    if keys is not None:
        return pick(text, keys)
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value:
            out[key] = int(value)
    return out


def read_loadavg(root: str, read: Reader = None) -> tuple[float, float, float]:
    parts = _read(root, "loadavg", read).split()
    return float(parts[0]), float(parts[1]), float(parts[2])


def read_pressure(root: str, resource: str, read: Reader = None) -> dict[str, float]:
    """Stall totals in seconds by kind ('some', 'full') from /proc/pressure/RESOURCE."""
    out: dict[str, float] = {}
    for line in _read(root, f"pressure/{resource}", read).splitlines():
        parts = line.split()
        if not parts:
            continue
        for field in parts[1:]:
            key, _, value = field.partition("=")
            if key == "total":
                out[parts[0]] = int(value) / 1e6
    return out


class DiskStat(NamedTuple):
    device: str
    reads: int
    read_bytes: int
    read_time_s: float
    writes: int
    write_bytes: int
    write_time_s: float
    in_progress: int
    io_time_s: float


def read_diskstats(root: str, read: Reader = None) -> list[DiskStat]:
    out = []
    for line in _read(root, "diskstats", read).splitlines():
        f = line.split()
        if len(f) < 14:
            continue
        out.append(DiskStat(f[2], int(f[3]), int(f[5]) * SECTOR_BYTES, int(f[6]) / 1000.0, int(f[7]),
                            int(f[9]) * SECTOR_BYTES, int(f[10]) / 1000.0, int(f[11]), int(f[12]) / 1000.0))
    return out


class NetStat(NamedTuple):
    interface: str
    rx_bytes: int
    rx_packets: int
    rx_errors: int
    rx_dropped: int
    tx_bytes: int
    tx_packets: int
    tx_errors: int
    tx_dropped: int


def read_netdev(root: str, read: Reader = None) -> list[NetStat]:
    out = []
    for line in _read(root, "net/dev", read).splitlines()[2:]:
        name, sep, rest = line.partition(":")
        if not sep:
            continue
        f = rest.split()
        if len(f) < 16:
            continue
        out.append(NetStat(name.strip(), int(f[0]), int(f[1]), int(f[2]), int(f[3]),
                           int(f[8]), int(f[9]), int(f[10]), int(f[11])))
    return out


@dataclass(frozen=True)
class Mount:
    device: str
    mountpoint: str
    fstype: str
    readonly: bool


def _unescape_mount(text: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal (\040 ...)
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 3 < len(text) and text[i + 1:i + 4].isdigit():
            out.append(chr(int(text[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def read_mounts(root: str, read: Reader = None) -> list[Mount]:
    out = []
    for line in _read(root, "mounts", read).splitlines():
        f = line.split()
        if len(f) < 4:
            continue
        out.append(Mount(_unescape_mount(f[0]), _unescape_mount(f[1]), f[2], "ro" in f[3].split(",")))
    return out


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding `path`: the longest mount point that is a prefix of it (the last one wins on ties)."""
    best: Mount | None = None
    real = os.path.realpath(path)
    for m in mounts:
        mp = m.mountpoint.rstrip("/") or "/"
        covers = real == mp or real.startswith(mp + "/") or mp == "/"
        if covers and (best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/")):
            best = m
    return best


# --- processes -------------------------------------------------------------------------------------------------
# `pid` may be "self" where the reader is the process itself (the hook).

def read_record(path: str) -> bytes:
    """A /proc file of one short record (stat, schedstat) in one read, without a file object (half the CPU of
    open(): the hook reads these every flush)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def read_records(path: str) -> bytes:
    """A /proc file of many records (seq_file hands out whole records: a read may stop short of the end)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [os.read(fd, 65536)]
        while chunks[-1]:
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    finally:
        os.close(fd)


# The fields of a stat file after the name, as stat_fields returns them: index i is field i + 3 of proc(5).
STATE, PPID, UTIME, STIME, CUTIME, CSTIME, NUM_THREADS, STARTTIME, RSS = 0, 1, 11, 12, 13, 14, 17, 19, 21


def stat_fields(raw: bytes) -> tuple[str, list[bytes]]:
    """(name, the fields after it) of a process's or a task's stat (/proc/PID/stat, /proc/PID/task/TID/stat). The
    name (comm) is in parentheses and may itself hold spaces and parentheses: it ends at the last ')'."""
    close = raw.rindex(b")")
    return raw[raw.index(b"(") + 1:close].decode("utf-8", "replace"), raw[close + 2:].split()


class ProcStat(NamedTuple):
    pid: int
    name: str
    state: str  # R, S, D, Z (zombie: exited, not yet reaped), ...
    ppid: int
    user_s: float
    system_s: float
    threads: int
    start_ticks: int  # with pid, identifies the process across pid reuse
    rss_bytes: int


def read_proc_stat(root: str, pid: int) -> ProcStat:
    return parse_proc_stat(read_record(f"{root}/{pid}/stat"), pid)


def parse_proc_stat(raw: bytes, pid: int) -> ProcStat:
    """/proc/PID/stat's content (read by the caller, perhaps through a kept-open descriptor)."""
    name, f = stat_fields(raw)
    return ProcStat(pid, name, f[STATE].decode(), int(f[PPID]), int(f[UTIME]) / CLOCK_TICKS,
                    int(f[STIME]) / CLOCK_TICKS, int(f[NUM_THREADS]), int(f[STARTTIME]), int(f[RSS]) * PAGE_SIZE)


def start_ticks(root: str, pid: int | str) -> int | None:
    """The process's start in clock ticks after boot (stat field 22), which with its pid identifies it across pid
    reuse; None when it is gone or unreadable."""
    try:
        return int(stat_fields(read_record(f"{root}/{pid}/stat"))[1][STARTTIME])
    except (OSError, ValueError, IndexError):
        return None


def process_state(root: str, pid: int | str) -> str | None:
    """The process's state letter (stat field 3: R running, S sleeping, D disk wait, T stopped by a signal, t stopped
    by a tracer, Z zombie, ...); None when it is gone or unreadable."""
    try:
        return stat_fields(read_record(f"{root}/{pid}/stat"))[1][STATE].decode()
    except (OSError, ValueError, IndexError):
        return None


def parent_pid(root: str, pid: int | str) -> int | None:
    """The process's parent (stat's ppid); None when it is gone or unreadable."""
    try:
        return int(stat_fields(read_record(f"{root}/{pid}/stat"))[1][PPID])
    except (OSError, ValueError, IndexError):
        return None


def read_cpu(stat_path: str) -> tuple[str, float, float] | None:
    """(name, own CPU seconds, reaped children's CPU seconds: cutime + cstime) from a process's or a task's stat
    file; None when it is gone."""
    try:
        name, f = stat_fields(read_record(stat_path))
        return (name, (int(f[UTIME]) + int(f[STIME])) / CLOCK_TICKS, (int(f[CUTIME]) + int(f[CSTIME])) / CLOCK_TICKS)
    except (OSError, ValueError, IndexError):
        return None


def read_schedstat(task_dir: str) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting for one) of a task (a /proc/PID/task/TID directory); None
    when the kernel keeps no schedstats or the task is gone."""
    try:
        run_ns, wait_ns = read_record(f"{task_dir}/schedstat").split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None


def read_task(task_dir: str) -> tuple[str, int, float, float | None] | None:
    """(name, start ticks, CPU seconds, run delay seconds or None) of one task; None when it is gone. The CPU is
    schedstat's nanoseconds where the kernel keeps them (finer than stat's ticks), else stat's, with no delay."""
    try:
        name, f = stat_fields(read_record(f"{task_dir}/stat"))
        cpu = (int(f[UTIME]) + int(f[STIME])) / CLOCK_TICKS
        start = int(f[STARTTIME])
    except (OSError, ValueError, IndexError):
        return None
    sched = read_schedstat(task_dir)
    if sched is None:
        return name, start, cpu, None
    return name, start, sched[0], sched[1]


def read_task_children(root: str, pid: int, tid: int) -> list[int]:
    """The processes the task forked that live (/proc/PID/task/TID/children). Raises FileNotFoundError where the
    task is gone or the kernel lacks the file (before 4.2 or without CONFIG_PROC_CHILDREN)."""
    return [int(c) for c in read_records(f"{root}/{pid}/task/{tid}/children").split()]


def read_uptime(root: str) -> float:
    """Seconds since boot (/proc/uptime), to the hundredth: with start ticks, how long ago a process started."""
    return float(read_record(f"{root}/uptime").split()[0])


def age_s(root: str, pid: int | str) -> float:
    """Seconds since the process started (uptime less its start ticks), to the clock tick; raises OSError,
    ValueError or IndexError where a file is unreadable or malformed."""
    ticks = int(stat_fields(read_record(f"{root}/{pid}/stat"))[1][STARTTIME])
    return read_uptime(root) - ticks / CLOCK_TICKS


def _status_line(root: str, pid: int | str, key: str) -> list[str] | None:
    """The fields after `key:` in /proc/PID/status (None: no such line)."""
    head = key + ":"
    for line in read_text(f"{root}/{pid}/status").splitlines():
        if line.startswith(head):
            return line.split()[1:]
    return None


def read_proc_ctx_switches(root: str, pid: int) -> tuple[int, int]:
    vol = invol = 0
    for line in read_text(f"{root}/{pid}/status").splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            vol = int(line.split()[1])
        elif line.startswith("nonvoluntary_ctxt_switches:"):
            invol = int(line.split()[1])
    return vol, invol


class Uids(NamedTuple):
    """A process's user ids (the Uid line of /proc/PID/status). Callers pick the one their question asks for:
    - real: the user who started the process, whom a setuid program acts for (psutil's username(), `ps -o ruser`);
    - effective: whose permissions it has; a file it creates gets its filesystem uid, which follows the effective
      uid unless the process calls setfsuid (nothing a workload does).
    They differ only in a setuid or setresuid process."""

    real: int
    effective: int
    saved: int
    filesystem: int


def read_proc_uids(root: str, pid: int | str) -> Uids:
    fields = _status_line(root, pid, "Uid")
    if fields is None or len(fields) < 4:
        raise ValueError(f"{root}/{pid}/status has no Uid line")
    return Uids(int(fields[0]), int(fields[1]), int(fields[2]), int(fields[3]))


def read_nspid(root: str, pid: int | str) -> list[int]:
    """The process's pid in each pid namespace it is in, the outermost (the procfs mount's) first (the NSpid line of
    /proc/PID/status, Linux 4.1 and later); [] where the line is missing."""
    fields = _status_line(root, pid, "NSpid")
    return [int(x) for x in fields] if fields is not None else []


def read_proc_io(root: str, pid: int | str) -> tuple[int, int]:
    """(read_bytes, write_bytes): bytes the process caused to be fetched from / sent to storage."""
    rd = wr = 0
    for line in read_text(f"{root}/{pid}/io").splitlines():
        key, _, value = line.partition(":")
        if key == "read_bytes":
            rd = int(value)
        elif key == "write_bytes":
            wr = int(value)
    return rd, wr


def count_fds(root: str, pid: int) -> int:
    return len(os.listdir(f"{root}/{pid}/fd"))


def tasks_of_user(root: str, uid: int) -> int:
    """Threads of every process whose real uid is `uid` (what RLIMIT_NPROC counts for that user); processes that
    vanish while counted are skipped."""
    total = 0
    for pid in list_pids(root):
        try:
            uid_line = threads = None
            for line in read_text(f"{root}/{pid}/status").splitlines():
                if line.startswith("Uid:"):
                    uid_line = line.split()
                elif line.startswith("Threads:"):
                    threads = line.split()
                    break
            if uid_line is not None and threads is not None and int(uid_line[1]) == uid:
                total += int(threads[1])
        except (OSError, ValueError, IndexError):
            continue
    return total


def list_pids(root: str) -> list[int]:
    return [int(name) for name in os.listdir(root) if name.isdigit()]


def children_of(root: str, pid: int) -> list[int] | None:
    """Direct children of `pid` from /proc/PID/task/*/children; None where the kernel lacks those files."""
    out: list[int] = []
    try:
        tids = os.listdir(f"{root}/{pid}/task")
    except FileNotFoundError:
        return []
    found_file = False
    for tid in tids:
        try:
            kids = read_task_children(root, pid, int(tid))
        except FileNotFoundError:
            continue
        found_file = True
        out.extend(kids)
    if not found_file and tids:
        return None
    return out


def descendants(root: str, roots: tuple[int, ...]) -> list[int]:
    """The roots and all their live descendants. Walks the children files; falls back to a ppid scan."""
    seen: list[int] = []
    seen_set: set[int] = set()
    stack = [p for p in roots if os.path.exists(f"{root}/{p}")]
    while stack:
        pid = stack.pop()
        if pid in seen_set:
            continue
        seen_set.add(pid)
        seen.append(pid)
        kids = children_of(root, pid)
        if kids is None:
            return _descendants_by_ppid(root, roots)
        stack.extend(kids)
    return seen


def _descendants_by_ppid(root: str, roots: tuple[int, ...]) -> list[int]:
    by_parent: dict[int, list[int]] = {}
    for pid in list_pids(root):
        try:
            stat = read_proc_stat(root, pid)
        except (OSError, ValueError, IndexError):
            continue
        by_parent.setdefault(stat.ppid, []).append(pid)
    out, stack = [], [p for p in roots if os.path.exists(f"{root}/{p}")]
    seen: set[int] = set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        stack.extend(by_parent.get(pid, ()))
    return out


def read_boot_time(root: str) -> float:
    """Unix time the host booted (btime in /proc/stat): a process's start is this plus its start ticks."""
    for line in read_text(f"{root}/stat").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise ValueError(f"{root}/stat has no btime line")


def read_cpu_model(root: str) -> str:
    """The CPU's model name (the first `model name` of /proc/cpuinfo; on arm64 kernels, which have none, the
    implementer and part of the first CPU); "" where it says neither."""
    fields: dict[str, str] = {}
    for line in read_text(f"{root}/cpuinfo").splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the first CPU's block is done
            continue
        fields.setdefault(key.strip(), value.strip())
    if fields.get("model name"):
        return fields["model name"]
    arm = [fields[k] for k in ("CPU implementer", "CPU part") if fields.get(k)]
    return " ".join(arm)


def read_proc_argv(root: str, pid: int) -> list[str]:
    """The command line's arguments, at most its first 4 KiB ([] for a kernel thread or a process that is exiting)."""
    with open(f"{root}/{pid}/cmdline", "rb") as fh:
        raw = fh.read(4096)
    raw = raw.rstrip(b"\0")
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0")] if raw else []

