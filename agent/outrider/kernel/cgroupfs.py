"""Parsers for the memory and CPU controllers of the cgroup the agent runs in (its container, in Kubernetes: its
memory limit and usage, its CFS quota and how often it throttled), and for the pids controller's limit of a
process's cgroup (how many more threads and processes it may start).

The host's MemTotal says nothing about a container's limit: a pod with 16 GiB on a 2 TiB node is OOM-killed at
16 GiB. This module finds the agent's own memory cgroup from `/proc/self/cgroup` and reads its limit, usage and
reclaimable page cache: cgroup v2 (memory.max, memory.current, memory.stat, memory.events) and, where a node still
runs v1, the memory controller's files (memory.limit_in_bytes, memory.usage_in_bytes, memory.stat,
memory.oom_control). Both roots are parameters, so tests point them at fixture trees.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import NamedTuple

from outrider.kernel.procfs import Reader, pick, read_text

# cgroup v1 reports "no limit" as the page counter's maximum (2^63 - 1 rounded down to a page): anything this large
# is no limit at all.
V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class Cgroup:
    """Where one of the agent's cgroups lives (its memory or CPU controller's): its directory and the cgroup version
    (1 or 2)."""

    path: str
    version: int


MemoryCgroup = Cgroup  # the memory controller's


class CgroupMemory(NamedTuple):
    limit_bytes: int | None  # None: no limit set
    usage_bytes: int  # everything charged to the cgroup, page cache included
    inactive_file_bytes: int  # page cache the kernel reclaims first: usage minus this is the working set
    oom_kills: int | None  # processes the kernel OOM-killed in this cgroup (None where the kernel does not say)

    @property
    def working_set_bytes(self) -> int:
        return max(0, self.usage_bytes - self.inactive_file_bytes)


def find_memory_cgroup(proc_root: str, sys_root: str) -> MemoryCgroup | None:
    """The agent's memory cgroup, or None where there is no memory controller to read.

    `/proc/self/cgroup` names the cgroup relative to the cgroup namespace's root. Inside a container with its own
    cgroup namespace that path is "/" and the container's cgroup is mounted at /sys/fs/cgroup; without one the
    full path exists below the mount. A runtime that mounts only the container's own cgroup without a namespace
    (the path is not there) leaves the mount's root as the container's cgroup.
    """
    lines = read_text(f"{proc_root}/self/cgroup").splitlines()
    base = f"{sys_root}/fs/cgroup"
    if os.path.exists(f"{base}/cgroup.controllers"):  # the unified (v2) hierarchy is mounted at the base
        for line in lines:
            hierarchy, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            if hierarchy == "0" and controllers == "":
                return _existing(base, path, "memory.current", 2)
        return _existing(base, "/", "memory.current", 2)
    for line in lines:
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            return _existing(f"{base}/memory", path, "memory.usage_in_bytes", 1)
    return None


def _existing(base: str, path: str, probe: str, version: int) -> MemoryCgroup | None:
    for candidate in (base + path.rstrip("/"), base):
        if os.path.exists(f"{candidate}/{probe}"):
            return MemoryCgroup(candidate, version)
    return None


class _Files:
    """A cgroup's files by name: through `read` (a KeptOpenReader's, on a live cgroupfs), else opened each time."""

    def __init__(self, cg: Cgroup, read: Reader) -> None:
        self.cg = cg
        self.read = read

    def text(self, name: str) -> str:
        return self.read(name) if self.read is not None else read_text(f"{self.cg.path}/{name}")

    def optional(self, name: str) -> str | None:
        try:
            return self.text(name)
        except FileNotFoundError:
            return None


def read_memory(cg: MemoryCgroup, read: Reader = None) -> CgroupMemory:
    """The cgroup's memory; `read` reads a file of its directory by name (a KeptOpenReader's, on a live cgroupfs)."""
    files = _Files(cg, read)
    text, optional = files.text, files.optional
    if cg.version == 2:
        limit_text = (optional("memory.max") or "max").strip()
        limit = None if limit_text == "max" else int(limit_text)
        usage = int(text("memory.current"))
        stat = pick(text("memory.stat"), ("inactive_file",))
        events = pick(optional("memory.events") or "", ("oom_kill",))
        return CgroupMemory(limit, usage, stat.get("inactive_file", 0), events.get("oom_kill"))
    raw_limit = int(text("memory.limit_in_bytes"))
    usage = int(text("memory.usage_in_bytes"))
    stat = pick(text("memory.stat"), ("total_inactive_file", "inactive_file"))
    oom = pick(optional("memory.oom_control") or "", ("oom_kill",))
    # total_inactive_file counts the cgroup's children too, as usage_in_bytes does
    inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
    return CgroupMemory(None if raw_limit >= V1_UNLIMITED else raw_limit, usage, inactive, oom.get("oom_kill"))


# --- the CPU controller: the CFS quota and how often it throttled ----------------------------------------------

class CgroupCpu(NamedTuple):
    limit_cores: float | None  # the CFS quota over its period; None: no limit
    periods: int | None  # enforcement periods with runnable tasks (None: the cpu controller is not enabled here)
    throttled_periods: int | None
    throttled_s: float | None


def find_cpu_cgroup(proc_root: str, sys_root: str) -> Cgroup | None:
    """The agent's CPU cgroup (the `cpu` controller's, v1's "cpu,cpuacct" mount included; v2's unified one), or None
    where there is none to read. The same lookup as the memory cgroup's (see find_memory_cgroup)."""
    lines = read_text(f"{proc_root}/self/cgroup").splitlines()
    base = f"{sys_root}/fs/cgroup"
    if os.path.exists(f"{base}/cgroup.controllers"):
        path = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), "/")
        return _existing(base, path, "cpu.stat", 2)
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and "cpu" in parts[1].split(","):
            for mount in (parts[1], "cpu,cpuacct", "cpu"):
                found = _existing(f"{base}/{mount}", parts[2], "cpu.stat", 1)
                if found is not None:
                    return found
    return None


