"""The one reader of each /proc file (outrider/kernel/procfs.py), which the hook and the agent share: each caller
takes the uid its question asks for, and the readers the hook uses agree with the agent's on a live process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.collectors.process_identity import ProcessIdentities
from outrider.ground.config import Config
from outrider.kernel import procfs
from outrider.shared import spool
from tests.helpers import reap

STRANGER = 54321  # a uid that is neither this user, root, nor trusted
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root (CI runs as root)")


def _process(root: Path, pid: int, uids: tuple[int, int], start: int = 5000) -> None:
    """/proc/PID/{stat,status,cmdline} of a process whose real and effective uids are `uids` (a setuid program's
    differ)."""
    d = root / str(pid)
    d.mkdir(parents=True)
    fields = ["S", 1, pid, pid, 0, -1, 0, 0, 0, 0, 0, 100, 10, 0, 0, 20, 0, 1, 0, start, 0, 100]
    (d / "stat").write_text(f"{pid} (python) " + " ".join(map(str, fields)) + "\n")
    real, effective = uids
    (d / "status").write_text(f"Name:\tpython\nUid:\t{real}\t{effective}\t{effective}\t{effective}\n"
                              f"Gid:\t0\t0\t0\t0\n")
    (d / "cmdline").write_bytes(b"python\0train.py\0")


def test_the_uids_are_read_in_the_kernels_order(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "status").write_text("Name:\tx\nUid:\t1000\t2000\t3000\t4000\nGid:\t5\t5\t5\t5\n")
    assert procfs.read_proc_uids(str(tmp_path), 7) == procfs.Uids(real=1000, effective=2000, saved=3000,
                                                                   filesystem=4000)


def test_a_processs_user_label_is_who_started_it_its_real_uid(tmp_path: Path) -> None:
    """A setuid program started by root that runs as STRANGER is root's: the label names who started it."""
    (tmp_path / "stat").write_text("cpu  1 2 3 4\nbtime 1700000000\n")
    _process(tmp_path, 42, (0, STRANGER))
    info = {f.defn.name: f for f in ProcessIdentities(str(tmp_path)).families([(42, 5000)], {(42, 5000): "python"})}
    (labels, _), = info["outrider_process_info"].samples
    assert labels[:3] == ("42", "python", "root")


@needs_root
def test_a_shard_is_trusted_by_the_effective_uid_of_the_process_it_claims_to_be(tmp_path: Path) -> None:
    """The owner of a file is its creator's effective uid (through its filesystem uid): a process that runs as
    STRANGER, whoever started it, writes shards STRANGER owns; one STRANGER started that runs as another did not."""
    proc, sp = tmp_path / "proc", tmp_path / "spool"
    sp.mkdir(mode=0o700)
    _process(proc, 4242, (0, STRANGER))  # runs as STRANGER
    _process(proc, 4243, (STRANGER, 1000))  # started by STRANGER, runs as 1000
    paths = []
    for pid in (4242, 4243):
        w = spool.ShardWriter(str(sp), pid, 1_000)
        w.write(b'{"meta": {}, "series": []}', [], flags=0, pid=pid, stalls=0, start_ns=1_000, heartbeat_ns=2_000,
                last_step_ns=0, steps=0, stalled_since_ns=0)
        w.close()
        os.chown(w.path, STRANGER, STRANGER)
        paths.append(w.path)
    c = HookCollector(CollectorContext(Config(spool_dir=str(sp), proc_root=str(proc)), hold_spool_lock=False))
    try:
        assert c.reader.read(paths[0]).header.pid == 4242
        with pytest.raises(spool.ShardUntrusted):
            c.reader.read(paths[1])
    finally:
        c.close()


def test_the_hooks_readers_agree_with_the_agents_on_a_live_process() -> None:
    """The hook reads start ticks, parent, CPU and children through the same parser the process collector uses."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = procfs.read_proc_stat("/proc", os.getpid())
        assert procfs.start_ticks("/proc", "self") == me.start_ticks
        assert procfs.parent_pid("/proc", os.getpid()) == me.ppid == os.getppid()
        assert procfs.parent_pid("/proc", child.pid) == os.getpid()
        cpu = procfs.read_cpu(f"/proc/{os.getpid()}/stat")
        # read after: never less, to the tick (the two halves rounded apart: 0.8 + 0.06 > 0.86 in floating point)
        assert cpu is not None and cpu[0] == me.name and cpu[1] >= me.user_s + me.system_s - 1e-9
        kids = [k for tid in os.listdir(f"/proc/{os.getpid()}/task")
                for k in procfs.read_task_children("/proc", os.getpid(), int(tid))]
        assert child.pid in kids
        assert 0.0 <= procfs.age_s("/proc", "self") < procfs.read_uptime("/proc")
    finally:
        child.kill()
        reap([child])


def test_a_gone_process_reads_as_none(tmp_path: Path) -> None:
    assert procfs.start_ticks(str(tmp_path), 99) is None
    assert procfs.parent_pid(str(tmp_path), 99) is None
    assert procfs.read_cpu(f"{tmp_path}/99/stat") is None
    assert procfs.read_task(f"{tmp_path}/99/task/99") is None
