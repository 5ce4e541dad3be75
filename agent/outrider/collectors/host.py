"""Host collector: CPU, memory and swap, load, PSI pressure, disk and network I/O, filesystem space and inodes, the
clock (its time, and whether it is synchronised), and the memory and CPU limits of the cgroup (container) the agent
runs in, with its usage and CFS throttling."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

from outrider.collectors.base import Collector, CollectorContext
from outrider.ground import regex
from outrider.kernel import cgroupfs, procfs, timex
from outrider.metrics.family import Family

BUSY_EXCLUDED = ("idle", "iowait")
MEMINFO = ("MemTotal", "MemFree", "MemAvailable", "Cached", "Buffers", "SwapTotal", "SwapFree", "Shmem", "Dirty",
           "Writeback")
VMSTAT = ("oom_kill", "pgmajfault", "pgfault", "pswpin", "pswpout")
MOUNTS_TTL_S = 60.0


MAX_FILTERED_NAMES = 4096  # verdicts remembered; a host whose interfaces churn (veths) starts afresh past it


class NameFilter:
    """An exclude pattern's verdict on each device or interface name, remembered: the same names come every sweep,
    and a match through the RE2 binding, where a user's pattern needs it, costs about 2 us (a host with 26 block
    devices: 50 us a sweep)."""

    def __init__(self, pattern: str) -> None:
        self._pattern = regex.compile(pattern)
        self._verdicts: dict[str, bool] = {}

    def excludes(self, name: str) -> bool:
        verdict = self._verdicts.get(name)
        if verdict is None:
            if len(self._verdicts) >= MAX_FILTERED_NAMES:
                self._verdicts.clear()
            verdict = self._verdicts[name] = self._pattern.match(name) is not None
        return verdict


T = TypeVar("T")


class OwnCgroup:
    """The agent's own cgroup of one controller: found at its first read, its files kept open on a live cgroupfs."""

    def __init__(self, controller: str, find: Callable[[], cgroupfs.Cgroup | None], sys_root: str) -> None:
        self.controller = controller
        self.find = find
        self.sys_root = sys_root
        self.cgroup: cgroupfs.Cgroup | None = None
        self.reader: procfs.KeptOpenReader | None = None

    def read(self, parse: Callable[[cgroupfs.Cgroup, procfs.Reader], T]) -> T:
        if self.cgroup is None:
            self.cgroup = self.find()
            if self.cgroup is None:
                raise FileNotFoundError(f"{self.sys_root}/fs/cgroup: no {self.controller} controller for this process")
            self.reader = procfs.KeptOpenReader(self.cgroup.path, keep=procfs.on_kernel_fs(self.cgroup.path))
        return parse(self.cgroup, self.reader.read if self.reader else None)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


