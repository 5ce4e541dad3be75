"""Host collector against fixture procfs and sysfs trees (tests/fixtures/proc, tests/fixtures/sys), node_exporter
style."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.host import HostCollector
from outrider.ground.clock import ManualClock
from outrider.ground.config import Config
from outrider.kernel import procfs, timex
from outrider.metrics.exposition import render
from outrider.metrics.family import Family
from outrider.wiring.sampler import SweepStats
from tests.helpers import wait_until

FIXTURES = Path(__file__).parent.parent / "fixtures"
GOLDEN = FIXTURES / "host.prom"


def sys_tree(proc_root: Path) -> Path:
    """A writable copy of the fixture sysfs tree beside the procfs copy (a cgroup v2 container with a limit)."""
    root = proc_root.parent / "sys"
    if not root.exists():
        shutil.copytree(FIXTURES / "sys", root)
    return root


def fixed_clock() -> timex.ClockState:
    """The kernel's view of a synchronised clock, as adjtimex gives it (a fixture: the machine's own varies)."""
    return timex.state(0, 0x2001, 120_500)  # TIME_OK, STA_PLL | STA_NANO, 120.5 ms


def collector(root: Path, read_clock: Callable[[], timex.ClockState] = fixed_clock, **cfg: object) -> HostCollector:
    config = Config(proc_root=str(root), **{"filesystems": (), "sys_root": str(sys_tree(root)),  # type: ignore[arg-type]
                                            **cfg})
    return HostCollector(CollectorContext(config, SweepStats(), clock=ManualClock(epoch=1_700_000_000.0).clock()),
                         read_clock)


def by_name(fams: list[Family]) -> dict[str, dict[tuple[str, ...], float]]:
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for f in fams:
        out.setdefault(f.defn.name, {}).update(dict(f.samples))
    return out


def test_exposition_matches_golden_file(proc_fixture: Path) -> None:
    text = render(collector(proc_fixture).collect()).decode()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "host exposition drifted from tests/fixtures/host.prom (UPDATE_GOLDEN=1)"


def test_cpu_seconds_are_ticks_over_clock_rate(proc_fixture: Path) -> None:
    m = by_name(collector(proc_fixture).collect())
    ticks = os.sysconf("SC_CLK_TCK")
    assert m["outrider_host_cpu_seconds_total"][("user",)] == pytest.approx(10132153 / ticks)
    assert m["outrider_host_cpu_seconds_total"][("iowait",)] == pytest.approx(16683 / ticks)
    assert m["outrider_host_logical_cpus"][()] == 4
    assert m["outrider_host_procs_running"][()] == 3
    assert m["outrider_host_context_switches_total"][()] == 2543524001


def test_utilisation_is_busy_share_between_two_sweeps(proc_fixture: Path) -> None:
    c = collector(proc_fixture)
    first = by_name(c.collect())
    assert "outrider_host_cpu_utilization_ratio" not in first, "no utilisation without a previous sweep"
    # 400 ticks pass: 300 user, 60 idle, 40 iowait -> busy 300/400
    stat = (proc_fixture / "stat").read_text().splitlines()
    stat[0] = "cpu  10132453 290696 3084719 46828543 16723 0 25195 0 0 0"
    (proc_fixture / "stat").write_text("\n".join(stat) + "\n")
    second = by_name(c.collect())
    assert second["outrider_host_cpu_utilization_ratio"][()] == pytest.approx(0.75)


def test_memory_used_is_total_minus_available(proc_fixture: Path) -> None:
    m = by_name(collector(proc_fixture).collect())
    assert m["outrider_host_memory_limit_bytes"][()] == 65799224 * 1024
    assert m["outrider_host_memory_available_bytes"][()] == 40188100 * 1024
    assert m["outrider_host_memory_usage_bytes"][("used",)] == (65799224 - 40188100) * 1024
    assert m["outrider_host_swap_usage_bytes"][("used",)] == (8388604 - 6291452) * 1024


def test_pressure_totals_are_seconds_by_resource_and_kind(proc_fixture: Path) -> None:
    m = by_name(collector(proc_fixture).collect())["outrider_host_pressure_stalled_seconds_total"]
    assert m[("memory", "full")] == pytest.approx(1.25)
    assert m[("cpu", "some")] == pytest.approx(1.5)
    assert len(m) == 6


def test_missing_psi_is_absent_not_an_error(proc_fixture: Path) -> None:
    for f in (proc_fixture / "pressure").iterdir():
        f.unlink()
    c = collector(proc_fixture)
    m = by_name(c.collect())
    assert "outrider_host_pressure_stalled_seconds_total" not in m
    assert "outrider_host_memory_limit_bytes" in m
    assert c.errors == 0


def test_disks_exclude_partitions_and_loop_devices(proc_fixture: Path) -> None:
    m = by_name(collector(proc_fixture).collect())
    io = m["outrider_host_disk_io_bytes_total"]
    assert {labels[0] for labels in io} == {"nvme0n1", "sda"}
    assert io[("nvme0n1", "read")] == 9600000 * 512
    assert io[("nvme0n1", "write")] == 24000000 * 512
    assert m["outrider_host_disk_operations_total"][("sda", "write")] == 1000
    assert m["outrider_host_disk_io_time_seconds_total"][("nvme0n1",)] == pytest.approx(654.321)


def test_network_excludes_loopback_and_veth(proc_fixture: Path) -> None:
    m = by_name(collector(proc_fixture).collect())
    nbytes = m["outrider_host_network_io_bytes_total"]
    assert {labels[0] for labels in nbytes} == {"eth0", "ib0"}
    assert nbytes[("ib0", "receive")] == 9000000000
    assert m["outrider_host_network_errors_total"][("eth0", "receive")] == 3
    assert m["outrider_host_network_dropped_total"][("eth0", "transmit")] == 2


def test_a_device_filter_remembers_its_verdicts_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from outrider.collectors import host

    monkeypatch.setattr(host, "MAX_FILTERED_NAMES", 8)
    f = host.NameFilter(r"(loop|ram)\d+$|veth")
    assert [f.excludes(n) for n in ("sda", "loop0", "nvme0n1", "veth1a2b", "ram3")] == [False, True, False, True,
                                                                                        True]
    assert f.excludes("loop0") and not f.excludes("sda"), "the same verdict the second time"
    for i in range(100):  # interfaces that come and go (a container host's veths)
        assert f.excludes(f"veth{i:04x}")
        assert len(f._verdicts) <= 8
    assert not f.excludes("sda")


def test_malformed_file_is_a_counted_drop_and_the_rest_survives(proc_fixture: Path) -> None:
    (proc_fixture / "meminfo").write_text("MemTotal: lots kB\n")
    c = collector(proc_fixture)
    m = by_name(c.collect())
    assert "outrider_host_memory_limit_bytes" not in m
    assert "outrider_host_cpu_seconds_total" in m and "outrider_host_load1" in m
    assert c.errors == 1
    c.collect()
    assert c.errors == 2, "every failed reading is counted"


def test_filesystem_space_matches_statvfs_and_names_its_mount(proc_fixture: Path, tmp_path: Path) -> None:
    data = tmp_path / "ckpt"
    data.mkdir()
    (proc_fixture / "mounts").write_text(f"/dev/root / ext4 rw 0 0\ntmpfs {tmp_path} tmpfs ro,nosuid 0 0\n")
    c = collector(proc_fixture, filesystems=(str(data), str(tmp_path / "missing")))
    m = by_name(c.collect())
    st = os.statvfs(data)
    labels = (str(data), "tmpfs", "tmpfs")
    assert m["outrider_host_filesystem_size_bytes"][labels] == st.f_blocks * st.f_frsize
    assert m["outrider_host_filesystem_readonly"][labels] == 1, "the mount table says ro"
    assert c.errors == 1, "a configured path that does not exist is a counted drop"


def test_host_root_reports_host_paths_as_the_host_mounts_them(proc_fixture: Path, tmp_path: Path) -> None:
    """A node agent sees the host's / through a read-only bind mount at host_root: the paths are the host's, the
    space is read through host_root, and read-only is the host's own mount flag (not the bind's), so the disk
    alerts, which skip read-only filesystems, still watch the host's disks."""
    host = tmp_path / "host-root"
    (host / "data").mkdir(parents=True)
    (proc_fixture / "mounts").write_text(f"/dev/vda1 {host} ext4 ro,relatime 0 0\n")  # the container's view
    (proc_fixture / "1").mkdir()
    (proc_fixture / "1" / "mounts").write_text("/dev/vda1 / ext4 rw,relatime 0 0\n/dev/vdb /data xfs rw 0 0\n"
                                               "/dev/vdc /ro xfs ro 0 0\n")  # the host's init's view
    (host / "ro").mkdir()
    c = collector(proc_fixture, filesystems=("/", "/data", "/ro"), host_root=str(host))
    m = by_name(c.collect())
    st = os.statvfs(host)
    assert m["outrider_host_filesystem_size_bytes"][("/", "/dev/vda1", "ext4")] == st.f_blocks * st.f_frsize
    assert m["outrider_host_filesystem_readonly"][("/", "/dev/vda1", "ext4")] == 0
    assert m["outrider_host_filesystem_readonly"][("/data", "/dev/vdb", "xfs")] == 0
    assert m["outrider_host_filesystem_readonly"][("/ro", "/dev/vdc", "xfs")] == 1
    assert c.errors == 0


