"""The oom collector's cost on a busy node, against walking every memory cgroup every sweep (the naive way to notice
a kill) and against the host collector's sweep.

A fixture node laid out as the kernel and the kubelet write it (tests/fakes/cgroup_node.py): PODS pods of two
containers each (and their pause container) under the systemd driver with containerd, on cgroup v2 and on v1. It
times, in one run:
- an idle sweep (no kill: /proc/vmstat's oom_kill only),
- a look after one kill (v2: the cgroups on the kill's path; v1: every cgroup),
- the naive sweep: every cgroup's counter read, every sweep,
- the host collector's sweep on the fixture procfs (tests/fixtures/proc).
Times are the process's CPU time (medians), so that a loaded machine's waits do not count.

    python benchmarks/oom_collector.py
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "agent"))

from tests.fakes.cgroup_node import Node

from outrider.collectors.base import CollectorContext
from outrider.collectors.host import HostCollector
from outrider.collectors.oom import OomCollector
from outrider.ground.config import Config
from outrider.kernel import cgroupfs
from outrider.wiring.sampler import SweepStats

PODS = 110  # the kubelet's default maximum per node
REPEAT = 200


def pod_cgroups(i: int) -> list[str]:
    uid = f"{i:08x}-0000-4000-8000-{i:012x}"
    pod = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice"
    return [f"{pod}/cri-containerd-{(i * 3 + k):064x}.scope" for k in range(3)]


def median_s(fn: object, repeat: int = REPEAT) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()  # type: ignore[operator]
        times.append(time.process_time() - t)
    return statistics.median(times)


def naive_sweep(root: str, version: int) -> int:
    """Every cgroup's counter, read every sweep."""
    total = 0
    stack = [root]
    while stack:
        path = stack.pop()
        total += cgroupfs.read_oom_kills(path, version) or 0
        stack.extend(str(p) for p in Path(path).iterdir() if p.is_dir())
    return total


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="oom-bench-"))
    try:
        fixtures = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
        host = HostCollector(CollectorContext(Config(proc_root=str(fixtures / "proc"), sys_root=str(fixtures / "sys"),
                                                     filesystems=()), SweepStats()))
        host_s = median_s(host.collect)
        print(f"host collector sweep (fixture procfs): {host_s * 1e6:.0f} us")
        for version in (2, 1):
            node = Node(tmp / f"v{version}", version)
            cgroups = [c for i in range(PODS) for c in pod_cgroups(i)]
            for c in cgroups:
                node.cgroup(c)
            count = sum(1 for p in node.root.rglob("*") if p.is_dir())
            (node.host / "var" / "log" / "pods").mkdir(parents=True)
            c = OomCollector(CollectorContext(node.config(kmsg_path=""), SweepStats()))
            c.collect()
            idle_s = median_s(c.collect)
            looks = []
            for i in range(REPEAT // 10):
                node.kill(cgroups[(i * 7) % len(cgroups)], logged=False)
                t = time.process_time()
                c.collect()
                looks.append(time.process_time() - t)
            look_s = statistics.median(looks)
            naive_s = median_s(lambda v=version, r=str(node.root): naive_sweep(r, v), REPEAT // 10)
            print(f"cgroup v{version}, {count} cgroups: idle sweep {idle_s * 1e6:.0f} us "
                  f"({idle_s / naive_s:.4f}x the naive sweep, {idle_s / host_s:.3f}x the host collector's); "
                  f"a look after a kill {look_s * 1e3:.2f} ms ({look_s / naive_s:.2f}x the naive sweep); "
                  f"naive sweep {naive_s * 1e3:.2f} ms")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