class HostCollector(Collector):
    name = "host"
    description = ("host CPU, memory, swap, load, PSI, disk and network I/O, filesystem space and inodes (from /proc), "
                   "the clock, and the agent's cgroup memory and CPU limits and CFS throttling")

    def __init__(self, ctx: CollectorContext,
                 read_clock: Callable[[], timex.ClockState] = timex.read_clock) -> None:
        """read_clock: the kernel's view of the clock's synchronisation (adjtimex; a test gives a fixed one)."""
        super().__init__(ctx)
        self._read_clock = read_clock
        self._root = ctx.config.proc_root
        self._sys_root = ctx.config.sys_root
        self._memory_cgroup = OwnCgroup("memory", lambda: cgroupfs.find_memory_cgroup(self._root, self._sys_root),
                                        self._sys_root)
        self._cpu_cgroup = OwnCgroup("cpu", lambda: cgroupfs.find_cpu_cgroup(self._root, self._sys_root),
                                     self._sys_root)
        # user patterns, matched in linear time (outrider.ground.regex; config refused them at load if RE2 does not take
        # them)
        self._disk_exclude = NameFilter(ctx.config.disk_exclude)
        self._net_exclude = NameFilter(ctx.config.network_exclude)
        self._prev_cpu: dict[str, float] | None = None
        self._reader = procfs.KeptOpenReader(self._root)
        self._mount_cache: tuple[float, list[procfs.Mount]] | None = None
        self._mount_of: dict[str, procfs.Mount | None] = {}
        self._r = self._reader.read

    def collect(self) -> list[Family]:
        fams: list[Family] = []
        for part in (self._cpu, self._load, self._memory, self._cgroup_memory, self._cgroup_cpu, self._vmstat,
                     self._pressure, self._disks, self._network, self._filesystems, self._clock):
            try:
                fams.extend(part())
            except FileNotFoundError as e:
                # Optional sources (PSI on old kernels) are simply absent; say so once.
                self._once.warning(part.__name__, "host: %s not available: %s", part.__name__.strip("_"), e)
            except (OSError, ValueError, IndexError) as e:
                self.drop(part.__name__.strip("_"), e)
        return fams

    def close(self) -> None:
        self._reader.close()
        self._memory_cgroup.close()
        self._cpu_cgroup.close()

    def _cpu(self) -> list[Family]:
        stat = procfs.read_stat(self._root, self._r)
        seconds = Family("outrider_host_cpu_seconds_total")
        for mode, value in stat.seconds.items():
            seconds.add(value, mode)
        fams = [seconds,
                Family("outrider_host_logical_cpus").add(stat.logical_cpus),
                Family("outrider_host_context_switches_total").add(stat.context_switches),
                Family("outrider_host_procs_running").add(stat.procs_running),
                Family("outrider_host_procs_blocked").add(stat.procs_blocked)]
        prev, self._prev_cpu = self._prev_cpu, stat.seconds
        if prev is not None:
            total = sum(stat.seconds.values()) - sum(prev.values())
            idle = sum(stat.seconds.get(m, 0.0) - prev.get(m, 0.0) for m in BUSY_EXCLUDED)
            if total > 0:
                fams.append(Family("outrider_host_cpu_utilization_ratio").add(min(1.0, max(0.0, 1 - idle / total))))
        return fams

    def _load(self) -> list[Family]:
        one, five, fifteen = procfs.read_loadavg(self._root, self._r)
        return [Family("outrider_host_load1").add(one), Family("outrider_host_load5").add(five),
                Family("outrider_host_load15").add(fifteen)]

    def _memory(self) -> list[Family]:
        mem = procfs.read_meminfo(self._root, self._r, MEMINFO)
        total = mem["MemTotal"]
        free = mem.get("MemFree", 0)
        # MemAvailable is absent before Linux 3.14; free + page cache is the usual stand-in.
        available = mem.get("MemAvailable", free + mem.get("Cached", 0) + mem.get("Buffers", 0))
        usage = Family("outrider_host_memory_usage_bytes")
        usage.add(max(0, total - available), "used").add(free, "free")
        usage.add(mem.get("Cached", 0), "cached").add(mem.get("Buffers", 0), "buffers")
        swap_total, swap_free = mem.get("SwapTotal", 0), mem.get("SwapFree", 0)
        swap = Family("outrider_host_swap_usage_bytes").add(swap_total - swap_free, "used").add(swap_free, "free")
        return [Family("outrider_host_memory_limit_bytes").add(total),
                Family("outrider_host_memory_available_bytes").add(available), usage, swap,
                Family("outrider_host_memory_shared_bytes").add(mem.get("Shmem", 0)),
                Family("outrider_host_memory_dirty_bytes").add(mem.get("Dirty", 0) + mem.get("Writeback", 0))]

    def _cgroup_memory(self) -> list[Family]:
        mem = self._memory_cgroup.read(cgroupfs.read_memory)
        fams = [Family("outrider_cgroup_memory_usage_bytes").add(mem.usage_bytes),
                Family("outrider_cgroup_memory_working_set_bytes").add(mem.working_set_bytes)]
        if mem.limit_bytes is not None:  # absent, not a misleading huge number, where no limit is set
            fams.append(Family("outrider_cgroup_memory_limit_bytes").add(mem.limit_bytes))
        if mem.oom_kills is not None:
            fams.append(Family("outrider_cgroup_memory_oom_kills_total").add(mem.oom_kills))
        return fams

    def _cgroup_cpu(self) -> list[Family]:
        cpu = self._cpu_cgroup.read(cgroupfs.read_cpu)
        fams = []
        if cpu.limit_cores is not None:  # absent where no quota is set, as the memory limit
            fams.append(Family("outrider_cgroup_cpu_limit_cores").add(cpu.limit_cores))
        if cpu.periods is not None and cpu.throttled_periods is not None:
            fams += [Family("outrider_cgroup_cpu_periods_total").add(cpu.periods),
                     Family("outrider_cgroup_cpu_throttled_periods_total").add(cpu.throttled_periods)]
        if cpu.throttled_s is not None:
            fams.append(Family("outrider_cgroup_cpu_throttled_seconds_total").add(cpu.throttled_s))
        return fams

    def _clock(self) -> list[Family]:
        """The wall clock when read (Prometheus's timestamp on it tells the skew), and the kernel's view of its
        synchronisation."""
        fams = [Family("outrider_host_time_seconds").add(self.ctx.clock.wall())]
        try:
            clock = self._read_clock()
        except OSError as e:  # not Linux, or a seccomp profile refusing adjtimex: the time alone
            self._once.warning("adjtimex", "host: the clock's synchronisation is not available: %s", e)
            return fams
        fams += [Family("outrider_host_clock_synchronized").add(1 if clock.synchronized else 0),
                 Family("outrider_host_clock_max_error_seconds").add(clock.max_error_s)]
        return fams

    def _vmstat(self) -> list[Family]:
        vm = procfs.read_vmstat(self._root, self._r, VMSTAT)
        fams = []
        if "oom_kill" in vm:  # Linux >= 4.13
            fams.append(Family("outrider_host_oom_kills_total").add(vm["oom_kill"]))
        major = vm.get("pgmajfault", 0)
        fams.append(Family("outrider_host_page_faults_total").add(major, "major")
                    .add(max(0, vm.get("pgfault", 0) - major), "minor"))
        fams.append(Family("outrider_host_paging_operations_total").add(vm.get("pswpin", 0), "in")
                    .add(vm.get("pswpout", 0), "out"))
        return fams

    def _pressure(self) -> list[Family]:
        fam = Family("outrider_host_pressure_stalled_seconds_total")
        missing = 0
        for resource in ("cpu", "memory", "io"):
            try:
                totals = procfs.read_pressure(self._root, resource, self._r)
            except FileNotFoundError:
                missing += 1
                continue
            for kind in ("some", "full"):
                if kind in totals:
                    fam.add(totals[kind], resource, kind)
        if missing == 3:
            raise FileNotFoundError(f"{self._root}/pressure (kernel without PSI, or PSI disabled)")
        return [fam]

    def _disks(self) -> list[Family]:
        io = Family("outrider_host_disk_io_bytes_total")
        ops = Family("outrider_host_disk_operations_total")
        busy = Family("outrider_host_disk_io_time_seconds_total")
        op_time = Family("outrider_host_disk_operation_time_seconds_total")
        in_progress = Family("outrider_host_disk_io_in_progress")
        for d in procfs.read_diskstats(self._root, self._r):
            if self._disk_exclude.excludes(d.device):
                continue
            io.add(d.read_bytes, d.device, "read").add(d.write_bytes, d.device, "write")
            ops.add(d.reads, d.device, "read").add(d.writes, d.device, "write")
            busy.add(d.io_time_s, d.device)
            op_time.add(d.read_time_s, d.device, "read").add(d.write_time_s, d.device, "write")
            in_progress.add(d.in_progress, d.device)
        return [io, ops, op_time, in_progress, busy]

    def _network(self) -> list[Family]:
        nbytes = Family("outrider_host_network_io_bytes_total")
        packets = Family("outrider_host_network_packets_total")
        errors = Family("outrider_host_network_errors_total")
        dropped = Family("outrider_host_network_dropped_total")
        for n in procfs.read_netdev(self._root, self._r):
            if self._net_exclude.excludes(n.interface):
                continue
            i = n.interface
            nbytes.add(n.rx_bytes, i, "receive").add(n.tx_bytes, i, "transmit")
            packets.add(n.rx_packets, i, "receive").add(n.tx_packets, i, "transmit")
            errors.add(n.rx_errors, i, "receive").add(n.tx_errors, i, "transmit")
            dropped.add(n.rx_dropped, i, "receive").add(n.tx_dropped, i, "transmit")
        return [nbytes, packets, errors, dropped]

    def _mounts(self) -> list[procfs.Mount]:
        """The mount table, re-read at most every MOUNTS_TTL_S: it changes rarely and is the largest read.

        With host_root, the host's (its init's, through the host's procfs): the container sees the host's root
        through a read-only bind mount, which says nothing about how the host mounts it.
        """
        now = time.monotonic()
        if self._mount_cache is None or now - self._mount_cache[0] > MOUNTS_TTL_S:
            self._mount_of.clear()
            try:
                host = bool(self.ctx.config.host_root)
                self._mount_cache = (now, procfs.read_mounts(f"{self._root}/1") if host
                                     else procfs.read_mounts(self._root, self._r))
            except OSError as e:
                self.drop("mounts", e)
                return []
        return self._mount_cache[1]

    def _filesystems(self) -> list[Family]:
        size = Family("outrider_host_filesystem_size_bytes")
        free = Family("outrider_host_filesystem_free_bytes")
        avail = Family("outrider_host_filesystem_avail_bytes")
        readonly = Family("outrider_host_filesystem_readonly")
        files = Family("outrider_host_filesystem_files")
        files_free = Family("outrider_host_filesystem_files_free")
        mounts = self._mounts()
        host_root = self.ctx.config.host_root.rstrip("/")
        for path in self.ctx.config.filesystems:
            try:
                st = os.statvfs(host_root + "/" + path.lstrip("/") if host_root else path)
            except OSError as e:
                self.drop(f"filesystem {path}", e)
                continue
            if path in self._mount_of:  # resolved once per mount table (realpath costs an lstat per component)
                m = self._mount_of[path]
            else:
                m = self._mount_of[path] = procfs.mount_of(path, mounts)
            labels = (path, m.device if m else "", m.fstype if m else "")
            size.add(st.f_blocks * st.f_frsize, *labels)
            free.add(st.f_bfree * st.f_frsize, *labels)
            avail.add(st.f_bavail * st.f_frsize, *labels)
            # Through host_root the bind mount is read-only by design: only the host's own mount flags count.
            ro = bool(m and m.readonly) if host_root else bool(st.f_flag & os.ST_RDONLY) or bool(m and m.readonly)
            readonly.add(1 if ro else 0, *labels)
            # f_files is 0 on filesystems without a fixed inode table (btrfs, many FUSE mounts): exported as it is,
            # the rules leave such filesystems out rather than divide by it
            files.add(st.f_files, *labels)
            files_free.add(st.f_ffree, *labels)
        return [size, free, avail, readonly, files, files_free]
