"""Process collector against fake procfs trees: tree discovery, bounded series, monotonic counters."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.process import ProcessCollector
from outrider.ground.config import Config
from outrider.metrics.family import Family
from outrider.wiring.sampler import SweepStats

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


class FakeProc:
    """Writes /proc/PID/{stat,status,io,fd,task/PID/children} the way the kernel lays them out."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(exist_ok=True)

    def add(self, pid: int, ppid: int, name: str = "python", utime: int = 100, stime: int = 10,
            rss_pages: int = 1000, threads: int = 4, start: int = 5000, state: str = "S", fds: int = 3,
            io: tuple[int, int] = (4096, 8192), ctx: tuple[int, int] = (10, 2)) -> None:
        d = self.root / str(pid)
        (d / "fd").mkdir(parents=True, exist_ok=True)
        (d / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
        fields = [state, ppid, pid, pid, 0, -1, 4194304, 0, 0, 0, 0, utime, stime, 0, 0, 20, 0, threads, 0,
                  start, 123456789, rss_pages]
        (d / "stat").write_text(f"{pid} ({name}) " + " ".join(map(str, fields)) + " 0 0 0\n")
        (d / "status").write_text(f"Name:\t{name}\nvoluntary_ctxt_switches:\t{ctx[0]}\n"
                                  f"nonvoluntary_ctxt_switches:\t{ctx[1]}\n")
        (d / "io").write_text(f"rchar: 1\nwchar: 2\nread_bytes: {io[0]}\nwrite_bytes: {io[1]}\n")
        for f in (d / "fd").iterdir():
            f.unlink()
        for i in range(fds):
            (d / "fd" / str(i)).write_text("")
        children = self.root / str(ppid) / "task" / str(ppid) / "children"
        if children.parent.exists():
            kids = children.read_text().split() if children.exists() else []
            if str(pid) not in kids:
                kids.append(str(pid))
            children.write_text(" ".join(kids) + " ")

    def remove(self, pid: int) -> None:
        stat = (self.root / str(pid) / "stat").read_text()
        ppid = stat[stat.rindex(")") + 2:].split()[1]
        shutil.rmtree(self.root / str(pid))
        children = self.root / ppid / "task" / ppid / "children"
        if children.exists():
            children.write_text(" ".join(k for k in children.read_text().split() if k != str(pid)) + " ")


def make(root: Path, roots: tuple[int, ...] = (100,), top_n: int = 10, exclude: frozenset[int] = frozenset()
         ) -> ProcessCollector:
    config = Config(proc_root=str(root), process_top_n=top_n)
    return ProcessCollector(CollectorContext(config, SweepStats(), roots, exclude))


def by_name(fams: list[Family]) -> dict[str, dict[tuple[str, ...], float]]:
    return {f.defn.name: dict(f.samples) for f in fams}


@pytest.fixture
def fake(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def test_tree_is_the_root_and_its_descendants_only(fake: FakeProc) -> None:
    fake.add(1, 0, "init")
    fake.add(100, 1, "train")
    fake.add(101, 100, "worker")
    fake.add(102, 101, "grandchild")
    fake.add(200, 1, "unrelated")
    m = by_name(make(fake.root).collect())
    pids = {labels[0] for labels in m["outrider_process_memory_rss_bytes"]}
    assert pids == {"100", "101", "102"}
    assert m["outrider_watched_processes"][()] == 3
    assert m["outrider_watched_up"][()] == 1
    assert m["outrider_watched_memory_rss_bytes"][()] == 3 * 1000 * PAGE


def test_values_are_read_in_base_units(fake: FakeProc) -> None:
    fake.add(100, 1, "train", utime=250, stime=50, rss_pages=2048, threads=7, fds=5, io=(1000, 2000),
             ctx=(30, 4))
    m = by_name(make(fake.root).collect())
    assert m["outrider_process_cpu_seconds_total"][("100", "train", "user")] == pytest.approx(250 / TICKS)
    assert m["outrider_process_cpu_seconds_total"][("100", "train", "system")] == pytest.approx(50 / TICKS)
    assert m["outrider_process_memory_rss_bytes"][("100", "train")] == 2048 * PAGE
    assert m["outrider_process_threads"][("100", "train")] == 7
    assert m["outrider_process_open_fds"][("100", "train")] == 5
    assert m["outrider_process_io_bytes_total"][("100", "train", "write")] == 2000
    assert m["outrider_process_context_switches_total"][("100", "train", "involuntary")] == 4


def test_comm_with_spaces_and_parentheses(fake: FakeProc) -> None:
    fake.add(100, 1, "pt_main (x) y")
    m = by_name(make(fake.root).collect())
    assert ("100", "pt_main (x) y") in m["outrider_process_threads"]


def test_series_are_bounded_to_top_n_plus_other(fake: FakeProc) -> None:
    fake.add(100, 1, "train", utime=10_000)
    for i in range(20):
        fake.add(200 + i, 100, f"worker{i}", utime=10 + i, rss_pages=100)
    m = by_name(make(fake.root, top_n=5).collect())
    rss = m["outrider_process_memory_rss_bytes"]
    assert len(rss) == 6, "5 processes one by one plus other"
    assert ("100", "train") in rss, "the busiest process is shown"
    shown = {k for k in rss if k[0] != "other"}
    other_pids = [200 + i for i in range(20) if (str(200 + i), f"worker{i}") not in shown]
    assert len(other_pids) == 16
    assert rss[("other", "other")] == 16 * 100 * PAGE
    assert m["outrider_watched_processes"][()] == 21


def test_other_and_tree_counters_never_go_backwards_as_processes_come_and_go(fake: FakeProc) -> None:
    fake.add(100, 1, "train", utime=1000)
    fake.add(101, 100, "a", utime=500)
    fake.add(102, 100, "b", utime=300)
    c = make(fake.root, top_n=1)
    first = by_name(c.collect())
    other_before = first["outrider_process_cpu_seconds_total"][("other", "other", "user")]
    assert first["outrider_watched_cpu_seconds_total"][("user",)] == pytest.approx(1800 / TICKS)
    assert other_before == pytest.approx(800 / TICKS)
    # the shown process exits; a hidden one takes its slot; the other hidden one keeps running
    fake.remove(100)
    fake.add(102, 1, "b", utime=400)
    fake.add(101, 1, "a", utime=600)
    (fake.root / "1" / "task").mkdir(parents=True, exist_ok=True)
    c.ctx.roots = (101, 102)
    second = by_name(c.collect())
    other_after = second["outrider_process_cpu_seconds_total"][("other", "other", "user")]
    tree_after = second["outrider_watched_cpu_seconds_total"][("user",)]
    assert other_after >= other_before
    assert tree_after == pytest.approx((1000 + 600 + 400) / TICKS), "exited processes stay in the tree total"


def test_pid_reuse_is_a_new_process_not_a_counter_reset(fake: FakeProc) -> None:
    fake.add(100, 1, "train", utime=1000, start=5000)
    c = make(fake.root)
    c.collect()
    fake.add(100, 1, "train", utime=10, start=9999)  # same pid, different start time
    m = by_name(c.collect())
    assert m["outrider_watched_cpu_seconds_total"][("user",)] == pytest.approx(1010 / TICKS)


def test_zombies_and_excluded_pids_are_not_reported(fake: FakeProc) -> None:
    fake.add(100, 1, "outrider")
    fake.add(101, 100, "train")
    fake.add(102, 100, "defunct", state="Z")
    m = by_name(make(fake.root, exclude=frozenset({100})).collect())
    assert {k[0] for k in m["outrider_process_threads"]} == {"101"}


def test_unreadable_io_is_a_counted_drop_and_the_process_still_reported(fake: FakeProc) -> None:
    fake.add(100, 1, "train")
    (fake.root / "100" / "io").unlink()
    (fake.root / "100" / "io").mkdir()  # reading it fails with an OSError, as EACCES would for another user
    c = make(fake.root)
    m = by_name(c.collect())
    assert ("100", "train") in m["outrider_process_threads"]
    assert ("100", "train", "read") not in m["outrider_process_io_bytes_total"]
    assert c.errors == 1


def test_ppid_scan_when_the_kernel_has_no_children_files(fake: FakeProc) -> None:
    fake.add(100, 1, "train")
    fake.add(101, 100, "worker")
    fake.add(300, 1, "other")
    for pid in (100, 101, 300):
        (fake.root / str(pid) / "task" / str(pid) / "children").unlink(missing_ok=True)
    m = by_name(make(fake.root).collect())
    assert {k[0] for k in m["outrider_process_threads"]} == {"100", "101"}


def test_watched_up_is_zero_when_the_tree_is_gone(fake: FakeProc) -> None:
    m = by_name(make(fake.root, roots=(4242,)).collect())
    assert m["outrider_watched_up"][()] == 0
    assert m["outrider_watched_processes"][()] == 0


def test_whole_host_mode_skips_kernel_threads(fake: FakeProc) -> None:
    fake.add(1, 0, "init")
    fake.add(2, 0, "kthreadd")
    fake.add(3, 2, "kworker/0:0")
    fake.add(50, 1, "sshd")
    m = by_name(make(fake.root, roots=()).collect())
    assert {k[0] for k in m["outrider_process_threads"]} == {"1", "50"}


def _unreadable(fake: FakeProc, pid: int, *names: str) -> None:
    """Make /proc/PID/NAME fail with an OSError, as EACCES does for another user's process without ptrace."""
    for name in names:
        path = fake.root / str(pid) / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        path.write_text("") if name == "fd" else path.mkdir()


def test_readings_of_other_users_processes_are_absent_never_zero(fake: FakeProc) -> None:
    """A non-root node agent cannot read root's /proc/PID/io or /proc/PID/fd: the readings are left out of the
    per-process series, of "other" and of the tree total, and counted as drops; nothing says 0."""
    fake.add(100, 1, "train", utime=1000)
    fake.add(101, 100, "root-owned-a", io=(1 << 20, 1 << 21))
    fake.add(102, 100, "root-owned-b", io=(1 << 22, 1 << 23))
    for pid in (100, 101, 102):
        _unreadable(fake, pid, "io", "fd")
    c = make(fake.root, top_n=1)
    m = by_name(c.collect())
    assert ("100", "train") in m["outrider_process_threads"], "the process itself is still reported"
    assert ("other", "other") in m["outrider_process_threads"]
    assert m["outrider_process_io_bytes_total"] == {}, "no I/O series at all: none could be read"
    assert m["outrider_process_open_fds"] == {}
    assert m["outrider_watched_io_bytes_total"] == {}, "the tree total is absent, not 0"
    assert c.errors == 6, "two drops (io, fd) per process, counted"


def test_sums_add_only_what_could_be_read(fake: FakeProc) -> None:
    fake.add(100, 1, "train", utime=1000, io=(10, 20), fds=5)
    fake.add(101, 100, "mine", utime=10, io=(1000, 2000), fds=7)
    fake.add(102, 100, "not-mine", utime=5, io=(1 << 30, 1 << 30), fds=9)
    _unreadable(fake, 102, "io", "fd")
    m = by_name(make(fake.root, top_n=1).collect())
    assert m["outrider_process_io_bytes_total"][("other", "other", "read")] == 1000
    assert m["outrider_process_open_fds"][("other", "other")] == 7
    assert m["outrider_watched_io_bytes_total"][("read",)] == 1010


def test_unreadable_context_switches_are_absent_not_zero(fake: FakeProc) -> None:
    fake.add(100, 1, "train", ctx=(50, 5))
    _unreadable(fake, 100, "status")
    c = make(fake.root)
    m = by_name(c.collect())
    assert ("100", "train", "voluntary") not in m["outrider_process_context_switches_total"]
    assert c.errors == 1


def test_io_unreadable_for_a_while_neither_resets_nor_double_counts(fake: FakeProc) -> None:
    fake.add(100, 1, "train", io=(1000, 0))
    c = make(fake.root)
    c.collect()
    _unreadable(fake, 100, "io")
    m = by_name(c.collect())
    assert m["outrider_watched_io_bytes_total"][("read",)] == 1000, "the last known total, not a drop to 0"
    (fake.root / "100" / "io").rmdir()
    fake.add(100, 1, "train", io=(1500, 0))
    m = by_name(c.collect())
    assert m["outrider_watched_io_bytes_total"][("read",)] == 1500
def test_identity_of_a_shown_process_user_command_and_start_time() -> None:
    import pwd

    import psutil

    from outrider.collectors.process_identity import MAX_COMMAND, ProcessIdentities
    from outrider.kernel import procfs

    me = os.getpid()
    key = (me, procfs.read_proc_stat("/proc", me).start_ticks)
    start, info = ProcessIdentities("/proc", full_command=True).families([key], {key: "python"})
    (labels, started), = start.samples
    assert labels == (str(me), "python")
    assert abs(started - psutil.Process(me).create_time()) <= 1.0 / procfs.CLOCK_TICKS + 1.0  # btime is whole seconds
    (labels, one), = info.samples
    assert one == 1 and labels[2] == pwd.getpwuid(os.getuid()).pw_name
    assert labels[3] == " ".join(psutil.Process(me).cmdline())[:MAX_COMMAND]


def test_identity_of_a_process_gone_meanwhile_is_left_out_not_an_error(tmp_path: Path) -> None:
    from outrider.collectors.process_identity import ProcessIdentities

    (tmp_path / "stat").write_text("cpu 1 2 3 4 5 6 7 8\nbtime 1700000000\n")
    start, info = ProcessIdentities(str(tmp_path)).families([(4242, 100)], {(4242, 100): "gone"})
    assert start.samples and not info.samples
