"""A host's kernel files for the OOM-kill readers, written as the kernel writes them: /proc/vmstat, the memory cgroup
hierarchy (cgroup v2 memory.events, counting a cgroup's descendants; v1 memory.oom_control, each cgroup its own),
/dev/kmsg's records, and the kubelet's log directories that name pods and containers. `Node.kill` makes an OOM
kill as the kernel makes it: the summary line, the host's count, the cgroup's count (v2: and its ancestors'), then
"Killed process"."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from outrider.ground.config import Config

VMSTAT = "nr_free_pages 3022136\npgfault 912733245\npgmajfault 11402\noom_kill {n}\npswpin 0\npswpout 0\n"
V2_EVENTS = "low 0\nhigh 0\nmax {n}\noom {n}\noom_kill {n}\noom_group_kill 0\n"
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"


class Node:
    """A host's /proc, /sys/fs/cgroup, /dev/kmsg and kubelet log directories, written as the kernel and the kubelet
    write them; `kill` counts an OOM kill where the kernel does and logs it as the kernel does."""

    def __init__(self, tmp: Path, version: int, own: str = "/", kernel_root: bool = True) -> None:
        self.version = version
        self.proc, self.sys, self.host, self.kmsg = tmp / "proc", tmp / "sys", tmp / "host", tmp / "kmsg"
        self.host_kills = 0
        self.seq = 400
        (self.proc / "self").mkdir(parents=True)
        (self.proc / "vmstat").write_text(VMSTAT.format(n=0))
        (self.proc / "self" / "cgroup").write_text(
            f"0::{own}\n" if version == 2 else f"9:name=systemd:/\n4:memory:{own}\n3:cpuset:/\n0::/\n")
        base = self.sys / "fs" / "cgroup"
        self.root = base if version == 2 else base / "memory"
        self.root.mkdir(parents=True)
        if version == 2:
            (base / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
            (base / "memory.stat").write_text("anon 0\nfile 0\n")
            if not kernel_root:  # a cgroup namespace's root is a cgroup like any other
                self._files(base, 0)
        else:
            (self.root / "memory.usage_in_bytes").write_text("4096000\n")
            (self.root / "memory.oom_control").write_text(V1_OOM_CONTROL.format(n=0))
            if kernel_root:
                (self.root / "release_agent").write_text("\n")
                (self.root / "cgroup.sane_behavior").write_text("0\n")
        self.kmsg.write_text("6,1,0,-;Linux version 6.1.0 (gcc) #1 SMP\n")

    def config(self, **extra: object) -> Config:
        args: dict[str, object] = {"proc_root": str(self.proc), "sys_root": str(self.sys), "kmsg_path": str(self.kmsg),
                                   "host_root": str(self.host)}
        args.update(extra)
        return Config(**args)  # type: ignore[arg-type]

    def _files(self, path: Path, kills: int) -> None:
        if self.version == 2:
            (path / "memory.events").write_text(V2_EVENTS.format(n=kills))
            (path / "memory.current").write_text("1048576\n")
            (path / "cgroup.events").write_text("populated 1\nfrozen 0\n")
        else:
            (path / "memory.oom_control").write_text(V1_OOM_CONTROL.format(n=kills))
            (path / "memory.usage_in_bytes").write_text("1048576\n")

    def cgroup(self, rel: str) -> Path:
        """The cgroup and its ancestors, each with its memory controller's files (0 kills)."""
        path = self.root
        for part in rel.strip("/").split("/"):
            path = path / part
            if not path.exists():
                path.mkdir()
                self._files(path, 0)
        return path

    def _count(self, path: Path) -> int:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return int(next(line.split()[1] for line in (path / name).read_text().splitlines()
                        if line.startswith("oom_kill ")))

    def kill(self, rel: str, task: str = "python3", pid: int = 18855, logged: bool = True,
             counted: bool = True, host: bool = True) -> None:
        """One OOM kill in cgroup `rel`: the kernel logs the summary, counts the kill in /proc/vmstat and in the
        cgroup (v2: and its ancestors), then logs "Killed process"."""
        if logged:
            self.log(f"{task} invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0")
            self.log(f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg={rel},"
                     f"task_memcg={rel},task={task},pid={pid},uid=0")
        if host:
            self.host_kills += 1
            (self.proc / "vmstat").write_text(VMSTAT.format(n=self.host_kills))
        if counted:
            path = self.cgroup(rel)
            while path != self.root:
                self._files(path, self._count(path) + 1)
                if self.version == 1:
                    break
                path = path.parent
        if logged:
            self.log(f"Memory cgroup out of memory: Killed process {pid} ({task}) total-vm:78356kB, anon-rss:65152kB, "
                     "file-rss:6628kB, shmem-rss:0kB, UID:0 pgtables:184kB oom_score_adj:0", continuation=True)

    def log(self, message: str, continuation: bool = False) -> None:
        self.seq += 1
        with self.kmsg.open("a") as fh:
            fh.write(f"6,{self.seq},{1162528898 + self.seq},-;{message}\n")
            if continuation:
                fh.write(" SUBSYSTEM=memory\n")

    def remove(self, rel: str) -> None:
        shutil.rmtree(self.root / rel.strip("/"))

    def pod_logs(self, namespace: str, pod: str, uid: str, containers: dict[str, str]) -> None:
        """The kubelet's /var/log/pods/NS_POD_UID/CONTAINER/0.log and /var/log/containers links."""
        pods = self.host / "var" / "log" / "pods" / f"{namespace}_{pod}_{uid}"
        links = self.host / "var" / "log" / "containers"
        links.mkdir(parents=True, exist_ok=True)
        for name, cid in containers.items():
            (pods / name).mkdir(parents=True, exist_ok=True)
            (pods / name / "0.log").write_text("")
            if cid:
                os.symlink(pods / name / "0.log", links / f"{pod}_{namespace}_{name}-{cid}.log")