def test_mount_paths_with_escaped_spaces(proc_fixture: Path) -> None:
    from outrider.kernel.procfs import mount_of, read_mounts

    mounts = read_mounts(str(proc_fixture))
    assert mounts[3].mountpoint == "/mnt/check points"
    assert mounts[2].readonly and not mounts[0].readonly
    assert mount_of("/", mounts) == mounts[0]


def test_vmstat_oom_kills_faults_and_swapping(proc_fixture: Path) -> None:
    m = by_name(collector(proc_fixture).collect())
    assert m["outrider_host_oom_kills_total"][()] == 2
    assert m["outrider_host_page_faults_total"][("major",)] == 4321
    assert m["outrider_host_page_faults_total"][("minor",)] == 987654321 - 4321
    assert m["outrider_host_paging_operations_total"][("out",)] == 340


def test_old_kernel_without_oom_kill_counter_omits_it(proc_fixture: Path) -> None:
    (proc_fixture / "vmstat").write_text("pgfault 10\npgmajfault 1\n")
    m = by_name(collector(proc_fixture).collect())
    assert "outrider_host_oom_kills_total" not in m, "absent, not a misleading zero"
    assert m["outrider_host_page_faults_total"][("minor",)] == 9


def test_shared_and_dirty_memory(proc_fixture: Path) -> None:
    m = by_name(collector(proc_fixture).collect())
    assert m["outrider_host_memory_shared_bytes"][()] == 2097152 * 1024
    assert m["outrider_host_memory_dirty_bytes"][()] == (10240 + 2048) * 1024


