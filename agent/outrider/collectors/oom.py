"""OOM-kill collector: which memory cgroup, pod, container and process the kernel's OOM killer killed.

Cheap while nothing happens: a sweep reads the host's count of OOM kills (/proc/vmstat oom_kill, the same in every
namespace) and stops there unless it moved. When it moved the collector looks further:
- the memory cgroups' counters (v2 memory.events, v1 memory.oom_control oom_kill) that rose since the last look. v2
  counts a kill in the victim's cgroup and in each ancestor, so the walk descends only where the count rose: a few
  directories per kill on a node of hundreds of containers. v1 counts each cgroup's own kills and is walked whole.
- the kernel log (/dev/kmsg, where readable), whose `oom-kill:` line names the killed process and its cgroup, also a
  cgroup removed before the walk (v1's counts go with it).
A kill is attributed to its victim: the cgroup the kernel charged it to (on v2 the nearest ancestor still there when
the cgroup went before the walk: the pod's cgroup for a container restarted at once), named with its pod and
container where the kubelet's and runtimes' layouts say (outrider/k8s/cgroup_owners.py). Kills the host counted
that nothing names (a process of the root cgroup, a removed v1 cgroup without a readable log) are counted as
unattributed, only where the agent sees the host's whole hierarchy (a node agent): inside a container's own cgroup
namespace the host's count is every other pod's too.

Kills in the agent's own memory cgroup are the host collector's outrider_cgroup_memory_oom_kills_total (the
ContainerOOMKills page): on v2 the cgroup and those below it, on v1 its own processes, as the kernel counts them.

Bounded: victims are the cgroups that had kills since the agent started, at most MAX_VICTIMS at once, each forgotten
VICTIM_TTL_S after its last kill (the kills of a victim beyond the bound are counted unattributed, reason "cap").
The first look takes the counters as they are: kills before the agent started are history, not pages. A directory
or file that cannot be read, or does not parse, is dropped (logged once per kind, counted in
outrider_collector_errors_total) and the rest of the look goes on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from outrider.collectors.base import Collector, CollectorContext, owner_definitions
from outrider.k8s.cgroup_owners import PodDirectory, identity
from outrider.kernel import cgroupfs, procfs
from outrider.kernel.cgroupfs import parent, within
from outrider.kernel.kmsg import KernelLog, OomKillRecord
from outrider.metrics.family import Family

MAX_VICTIMS = 100
VICTIM_TTL_S = 3600.0
Errors = Callable[[str, BaseException], None]  # (kind of failure, the error): counted and logged once per kind


class CgroupCounters:
    """The OOM-kill counters of one memory hierarchy: which cgroups had how many kills since the last scan.

    Kept between scans: each cgroup's (inode, count) for counts above 0. A cgroup that was not kept had 0 at the
    last scan or did not exist; a cgroup recreated under the same path (a restarted systemd service) has another
    inode and starts from 0. A directory that cannot be listed keeps what was kept below it.

    v2's counts are hierarchical (a cgroup's count holds its descendants'): the kills of a cgroup itself are its
    rise minus its children's rises, so a child removed with its kills since the last scan leaves them to its
    parent, and a subtree whose count did not rise is not entered. v1's counts are each cgroup's own: every cgroup
    is read.
    """

    def __init__(self, hierarchy: cgroupfs.MemoryCgroup, own: str | None, on_error: Errors) -> None:
        self.root = hierarchy.path.rstrip("/")
        self.version = hierarchy.version
        self.own = own  # the agent's own cgroup (relative path), whose kills are the host collector's
        self._on_error = on_error
        self._kept: dict[str, tuple[int, int]] = {}
        self._started = False

    def in_own_scope(self, path: str) -> bool:
        """Whether the host collector's counter of the agent's cgroup counts a kill in `path` (v2: the cgroup and
        those below it; v1: the cgroup itself)."""
        if self.own is None:
            return False
        return within(path, self.own) if self.version == 2 else path == self.own

    def scan(self) -> tuple[dict[str, int], int]:
        """(kills by cgroup path since the last scan, kills in the agent's own scope besides). The first scan takes
        the counts as they are and says nothing."""
        first, self._started = not self._started, True
        new: dict[str, int] = {}
        own = self._v2("/", self.root, None, new) if self.version == 2 else self._v1(new)
        return ({} if first else new), (0 if first else own)

    def _read(self, rel: str, path: str, inode: int) -> int | None:
        """The cgroup's rise since the last scan, keeping its count; None where it has no counter or it could not
        be read (then what was kept stays)."""
        try:
            count = cgroupfs.read_oom_kills(path, self.version)
        except (OSError, ValueError) as e:
            self._on_error("cgroup counter unreadable or malformed", e)
            return None
        if count is None:
            self._kept.pop(rel, None)
            return None
        kept_inode, kept = self._kept.get(rel, (inode, 0))
        if kept_inode != inode or count < kept:
            kept = 0
        if count > 0:
            self._kept[rel] = (inode, count)
        else:
            self._kept.pop(rel, None)
        return count - kept

    def _children(self, path: str) -> list[tuple[str, str, int]] | None:
        """(name, path, inode) of each child cgroup; None where the directory cannot be listed."""
        try:
            with os.scandir(path) as it:
                return [(e.name, e.path, e.inode()) for e in it if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []
        except OSError as e:
            self._on_error("cgroup directory unreadable", e)
            return None

    def _v2(self, rel: str, path: str, rise: int | None, new: dict[str, int]) -> int:
        """Enter one cgroup whose count rose by `rise` (None: the root, which has no counter); returns the kills
        that fell in the agent's own scope."""
        children = self._children(path)
        if children is None:
            return 0
        own_kills = children_rise = 0
        listed = set()
        for name, child_path, inode in children:
            child = f"{rel.rstrip('/')}/{name}"
            listed.add(child)
            child_rise = self._read(child, child_path, inode)
            if not child_rise:
                continue
            children_rise += child_rise
            if self.in_own_scope(child):
                own_kills += child_rise  # the whole subtree's kills: the host collector's
            else:
                own_kills += self._v2(child, child_path, child_rise, new)
        for gone in [p for p in self._kept if parent(p) == rel and p not in listed]:
            for p in [q for q in self._kept if within(q, gone)]:
                del self._kept[p]
        if rise is not None and rise > children_rise:
            new[rel] = rise - children_rise
        return own_kills

    def _v1(self, new: dict[str, int]) -> int:
        own_kills = 0
        old, self._kept = self._kept, {}
        unlisted = []
        try:
            root_inode = os.stat(self.root).st_ino
        except OSError:
            root_inode = 0
        stack = [("/", self.root, root_inode)]
        while stack:
            rel, path, inode = stack.pop()
            if rel in old:
                self._kept[rel] = old[rel]
            rise = self._read(rel, path, inode)
            if rise and self.in_own_scope(rel):
                own_kills += rise
            elif rise:
                new[rel] = rise
            children = self._children(path)
            if children is None:
                unlisted.append(rel)
                continue
            stack.extend((f"{rel.rstrip('/')}/{name}", child_path, child_inode)
                         for name, child_path, child_inode in children)
        for p, value in old.items():  # below a directory that could not be listed: as it was
            if p not in self._kept and any(within(p, u) and p != u for u in unlisted):
                self._kept[p] = value
        return own_kills


@dataclass
class Victim:
    labels: tuple[str, ...]
    kills: int
    last_kill_s: float  # monotonic


def nearest(path: str, counts: dict[str, int]) -> str | None:
    """The path itself or its nearest ancestor with kills left in `counts`."""
    while path:
        if counts.get(path, 0) > 0:
            return path
        path = parent(path)
    return None


class OomCollector(Collector):
    name = "oom"
    description = ("OOM kills by victim: the memory cgroup, pod, container and process the kernel's OOM killer "
                   "killed (from /proc/vmstat, the memory cgroups' counters and /dev/kmsg)")

    def __init__(self, ctx: CollectorContext, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(ctx)
        config = ctx.config
        self._clock = clock
        self._reader = procfs.KeptOpenReader(config.proc_root)
        self._kmsg = KernelLog(config.kmsg_path) if config.kmsg_path else None
        self._pods = PodDirectory(config.host_root or "/")
        self._victims_defn = owner_definitions(config, self.name)["outrider_oom_victim_kills_total"]
        self._counters: CgroupCounters | None = None
        self._host_view = False  # the hierarchy from the kernel's root: the host's count is ours to explain
        self._last_host: int | None = None
        # kills a look found in cgroups beyond the host's count, read just before (the kernel counts a kill in
        # /proc/vmstat, then in the cgroup): the next rise of the host's count, which triggers the next look, is theirs
        self._ahead = 0
        self._victims: dict[str, Victim] = {}
        self._pending: list[OomKillRecord] = []  # logged kills whose count was not there yet: one more look
        self._unattributed = {"unnamed": 0, "cap": 0}
        self._scans = 0

    def collect(self) -> list[Family]:
        vm = procfs.read_vmstat(self.ctx.config.proc_root, self._reader.read, ("oom_kill",))
        host = vm.get("oom_kill")
        if host is None:  # no kernel's count to watch, nor the cgroups' (both came in Linux 4.13): nothing to say
            self._once.warning("vmstat", "oom: %s/vmstat has no oom_kill (a kernel before 4.13): OOM kills are not "
                               "counted", self.ctx.config.proc_root)
            return []
        if self._last_host is None:
            self._start()
        elif host != self._last_host:
            self._look(host - self._last_host if host > self._last_host else host)
        self._last_host = host
        self._forget()
        return self._families()

    def close(self) -> None:
        self._reader.close()
        if self._kmsg is not None:
            self._kmsg.close()

    def _start(self) -> None:
        """The first sweep: the counters as they are, and the kernel log from here on."""
        config = self.ctx.config
        hierarchy = cgroupfs.memory_hierarchy(config.sys_root)
        if hierarchy is None:
            self._once.warning("hierarchy", "oom: no memory cgroup hierarchy under %s/fs/cgroup: OOM kills are "
                               "counted host-wide only (outrider_host_oom_kills_total)", config.sys_root)
            return
        self._host_view = cgroupfs.is_kernel_root(hierarchy)
        own = None
        try:
            mine = cgroupfs.find_memory_cgroup(config.proc_root, config.sys_root)
        except (OSError, ValueError) as e:
            self.drop("own cgroup unreadable", e)
            mine = None
        if mine is not None and mine.version == hierarchy.version:
            rel = os.path.relpath(mine.path, hierarchy.path)
            own = "/" if rel == "." else "/" + rel
        self._counters = CgroupCounters(hierarchy, own, self.drop)
        self._counters.scan()
        if self._kmsg is not None and self._host_view and not self._kmsg.open():
            self._once.warning("kmsg", "oom: the kernel log %s is not readable (%s): OOM victims are named by their "
                               "cgroup, without the killed process's name", self._kmsg.path, self._kmsg.error)

    def _look(self, host_kills: int) -> None:
        """The host counted `host_kills` more: find their victims and name them."""
        if self._counters is None:
            return
        self._scans += 1
        new, own_kills = self._counters.scan()
        logged = [r for r in (*self._pending, *self._logged()) if r.memcg and not self._counters.in_own_scope(r.memcg)]
        left = dict(new)
        unmatched = []
        for rec in logged:  # a logged kill names the process, and the cgroup where the counters saw only a parent
            at = nearest(rec.memcg or "", left)
            if at is None:
                unmatched.append(rec)
                continue
            left[at] -= 1
            self._count(rec.memcg or at, rec.task, 1)
        for path, kills in sorted(left.items()):
            if kills > 0:
                self._count(path, "", kills)
        if self._host_view:
            surplus = host_kills - own_kills - sum(new.values()) - self._ahead
            self._ahead = max(-surplus, 0)
            # A kill the host counted but no cgroup did is the oldest logged kill no counter showed (its cgroup
            # went before the walk); logged kills beyond that came after the host's count was read.
            found = unmatched[:max(surplus, 0)]
            for rec in found:
                self._count(rec.memcg or "/", rec.task, 1)
            unmatched = unmatched[len(found):]
            self._unattributed["unnamed"] += max(surplus - len(found), 0)
        waited = set(self._pending)
        self._pending = [r for r in unmatched if r not in waited][-MAX_VICTIMS:]

    def _logged(self) -> list[OomKillRecord]:
        """The kernel log's OOM kills since the last look (the summaries, which name the cgroup)."""
        if self._kmsg is None or not self._host_view:  # the log's paths are the host's: they match a host view only
            return []
        had_error = self._kmsg.error is not None
        summaries, _ = self._kmsg.oom_kills()
        if self._kmsg.error is not None and not had_error:
            self.drop("kmsg", self._kmsg.error)
        return summaries

    def _count(self, cgroup: str, process: str, kills: int) -> None:
        victim = self._victims.get(cgroup)
        if victim is None:
            if len(self._victims) >= MAX_VICTIMS:
                self._unattributed["cap"] += kills
                self._once.warning("cap", "oom: more than %d OOM victims within %.0f s: the kills of the others "
                                   "are counted in outrider_oom_unattributed_kills_total{reason=\"cap\"}",
                                   MAX_VICTIMS, VICTIM_TTL_S)
                return
            victim = self._victims[cgroup] = Victim(self._labels(cgroup, process), 0, 0.0)
        victim.kills += kills
        victim.last_kill_s = self._clock()
        self.log.info("OOM kill: %s (memory cgroup %s)", victim.labels[4], cgroup)

    def _labels(self, cgroup: str, process: str) -> tuple[str, ...]:
        """cgroup, pod_uid, container_id, process, victim (those in words), then the owner's namespace, pod and
        container where the kubelet's logs name them."""
        ident = identity(cgroup)
        owner = None
        if ident.pod_uid:
            try:
                owner = self._pods.owner(ident)
            except OSError as e:
                self.drop("pod logs unreadable", e)
        if owner is not None:
            where = f"pod {owner.namespace}/{owner.pod}" + (f", container {owner.container}" if owner.container
                                                              else "")
        elif ident.pod_uid:
            where = f"pod {ident.pod_uid}" + (f", container {ident.container_id[:12]}" if ident.container_id else "")
        elif ident.container_id:
            where = f"container {ident.container_id[:12]}"
        else:
            where = f"cgroup {cgroup}"
        victim = f"{process or 'a process'} in {where}"
        return (cgroup, ident.pod_uid, ident.container_id, process, victim,
                *(owner.labels() if owner is not None else ("", "", "")))

    def _forget(self) -> None:
        now = self._clock()
        for cgroup in [c for c, v in self._victims.items() if now - v.last_kill_s > VICTIM_TTL_S]:
            del self._victims[cgroup]

    def _families(self) -> list[Family]:
        victims = Family(self._victims_defn)
        for v in self._victims.values():
            victims.add(v.kills, *v.labels)
        unattributed = Family("outrider_oom_unattributed_kills_total")
        for reason, n in self._unattributed.items():
            unattributed.add(n, reason)
        fams = [victims, unattributed, Family("outrider_oom_scans_total").add(self._scans)]
        if self._kmsg is not None and self._host_view:
            fams.append(Family("outrider_oom_kernel_log_readable").add(1 if self._kmsg.error is None else 0))
        return fams
