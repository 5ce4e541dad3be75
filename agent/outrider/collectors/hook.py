"""Hook collector: merges the per-process shards in the spool directory into metrics.

Series of all processes are summed per metric, labels, training job and rank (so gunicorn workers or forked
helpers add up, and DDP ranks stay apart). Values in shards are cumulative; when a process is gone (its shard
marked closed, or its pid gone and its heartbeat stale), its last counter and histogram values are kept as
"retired" totals, its shard is deleted, and merged counters never go backwards while the agent lives. Retired
series that no live process shares expire after RETIRED_TTL_S, and at most MAX_RETIRED of them are held.

Shards are read through outrider.spool, which trusts nothing in them: a shard that is unreadable (truncated,
corrupt, newer format, owned by a uid this agent does not trust) is skipped and counted; a bad series in a good
shard is dropped alone and counted. Neither ever fails the collector.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from outrider import spool
from outrider.collectors.base import Collector, CollectorContext, StackDump
from outrider.metrics.catalog import CATALOG, Label, MetricDef
from outrider.metrics.family import Family, HistogramValue

# name, kind, labels (+training_job, rank), bounds
SeriesKey = tuple[str, str, tuple[tuple[str, str], ...], tuple[float, ...]]
RETIRED_TTL_S = 900.0
MAX_RETIRED = 10_000
TRUST_TTL_S = 30.0
MAX_ANCESTRY = 64


@dataclass
class ProcessState:
    path: str
    meta: dict[str, object]
    header: spool.ShardHeader
    state: str  # running, stalled, unresponsive, exited
    uid: int

    @property
    def rank(self) -> str:
        return _label_text(self.meta.get("rank", ""))

    @property
    def training_job(self) -> str:
        return _label_text(self.meta.get("training_job", ""))


@dataclass
class Retired:
    values: list[float]
    at: float  # monotonic time it was last retired into


class HookCollector(Collector):
    name = "hook"
    description = "metrics the in-process hook publishes (steps, data wait, latency, allocator) from the spool"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        config = ctx.config
        self.spool = config.spool_dir or spool.default_dir()
        self._explicit = bool(config.spool_dir)
        self._trusted_uids = frozenset(config.spool_trusted_uids) | {os.geteuid()}
        self.reader = spool.ShardReader(self.spool, self._trusted)
        self._retired: dict[SeriesKey, Retired] = {}
        self._dynamic: dict[str, MetricDef] = {}
        self.shard_errors: dict[str, int] = {}
        self.processes: list[ProcessState] = []
        self._heartbeats: dict[str, tuple[int, float]] = {}  # path -> (heartbeat, monotonic time it changed)
        self._trust: dict[tuple[int, int], tuple[bool, float]] = {}  # (uid, pid) -> (verdict, when checked)
        self._lock_fd: int | None = None
        if ctx.hold_spool_lock:
            try:
                spool.prepare_dir(self.spool, private=not self._explicit, trusted_uids=self._trusted_uids)
                self._lock_fd = spool.try_lock(self.spool)
            except OSError as e:
                self.drop("spool", e)

    # --- trust -----------------------------------------------------------------------------------------------
    def _trusted(self, uid: int, pid: int) -> bool:
        """A shard is read when its owner is this agent's user or a configured uid, or the uid of the live
        process it claims to be, when that process is one this agent watches."""
        if uid in self._trusted_uids:
            return True
        now = time.monotonic()
        hit = self._trust.get((uid, pid))
        if hit is not None and now - hit[1] < TRUST_TTL_S:
            return hit[0]
        ok = self._process_uid(pid) == uid and self._watched(pid)
        if len(self._trust) > 4096:
            self._trust.clear()
        self._trust[(uid, pid)] = (ok, now)
        return ok

    def _process_uid(self, pid: int) -> int | None:
        try:
            with open(f"{self.ctx.config.proc_root}/{pid}/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Uid:"):
                        return int(line.split()[2])  # the effective uid, the one a new file gets
        except (OSError, ValueError, IndexError):
            return None
        return None

    def _watched(self, pid: int) -> bool:
        roots = self.ctx.roots
        if not roots:
            return True  # this agent watches every process it can see
        for _ in range(MAX_ANCESTRY):
            if pid in roots:
                return True
            try:
                with open(f"{self.ctx.config.proc_root}/{pid}/stat", "rb") as fh:
                    text = fh.read()
                pid = int(text[text.rindex(b")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                return False
            if pid <= 1:
                return pid in roots
        return False

    def _count(self, reason: str, what: str, error: BaseException | str) -> None:
        self.shard_errors[reason] = self.shard_errors.get(reason, 0) + 1
        self.drop(f"{reason} {what}", error)

    # --- merging ---------------------------------------------------------------------------------------------
    def _usable(self) -> bool:
        """Whether the spool passes the safety checks now; an unsafe one is not read at all (said once)."""
        try:
            spool.check_dir(self.spool, private=not self._explicit, trusted_uids=self._trusted_uids)
        except FileNotFoundError:
            return False
        except OSError as e:
            self._count("spool_unsafe", "spool", e)
            return False
        return True

    def collect(self) -> list[Family]:
        merged: dict[SeriesKey, list[float]] = {}
        processes: list[ProcessState] = []
        for path in self.reader.paths() if self._usable() else ():
            name = os.path.basename(path)
            try:
                snap = self.reader.read(path)
            except spool.ShardFormatError as e:
                self._count(e.reason, f"shard {name}", e)
                continue
            except OSError as e:
                self._count("unreadable", f"shard {name}", e)
                continue
            if snap is None:
                continue
            for why in snap.rejected:
                self._count("invalid_series", f"series in {name}", why)
            proc = ProcessState(path, snap.meta, snap.header, self._state(path, snap.header), snap.uid)
            extra = (("training_job", proc.training_job), ("rank", proc.rank))
            entries = {(n, kind, (*sorted(labels.items()), *extra), bounds): values
                       for n, kind, labels, values, bounds in snap.series}
            if proc.state == "exited":
                self._retire(entries)
                self._remove(path)
                continue
            processes.append(proc)
            for key, values in entries.items():
                _accumulate(merged, key, values)
        self._expire_retired(merged)
        for key, retired in self._retired.items():
            _accumulate(merged, key, retired.values)
        self.processes = processes
        self.ctx.stalled_stacks[:] = self._stalled_stacks(processes)
        return self._families(merged, processes)

    def _state(self, path: str, h: spool.ShardHeader) -> str:
        if h.flags & spool.FLAG_CLOSED:
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
        if h.flags & spool.FLAG_STALLED:
            return "stalled"
        return "running"

    def _retire(self, entries: dict[SeriesKey, list[float]]) -> None:
        now = time.monotonic()
        for key, values in entries.items():
            if key[1] not in ("counter", "histogram"):  # a gone process's gauges go with it
                continue
            have = self._retired.get(key)
            if have is None:
                self._retired[key] = Retired(list(values), now)
            elif len(have.values) == len(values):
                have.values = [a + b for a, b in zip(have.values, values)]
                have.at = now

    def _expire_retired(self, live: dict[SeriesKey, list[float]]) -> None:
        """Bounded memory: a retired series no live process shares goes after RETIRED_TTL_S (its final value has
        been scraped many times by then), the oldest first beyond MAX_RETIRED. One a live process shares stays,
        or the merged counter would go backwards."""
        now = time.monotonic()
        orphans = [(r.at, key) for key, r in self._retired.items() if key not in live]
        expired = {key for at, key in orphans if now - at > RETIRED_TTL_S}
        excess = len(self._retired) - len(expired) - MAX_RETIRED
        if excess > 0:
            expired.update(key for _, key in sorted(k for k in orphans if k[1] not in expired)[:excess])
        for key in expired:
            del self._retired[key]

    def _remove(self, path: str) -> None:
        self._heartbeats.pop(path, None)
        try:
            self.reader.remove(path)
        except OSError as e:  # e.g. a sticky shared spool where the shard is not ours to delete
            self.drop("cleanup", e)

    def _stalled_stacks(self, processes: list[ProcessState]) -> list[StackDump]:
        out: list[StackDump] = []
        for p in processes:
            if p.state == "running":
                continue
            text = self.reader.read_stacks(p.path, p.uid)
            if text:
                out.append((p.header.pid, p.rank, spool.stacks_path(p.path), text))
        return out

    # --- families --------------------------------------------------------------------------------------------
    def _defn(self, name: str, kind: str, label_names: tuple[str, ...]) -> MetricDef | None:
        defn = CATALOG.get(name)
        if defn is not None:
            return defn if defn.type == kind and set(defn.label_names) == set(label_names) else None
        hit = self._dynamic.get(name)
        if hit is None:
            if len(self._dynamic) >= 10_000:
                return None
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
                self._count("invalid_series", f"series {name}", "kind or label names differ from the metric's "
                                                                "definition")
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
        started = Family("outrider_train_start_timestamp_seconds")
        stalled = Family("outrider_hook_stalled")
        heartbeat = Family("outrider_hook_last_heartbeat_timestamp_seconds")
        by_rank: dict[tuple[str, str], list[ProcessState]] = {}
        for p in processes:
            by_rank.setdefault((p.rank, p.training_job), []).append(p)
        for (rank, job), procs in sorted(by_rank.items()):
            steps = [p.header.last_step_ns for p in procs if p.header.last_step_ns]
            if steps:
                last_step.add(max(steps) / 1e9, rank, job)
            started.add(min(p.header.start_ns for p in procs) / 1e9, rank, job)
            stalled.add(1 if any(p.state in ("stalled", "unresponsive") for p in procs) else 0, rank, job)
        for p in processes:
            heartbeat.add(p.header.heartbeat_ns / 1e9, p.rank, p.training_job, str(p.header.pid))
        errors = Family("outrider_hook_shard_errors_total")
        for reason, n in sorted(self.shard_errors.items()):
            errors.add(n, reason)
        retired = Family("outrider_hook_retired_series").add(len(self._retired))
        out.extend([last_step, started, stalled, heartbeat, errors, retired])
        return out

    def close(self) -> None:
        self.reader.close()
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None


def _label_text(value: object) -> str:
    """A label value from a shard's meta: text, at most 128 characters, valid UTF-8 (else replaced)."""
    text = value if isinstance(value, str) else str(value)
    return text[: spool.MAX_LABEL_VALUE].encode("utf-8", "replace").decode("utf-8")


def _accumulate(into: dict[SeriesKey, list[float]], key: SeriesKey, values: list[float]) -> None:
    have = into.get(key)
    if have is None:
        into[key] = list(values)
    elif len(have) == len(values):
        for i, v in enumerate(values):
            have[i] += v