def test_disk_latency_inputs(proc_fixture: Path) -> None:
    m = by_name(collector(proc_fixture).collect())
    assert m["outrider_host_disk_operation_time_seconds_total"][("nvme0n1", "read")] == pytest.approx(40.0)
    assert m["outrider_host_disk_operation_time_seconds_total"][("nvme0n1", "write")] == pytest.approx(900.0)
    assert m["outrider_host_disk_io_in_progress"][("sda",)] == 2


def test_kept_open_reader_rereads_live_procfs() -> None:
    from outrider.kernel.procfs import KeptOpenReader

    def ctxt(text: str) -> int:
        return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("ctxt"))

    r = KeptOpenReader("/proc")
    first = ctxt(r.read("stat"))
    # the same descriptor yields fresh content: the machine's context switches, read again until they move
    wait_until(lambda: ctxt(r.read("stat")) > first, timeout_s=10, interval_s=0.01, what="a fresh /proc/stat")
    assert r.read("self/mounts").strip(), "larger seq files are read whole"
    r.close()


def test_inodes_match_statvfs(proc_fixture: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (proc_fixture / "mounts").write_text(f"tmpfs {tmp_path} tmpfs rw 0 0\n")
    m = by_name(collector(proc_fixture, filesystems=(str(data),)).collect())
    st = os.statvfs(data)
    labels = (str(data), "tmpfs", "tmpfs")
    assert m["outrider_host_filesystem_files"][labels] == st.f_files
    # the free count moves as other tests create files on the same filesystem: it is statvfs's, within a margin
    assert abs(m["outrider_host_filesystem_files_free"][labels] - st.f_ffree) < 1000
    assert m["outrider_host_filesystem_files_free"][labels] <= m["outrider_host_filesystem_files"][labels]


def test_cgroup_v2_limit_usage_working_set_and_oom_kills(proc_fixture: Path) -> None:
    m = by_name(collector(proc_fixture).collect())
    assert m["outrider_cgroup_memory_limit_bytes"][()] == 16 * 2**30
    assert m["outrider_cgroup_memory_usage_bytes"][()] == 12 * 2**30
    assert m["outrider_cgroup_memory_working_set_bytes"][()] == 10 * 2**30  # usage minus inactive_file (2 GiB)
    assert m["outrider_cgroup_memory_oom_kills_total"][()] == 1
    assert m["outrider_host_memory_limit_bytes"][()] == 65799224 * 1024, "the host's MemTotal stays the host's"


def test_cgroup_v2_without_a_limit_omits_it(proc_fixture: Path) -> None:
    (sys_tree(proc_fixture) / "fs" / "cgroup" / "memory.max").write_text("max\n")
    c = collector(proc_fixture)
    m = by_name(c.collect())
    assert "outrider_cgroup_memory_limit_bytes" not in m, "absent, not a misleading huge number"
    assert m["outrider_cgroup_memory_usage_bytes"][()] == 12 * 2**30
    assert c.errors == 0


def test_cgroup_v2_path_below_the_mount_without_a_cgroup_namespace(proc_fixture: Path) -> None:
    cgroup = sys_tree(proc_fixture) / "fs" / "cgroup"
    own = cgroup / "kubepods.slice" / "pod-a.slice" / "cri-abc.scope"
    own.mkdir(parents=True)
    for name, text in (("memory.max", "8589934592\n"), ("memory.current", "4294967296\n"),
                       ("memory.stat", "inactive_file 0\n"), ("memory.events", "oom_kill 0\n")):
        (own / name).write_text(text)
    (proc_fixture / "self" / "cgroup").write_text("0::/kubepods.slice/pod-a.slice/cri-abc.scope\n")
    m = by_name(collector(proc_fixture).collect())
    assert m["outrider_cgroup_memory_limit_bytes"][()] == 8 * 2**30, "the agent's own cgroup, not the mount's root"
    assert m["outrider_cgroup_memory_working_set_bytes"][()] == 4 * 2**30


def test_cgroup_v1_memory_controller(proc_fixture: Path) -> None:
    root = sys_tree(proc_fixture)
    shutil.rmtree(root / "fs" / "cgroup")
    memory = root / "fs" / "cgroup" / "memory"
    memory.mkdir(parents=True)
    (memory / "memory.limit_in_bytes").write_text("4294967296\n")
    (memory / "memory.usage_in_bytes").write_text("3221225472\n")
    (memory / "memory.stat").write_text("cache 1073741824\ninactive_file 0\ntotal_inactive_file 1073741824\n")
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    # a v1 runtime that mounts only the container's cgroup: its full path does not exist below the mount
    (proc_fixture / "self" / "cgroup").write_text("5:cpuacct,cpu:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    m = by_name(collector(proc_fixture).collect())
    assert m["outrider_cgroup_memory_limit_bytes"][()] == 4 * 2**30
    assert m["outrider_cgroup_memory_working_set_bytes"][()] == 2 * 2**30
    assert m["outrider_cgroup_memory_oom_kills_total"][()] == 3
    (memory / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert "outrider_cgroup_memory_limit_bytes" not in by_name(collector(proc_fixture).collect()), "v1's no limit"


def test_no_memory_controller_is_absent_not_an_error(proc_fixture: Path) -> None:
    shutil.rmtree(sys_tree(proc_fixture) / "fs" / "cgroup")
    c = collector(proc_fixture)
    m = by_name(c.collect())
    assert not any(name.startswith("outrider_cgroup_") for name in m)
    assert "outrider_host_memory_limit_bytes" in m
    assert c.errors == 0


def test_a_malformed_cgroup_file_is_a_counted_drop(proc_fixture: Path) -> None:
    (sys_tree(proc_fixture) / "fs" / "cgroup" / "memory.current").write_text("lots\n")
    c = collector(proc_fixture)
    m = by_name(c.collect())
    assert "outrider_cgroup_memory_usage_bytes" not in m and "outrider_host_memory_limit_bytes" in m
    assert c.errors == 1


def test_picked_fields_match_whole_keys_where_one_name_ends_another() -> None:
    meminfo = "MemTotal:  100 kB\nSwapCached:  7 kB\nCached:  3 kB\nHugePages_Total:  2"
    assert procfs.pick(meminfo, ("Cached", "MemTotal", "HugePages_Total", "Absent"), ":") == {
        "Cached": 3 * 1024, "MemTotal": 100 * 1024, "HugePages_Total": 2}
    stat = "total_inactive_file 9\ninactive_file 4\noom_kill_disable 1\noom_kill 0\n"
    assert procfs.pick(stat, ("inactive_file", "oom_kill")) == {"inactive_file": 4, "oom_kill": 0}
    # the picked subset reads what parsing every line reads
    assert procfs.read_meminfo("/unused", lambda rel: meminfo, ("SwapCached", "Cached")) == {
        k: v for k, v in procfs.read_meminfo("/unused", lambda rel: meminfo).items() if k in ("SwapCached", "Cached")}


def test_cgroup_v2_cpu_limit_and_cfs_throttling(proc_fixture: Path) -> None:
    m = by_name(collector(proc_fixture).collect())
    assert m["outrider_cgroup_cpu_limit_cores"][()] == 4.0  # cpu.max 400000 of 100000
    assert m["outrider_cgroup_cpu_periods_total"][()] == 12000
    assert m["outrider_cgroup_cpu_throttled_periods_total"][()] == 3000
    assert m["outrider_cgroup_cpu_throttled_seconds_total"][()] == 450.0
    cgroup = sys_tree(proc_fixture) / "fs" / "cgroup"
    (cgroup / "cpu.max").write_text("max 100000\n")
    # without the cpu controller enabled, cpu.stat has its usage only: no periods, nothing throttled to report
    (cgroup / "cpu.stat").write_text("usage_usec 81234567\nuser_usec 61234567\nsystem_usec 20000000\n")
    m = by_name(collector(proc_fixture).collect())
    assert not any(n.startswith("outrider_cgroup_cpu_") for n in m), "absent, not zero: nothing is enforced"


def test_cgroup_v1_cpu_controller(proc_fixture: Path) -> None:
    root = sys_tree(proc_fixture)
    shutil.rmtree(root / "fs" / "cgroup")
    cpu = root / "fs" / "cgroup" / "cpu,cpuacct" / "docker" / "abc"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("150000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    (cpu / "cpu.stat").write_text("nr_periods 500\nnr_throttled 125\nthrottled_time 2500000000\n")
    (proc_fixture / "self" / "cgroup").write_text("5:cpuacct,cpu:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    m = by_name(collector(proc_fixture).collect())
    assert m["outrider_cgroup_cpu_limit_cores"][()] == 1.5
    assert (m["outrider_cgroup_cpu_periods_total"][()], m["outrider_cgroup_cpu_throttled_periods_total"][()]) == \
        (500, 125)
    assert m["outrider_cgroup_cpu_throttled_seconds_total"][()] == 2.5  # throttled_time is in ns on v1
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert "outrider_cgroup_cpu_limit_cores" not in by_name(collector(proc_fixture).collect()), "v1's no limit"


def test_the_clock_its_time_and_the_kernels_view_of_its_synchronisation(proc_fixture: Path) -> None:
    m = by_name(collector(proc_fixture).collect())
    assert m["outrider_host_time_seconds"][()] == 1_700_000_000.0, "the wall clock the collector was given"
    assert m["outrider_host_clock_synchronized"][()] == 1
    assert m["outrider_host_clock_max_error_seconds"][()] == pytest.approx(0.1205)
    # the kernel says unsynchronised by its status bit (STA_UNSYNC) or by its answer (TIME_ERROR)
    for result, status in ((0, 0x0040), (5, 0x2001)):
        m = by_name(collector(proc_fixture, read_clock=lambda r=result, s=status: timex.state(r, s, 16_000_000))
                    .collect())
        assert (m["outrider_host_clock_synchronized"][()], m["outrider_host_clock_max_error_seconds"][()]) == (0, 16.0)


def test_the_machines_own_clock_reads_through_adjtimex() -> None:
    """The real syscall on this machine: a state it can have (no fixture can say adjtimex's struct is laid out
    right: a wrong layout reads maxerror from another field, beyond the kernel's 16 s cap, or a status with bits
    the kernel never sets)."""
    try:
        state = timex.read_clock()
    except OSError as e:
        pytest.skip(f"adjtimex cannot be called here: {e}")
    assert 0.0 <= state.max_error_s <= 16.0
    assert state.synchronized in (True, False)


def test_without_adjtimex_the_time_is_still_reported(proc_fixture: Path) -> None:
    def refused() -> timex.ClockState:
        raise OSError(1, "adjtimex: Operation not permitted")

    c = collector(proc_fixture, read_clock=refused)
    m = by_name(c.collect())
    assert "outrider_host_time_seconds" in m and "outrider_host_clock_synchronized" not in m
    assert c.errors == 0
