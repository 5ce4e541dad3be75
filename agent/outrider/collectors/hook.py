"""Hook collector: merges the per-process shards in the spool directory into metrics.

Series of all processes are summed per metric, labels and rank (so gunicorn workers or forked helpers add up,
and DDP ranks stay apart). Values in shards are cumulative; when a process is gone (its shard marked closed, or
its pid gone and its heartbeat stale), its last counter and histogram values are kept as "retired" totals, its
shard is deleted, and the merged counters never go backwards while the agent lives. Unreadable shards
(truncated, corrupt, newer format) are skipped and counted, never fatal.
"""

from __future__ import annotations

import glob
import mmap
import os
import time
from dataclasses import dataclass

from outrider.collectors.base import Collector, CollectorContext
from outrider.hook import shard
from outrider.hook.runtime import shard_stack_path, try_lock
from outrider.metrics.catalog import CATALOG, Label, MetricDef
from outrider.metrics.family import Family, HistogramValue

SeriesKey = tuple[str, str, tuple[tuple[str, str], ...], tuple[float, ...]]  # name, kind, labels (+rank), bounds


@dataclass
class ProcessState:
    path: str
    meta: dict[str, object]
    header: shard.ShardHeader
    state: str  # running, stalled, unresponsive, exited
    stack_file: str | None


