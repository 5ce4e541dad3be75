"""Exit with the workload: the agent's end where Kubernetes has no native sidecars (a sidecar in a Job on a cluster
older than 1.29 would otherwise keep the pod Running after the trainer exits).

"The workload" is every process that published to the spool (instrumented processes, as the sweep's
outrider_hook_processes counts them: a shard not yet closed whose process is alive) plus, when `pids` are given,
those process trees. It has been seen once a sweep found one of them alive, or found the values of one that had
already exited (outrider_hook_retired_series: a trainer that lived less than one sweep, a crash at start). Once
seen and none is alive for a grace period (a launcher's next stage, `python prep.py && python train.py`, gets that
long to publish), the agent stops the way SIGTERM stops it: a final sweep, which takes in the values of the shards
closed last, and a flush of OTLP; then `outrider agent` exits 0.

A workload that is never seen (it failed before `instrument()`, or never calls it, and no `pids` are given) ends
the agent the same way after `startup_grace_s` (0: the agent then runs until it is told to stop).

A sidecar in a pod that shares its PID namespace (shareProcessNamespace) sees the pod's other containers'
processes (PodPeers). Until the workload has published, those stand for it: a trainer still importing before
`instrument()` is seen and keeps the agent, and one that dies before publishing (killed in its first second, a
crash at import) ends it after the grace period instead of startup_grace_s. Once something has published, the
shards alone count again, so another sidecar that runs on (a proxy) does not hold the agent. startup_grace_s is
then only how long no process of another container has been there at all: the chart lists its legacy sidecar
after the workload's containers (the kubelet starts them in order) and sets it short, since nothing there when the
agent starts means the workload has already exited.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from outrider.kernel import procfs

if TYPE_CHECKING:
    from outrider.ground.config import Config
    from outrider.metrics.family import Family
    from outrider.wiring.sampler import Sampler

LOG = logging.getLogger("outrider.lifecycle")


def grace_s(interval_s: float) -> float:
    """Three sweeps, at least 5 s: long enough for a shard closed mid-sweep to be read, and for a chain of
    commands to start its next instrumented process."""
    return max(3.0 * interval_s, 5.0)


class WorkloadWatch:
    """Sweep by sweep, counts the workload's live processes; calls on_gone once, when it has been seen and then
    nothing of it was alive for grace_s (measured on the monotonic clock)."""

    def __init__(self, live: Callable[[Sequence[Family]], int], grace_s: float,
                 on_gone: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 ran: Callable[[Sequence[Family]], bool] = lambda families: False,
                 startup_grace_s: float = 0.0) -> None:
        self._live = live
        self._ran = ran
        self.grace_s = grace_s
        self.startup_grace_s = startup_grace_s
        self.on_gone = on_gone
        self.on_empty: Callable[[], None] | None = None  # once, when the grace period first starts
        self._clock = clock
        self._started = clock()
        self.seen = False
        self.gone = False
        self._empty_since: float | None = None

    def on_sweep(self, families: Sequence[Family]) -> None:
        """A sampler listener: runs after the collectors of each sweep, the hook collector's view fresh."""
        if self.gone:
            return
        alive = self._live(families)
        now = self._clock()
        if alive:
            if not self.seen:
                LOG.info("watching the workload: %d process(es); the agent exits once none is left", alive)
            self.seen = True
            self._empty_since = None
            return
        if not self.seen and self._ran(families):
            self.seen = True  # it came and went between two sweeps: its values are in, it has run
            LOG.info("the workload ran and exited between two sweeps")
        if not self.seen:
            if self.startup_grace_s > 0 and now - self._started >= self.startup_grace_s:
                self.gone = True
                LOG.warning("no workload appeared within startup_grace_s (%g s): it failed before instrument(), or "
                            "does not call it; the workload is gone: final sweep and flush, then exit",
                            self.startup_grace_s)
                if self.on_gone is not None:
                    self.on_gone()
            return
        if self._empty_since is None:
            self._empty_since = now
            LOG.info("the workload has exited; stopping in %g s unless it comes back", self.grace_s)
            if self.on_empty is not None:
                self.on_empty()
                self.on_empty = None
        if now - self._empty_since >= self.grace_s:
            self.gone = True
            LOG.info("the workload is gone: final sweep and flush, then exit")
            if self.on_gone is not None:
                self.on_gone()