def read_cpu(cg: Cgroup, read: Reader = None) -> CgroupCpu:
    """The cgroup's CPU limit and CFS throttling: v2's cpu.max and cpu.stat (nr_periods, nr_throttled,
    throttled_usec: present only where the cpu controller is enabled), v1's cpu.cfs_quota_us, cpu.cfs_period_us and
    cpu.stat (throttled_time in ns)."""
    files = _Files(cg, read)
    text, optional = files.text, files.optional
    stat = pick(text("cpu.stat"), ("nr_periods", "nr_throttled", "throttled_usec", "throttled_time"))
    if cg.version == 2:
        quota, _, period = (optional("cpu.max") or "max").strip().partition(" ")
        limit = None if quota == "max" or not period else int(quota) / int(period)
        throttled = stat.get("throttled_usec")
        return CgroupCpu(limit, stat.get("nr_periods"), stat.get("nr_throttled"),
                         None if throttled is None else throttled / 1e6)
    quota_us = int((optional("cpu.cfs_quota_us") or "-1").strip())
    period_us = int((optional("cpu.cfs_period_us") or "0").strip())
    limit = quota_us / period_us if quota_us > 0 and period_us > 0 else None
    throttled_ns = stat.get("throttled_time")
    return CgroupCpu(limit, stat.get("nr_periods"), stat.get("nr_throttled"),
                     None if throttled_ns is None else throttled_ns / 1e9)


# --- cgroup paths, relative to the hierarchy's root (as /proc/PID/cgroup and the kernel log write them) ---------

def parent(path: str) -> str:
    """The parent of a cgroup path relative to its hierarchy's root ("/" has none: "")."""
    if path == "/":
        return ""
    return path.rsplit("/", 1)[0] or "/"


def within(path: str, scope: str) -> bool:
    """Whether the cgroup `path` is `scope` or below it."""
    return path == scope or path.startswith(scope.rstrip("/") + "/")


# --- OOM kills per cgroup, for the oom collector and `outrider run` -------------------------------------------