class HookCollector(Collector):
    name = "hook"
    description = "metrics the in-process hook publishes (steps, data wait, latency, allocator) from the spool"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        from outrider.hook.runtime import default_spool_dir

        self.spool = ctx.config.spool_dir or default_spool_dir()
        self._maps: dict[str, tuple[int, mmap.mmap]] = {}  # path -> (inode, map)
        self._retired: dict[SeriesKey, list[float]] = {}
        self._dynamic: dict[str, MetricDef] = {}
        self.shard_errors: dict[str, int] = {}
        self.processes: list[ProcessState] = []
        self._heartbeats: dict[str, tuple[int, float]] = {}  # path -> (heartbeat, monotonic time it changed)
        self._lock_fd: int | None = None
        if ctx.hold_spool_lock:
            try:
                os.makedirs(self.spool, mode=0o700, exist_ok=True)
                self._lock_fd = try_lock(self.spool)
            except OSError as e:
                self.drop("spool", e)

    # --- reading ---------------------------------------------------------------------------------------------
    def _map(self, path: str) -> mmap.mmap | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        hit = self._maps.get(path)
        if hit is not None and hit[0] == st.st_ino:
            return hit[1]
        if hit is not None:
            hit[1].close()
        if st.st_size < shard.HEADER_BYTES:
            raise shard.ShardFormatError(f"truncated: {st.st_size} bytes")
        with open(path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        self._maps[path] = (st.st_ino, mm)
        return mm

    def _snapshot(self, path: str) -> shard.ShardSnapshot | None:
        mm = self._map(path)
        if mm is None:
            return None
        for _ in range(50):
            seq = shard.read_seq(mm)
            if seq & 1:
                time.sleep(0.0005)
                continue
            header = shard.read_header(mm[:shard.HEADER_BYTES])
            end = min(len(mm), shard.DATA_OFFSET + 8 * header.value_count)
            copy = mm[:end]
            if shard.read_seq(mm) == seq:
                return shard.decode(copy)
        raise shard.ShardFormatError("writer never settled (seq kept changing)")

    def _count_shard_error(self, reason: str, path: str, error: Exception) -> None:
        self.shard_errors[reason] = self.shard_errors.get(reason, 0) + 1
        self.drop(f"shard {os.path.basename(path)}", error)

    # --- merging ---------------------------------------------------------------------------------------------
    def collect(self) -> list[Family]:
        merged: dict[SeriesKey, list[float]] = {}
        processes: list[ProcessState] = []
        for path in sorted(glob.glob(os.path.join(self.spool, "*.shard"))):
            try:
                snap = self._snapshot(path)
            except shard.ShardFormatError as e:
                self._count_shard_error("newer_version" if "newer" in str(e) else "corrupt", path, e)
                continue
            except (OSError, ValueError) as e:
                self._count_shard_error("unreadable", path, e)
                continue
            if snap is None:
                continue
            rank = str(snap.meta.get("rank", ""))
            entries: dict[SeriesKey, list[float]] = {}
            for name, kind, labels, values, bounds in snap.series:
                key = (name, kind, (*sorted(labels.items()), ("rank", rank)), bounds)
                entries[key] = values
            state = self._state(path, snap)
            if state == "exited":
                self._retire(entries)
                self._remove(path)
                continue
            stack = shard_stack_path(path)
            processes.append(ProcessState(path, snap.meta, snap.header, state,
                                          stack if os.path.exists(stack) else None))
            for key, values in entries.items():
                _accumulate(merged, key, values)
        for key, values in self._retired.items():
            _accumulate(merged, key, values)
        self.processes = processes
        return self._families(merged, processes)

    def _state(self, path: str, snap: shard.ShardSnapshot) -> str:
        h = snap.header
        if h.flags & shard.FLAG_CLOSED:
            return "exited"
        # The heartbeat's age on the agent's monotonic clock (since the value last changed), so a wall-clock jump
        # on the node neither retires a live process nor keeps a dead one.
        now = time.monotonic()
        seen = self._heartbeats.get(path)
        if seen is None or seen[0] != h.heartbeat_ns:
            seen = self._heartbeats[path] = (h.heartbeat_ns, now)
        age_s = now - seen[1]
        flush_s = self.ctx.config.flush_interval_s
        pid_visible = os.path.exists(f"{self.ctx.config.proc_root}/{h.pid}")
        if not pid_visible and age_s > 3 * flush_s:
            # Killed or crashed (no closing flush). In a pod without a shared process namespace no pid is visible:
            # there, three missed heartbeats mean gone.
            return "exited"
        if age_s > max(10 * flush_s, 10.0):
            return "unresponsive"  # alive, but its publisher thread has not written for a while
        if h.flags & shard.FLAG_STALLED:
            return "stalled"
        return "running"

    def _retire(self, entries: dict[SeriesKey, list[float]]) -> None:
        for key, values in entries.items():
            if key[1] in ("counter", "histogram"):  # a gone process's gauges go with it
                _accumulate(self._retired, key, values)

    def _remove(self, path: str) -> None:
        self._heartbeats.pop(path, None)
        hit = self._maps.pop(path, None)
        if hit is not None:
            hit[1].close()
        for p in (path, shard_stack_path(path)):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
            except OSError as e:
                self.drop("cleanup", e)

    # --- families --------------------------------------------------------------------------------------------
    def _defn(self, name: str, kind: str, label_names: tuple[str, ...]) -> MetricDef | None:
        defn = CATALOG.get(name)
        if defn is not None:
            return defn if defn.type == kind and set(defn.label_names) == set(label_names) else None
        hit = self._dynamic.get(name)
        if hit is None:
            hit = MetricDef(name, name, "s" if name.endswith("_seconds") else "1", kind,  # type: ignore[arg-type]
                            "Custom metric published by the workload through the Outrider hook.",
                            tuple(Label(n, n) for n in label_names), "hook")
            self._dynamic[name] = hit
        return hit if hit.type == kind and set(hit.label_names) == set(label_names) else None

    def _families(self, merged: dict[SeriesKey, list[float]], processes: list[ProcessState]) -> list[Family]:
        fams: dict[str, Family] = {}
        for (name, kind, labels, bounds), values in merged.items():
            label_map = dict(labels)
            defn = self._defn(name, kind, tuple(label_map))
            if defn is None:
                self.drop(f"series {name}", "kind or label names differ from the metric's definition")
                continue
            fam = fams.get(name)
            if fam is None:
                fam = fams[name] = Family(defn)
            label_values = tuple(label_map[n] for n in defn.label_names)
            if kind == "histogram":
                fam.add(HistogramValue(bounds, tuple(int(v) for v in values[:-1]), values[-1]), *label_values)
            else:
                fam.add(values[0], *label_values)
        out = list(fams.values())
        states = Family("outrider_hook_processes")
        for state in ("running", "stalled", "unresponsive"):
            states.add(sum(1 for p in processes if p.state == state), state)
        out.append(states)
        last_step = Family("outrider_train_last_step_timestamp_seconds")
        stalled = Family("outrider_hook_stalled")
        heartbeat = Family("outrider_hook_last_heartbeat_timestamp_seconds")
        by_rank: dict[str, list[ProcessState]] = {}
        for p in processes:
            by_rank.setdefault(str(p.meta.get("rank", "")), []).append(p)
        for rank, procs in sorted(by_rank.items()):
            steps = [p.header.last_step_ns for p in procs if p.header.last_step_ns]
            if steps:
                last_step.add(max(steps) / 1e9, rank)
            stalled.add(1 if any(p.state in ("stalled", "unresponsive") for p in procs) else 0, rank)
        for p in processes:
            heartbeat.add(p.header.heartbeat_ns / 1e9, str(p.meta.get("rank", "")), str(p.header.pid))
        errors = Family("outrider_hook_shard_errors_total")
        for reason, n in sorted(self.shard_errors.items()):
            errors.add(n, reason)
        out.extend([last_step, stalled, heartbeat, errors])
        return out

    def stack_dumps(self) -> list[tuple[int, str, str]]:
        """(pid, rank, path) of the stack dumps of processes now stalled: what a page about a stall carries."""
        return [(p.header.pid, str(p.meta.get("rank", "")), p.stack_file) for p in self.processes
                if p.stack_file and p.state != "running"]

    def close(self) -> None:
        for _, mm in self._maps.values():
            mm.close()
        self._maps.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _accumulate(into: dict[SeriesKey, list[float]], key: SeriesKey, values: list[float]) -> None:
    have = into.get(key)
    if have is None:
        into[key] = list(values)
    elif len(have) == len(values):
        for i, v in enumerate(values):
            have[i] += v