def live_processes(proc_root: str, roots: tuple[int, ...]) -> Callable[[Sequence[Family]], int]:
    """What counts as the workload in a sweep: the hooked processes it saw alive (outrider_hook_processes, any
    state) plus the live (not zombie) processes of the trees rooted at `roots`."""

    def live(families: Sequence[Family]) -> int:
        n = sum(int(v) for f in families if f.defn.name == "outrider_hook_processes"
                for _, v in f.samples if isinstance(v, float))
        for pid in procfs.descendants(proc_root, roots) if roots else ():
            try:
                if procfs.read_proc_stat(proc_root, pid).state not in ("Z", "X"):
                    n += 1
            except (OSError, ValueError, IndexError):
                continue  # exited between listing and reading
        return n

    return live


class PodPeers:
    """The processes of the pod's other containers, seen from a container that shares the pod's PID namespace:
    every process but the namespace's PID 1 (the pod's pause process) and this container's own (the tree of its
    first process, the one whose parent is outside the namespace: ppid 0)."""

    def __init__(self, proc_root: str, own_root: int) -> None:
        self.proc_root = proc_root
        self.own_root = own_root
        self.published = False  # the workload has published to the spool: from then on its shards count, not these

    @classmethod
    def around(cls, proc_root: str, pid: int | None = None) -> PodPeers | None:
        """PodPeers of this process (or `pid`) where its container's first process is not PID 1, i.e. it was
        started into a PID namespace another container's process heads; None elsewhere (a container of its own,
        the host, a process whose parents cannot be read)."""
        pid = os.getpid() if pid is None else pid
        for _ in range(64):  # a parent chain longer than this is no container's
            parent = procfs.parent_pid(proc_root, pid)
            if parent is None:
                return None
            if parent == 0:
                return cls(proc_root, pid) if pid != 1 else None
            pid = parent
        return None

    def alive(self) -> int:
        """The other containers' live (not zombie) processes."""
        ours = set(procfs.descendants(self.proc_root, (self.own_root,)))
        n = 0
        for pid in procfs.list_pids(self.proc_root):
            if pid == 1 or pid in ours:
                continue
            try:
                if procfs.read_proc_stat(self.proc_root, pid).state not in ("Z", "X"):
                    n += 1
            except (OSError, ValueError, IndexError):
                continue  # exited between listing and reading
        return n

    def until_published(self, hooked: Callable[[Sequence[Family]], int]) -> Callable[[Sequence[Family]], int]:
        """What counts as the workload: `hooked` (the spool's live processes, `pids`' trees) once anything has
        published, and the other containers' processes until then."""

        def live(families: Sequence[Family]) -> int:
            n = hooked(families)
            if n or ran_and_exited(families):
                self.published = True
            return n if self.published else self.alive()

        return live


def ran_and_exited(families: Sequence[Family]) -> bool:
    """Whether the sweep holds values of hooked processes that already exited (their series, retired)."""
    return any(v > 0 for f in families if f.defn.name == "outrider_hook_retired_series"
               for _, v in f.samples if isinstance(v, float))


def attach(sampler: Sampler, config: Config) -> WorkloadWatch | None:
    """A WorkloadWatch listening to the sampler's sweeps when exit_when_workload_exits is set, else None."""
    if not config.exit_when_workload_exits:
        return None
    roots = sampler.ctx.roots
    if "hook" not in {c.name for c in sampler.collectors} and not roots:
        LOG.warning("exit_when_workload_exits: with neither the hook collector nor pids there is no workload to "
                    "watch; the agent runs until it is stopped")
    live = live_processes(config.proc_root, roots)
    peers = PodPeers.around(config.proc_root)
    if peers is not None:
        LOG.info("sharing the pod's PID namespace: until the workload publishes, the pod's other containers' "
                 "processes stand for it")
        live = peers.until_published(live)
    watch = WorkloadWatch(live, grace_s(config.interval_s), ran=ran_and_exited,
                          startup_grace_s=config.startup_grace_s)
    sampler.listeners.append(watch.on_sweep)
    return watch