# The file and key of a cgroup's OOM-kill counter by version. v2's memory.events counts the cgroup and everything
# below it (unless the hierarchy is mounted with memory_localevents); v1's memory.oom_control counts the cgroup's own
# processes only.
OOM_KILL_FILE = {2: "memory.events", 1: "memory.oom_control"}


def memory_hierarchy(sys_root: str) -> MemoryCgroup | None:
    """The root of the memory hierarchy as mounted here: the unified (v2) mount with the memory controller, or v1's
    memory controller (a hybrid host mounts both, memory under v1); None where neither is mounted."""
    base = f"{sys_root}/fs/cgroup"
    try:
        if "memory" in read_text(f"{base}/cgroup.controllers").split():
            return MemoryCgroup(base, 2)
    except FileNotFoundError:
        pass
    if os.path.exists(f"{base}/memory/memory.usage_in_bytes"):
        return MemoryCgroup(f"{base}/memory", 1)
    return None


def is_kernel_root(cg: MemoryCgroup) -> bool:
    """Whether the mount shows the kernel's root cgroup (the whole host), not a cgroup namespace's (a container's
    own cgroup): v2 leaves cgroup.events off the root, v1 has release_agent on the root only."""
    if cg.version == 2:
        return not os.path.exists(f"{cg.path}/cgroup.events")
    return os.path.exists(f"{cg.path}/release_agent")


def read_oom_kills(path: str, version: int) -> int | None:
    """The oom_kill counter of the cgroup at `path`; None where it has none (no memory controller there, a kernel
    before 4.13, or the cgroup is being removed)."""
    try:
        text = read_text(f"{path}/{OOM_KILL_FILE[version]}")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno == errno.ENODEV:  # the cgroup went away between listing and reading
            return None
        raise
    return pick(text, ("oom_kill",)).get("oom_kill")


def subtree_oom_kills(cg: MemoryCgroup) -> int | None:
    """OOM kills in the cgroup and the cgroups below it, as v2's memory.events counts them; on v1, whose counters are
    each cgroup's own, the sum over the live subtree (a child removed with its kills takes them along)."""
    own = read_oom_kills(cg.path, cg.version)
    if cg.version == 2 or own is None:
        return own
    total = own
    for dirpath, dirnames, _ in os.walk(cg.path):
        for name in dirnames:
            total += read_oom_kills(f"{dirpath}/{name}", 1) or 0
    return total


class PidsLimit(NamedTuple):
    """A pids cgroup's limit and what it holds now (every thread of every process in it counts)."""

    limit: int
    current: int


def pids_limit(proc_root: str, sys_root: str, pid: int | str = "self") -> PidsLimit | None:
    """The tightest pids limit on the cgroup of `pid` and its ancestors (a pod's limit is set on the pod's cgroup,
    above the container's), or None where no limit is set or there is no pids controller to read. cgroup v2 (the
    unified hierarchy) and v1's pids controller."""
    try:
        lines = read_text(f"{proc_root}/{pid}/cgroup").splitlines()
    except OSError:
        return None
    base = f"{sys_root}/fs/cgroup"
    path = None
    if os.path.exists(f"{base}/cgroup.controllers"):
        base_dir = base
        path = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    else:
        base_dir = f"{base}/pids"
        for line in lines:
            parts = line.split(":", 2)
            if len(parts) == 3 and "pids" in parts[1].split(","):
                path = parts[2]
    if path is None:
        return None
    tightest: PidsLimit | None = None
    cgroup = path.rstrip("/") or "/"
    while cgroup:
        directory = base_dir + ("" if cgroup == "/" else cgroup)
        try:
            raw = read_text(f"{directory}/pids.max").strip()
            if raw != "max":
                found = PidsLimit(int(raw), int(read_text(f"{directory}/pids.current").strip()))
                if tightest is None or found.limit - found.current < tightest.limit - tightest.current:
                    tightest = found
        except (OSError, ValueError):
            pass
        cgroup = parent(cgroup)
    return tightest
