"""Rates of cumulative counters over a stated window: what `outrider run` records per sweep (steps/s, samples/s,
tokens/s, requests/s, the share of the loop waiting for data), what `outrider top` shows, and what the demo's live
line prints.

A counter moves only when its source publishes it. The hook writes each process's cumulative values into its shard
every flush interval (1 s), stamped with the time it wrote them: the shard's heartbeat, which the agent exports as
`outrider_hook_last_heartbeat_timestamp_seconds{training_job, rank, pid}`, and which moves at every flush whether
or not anything was counted. The agent reads the shards every sweep (interval_s), and /metrics shows the latest
sweep. Timed by the reader, a counter's growth between two reads is off by as much as a flush interval (at a sweep
every 5 s, up to 20%), and two reads between the same two flushes see no growth of a running job.

So a rate here is **a counter's growth between two publications, over the time between them by the publisher's own
clock** (the heartbeats): exact, whatever the reads' timing. The window is the time between the publications seen
by the last two reads that saw one: for the run record, one sweep (interval_s); for `outrider top`, one sweep of the
agent it reads. A job that stops reads exactly 0 from the first window that begins after its last count, at most one
sweep after the sweep that first saw it stop: its processes keep publishing, and the counter does not move. A read
that saw no new publication changes nothing (a sweep between two flushes cannot tell that nothing happened).

Series are summed per training job and rank (the hook collector's merge: a rank's processes, a service's workers);
each such group's rate is its growth over its own window, and a counter's rate is the sum over the groups. A group
of several processes is timed by the mean of their heartbeats' advances, over a window in which each of them
published (exact for one process, as a training rank, and for processes counting at the same rate, as a service's
workers); a process that stops publishing (hung, stopped) is left out of its group's timing within two windows,
and a group none of whose processes has published for two windows reads 0 over the time since the last publication.
A process that ends leaves its last values (collectors/hook.py keeps them) and no heartbeat: the
series of a group without one, and those of every metric the agent reads itself (/proc), are timed by the read.

Totals are running sums of what each read added (a sum that goes down, a process gone with its series, adds
nothing; a series first seen after the first read adds all it holds: it began since), so a rate is never negative;
before a group has two publications it has no rate (None: not measured yet, never 0).
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

from outrider.metrics.catalog import CATALOG
from outrider.metrics.family import Family

HEARTBEAT = "outrider_hook_last_heartbeat_timestamp_seconds"
KEEP = 512  # reads kept
BY_READ = ""  # the one "process" of a group timed by the reads themselves (no heartbeat)
# A group's window is extended until each of its processes published in it (sweeps faster than the flushes), but
# never past this many times the shortest window: a process that stopped publishing leaves the group's timing
LONGEST = 2.0

# (training_job, rank): the processes whose series the hook collector sums; None: what the agent reads itself
Group = tuple[str, str] | None
Sample = tuple[str, Mapping[str, str], float]  # (metric, labels, value)
# What a history counts: its name for a counter -> (metric, the labels a series must have to be part of it)
Counters = Mapping[str, tuple[str, Mapping[str, str]]]


def group_of(labels: Mapping[str, str]) -> tuple[str, str]:
    return labels.get("training_job", ""), labels.get("rank", "")


def family_samples(families: Iterable[Family], metrics: Collection[str]) -> Iterator[Sample]:
    """A sweep's scalar samples of `metrics`, each with its labels by name."""
    for f in families:
        if f.defn.name not in metrics:
            continue
        names = f.defn.label_names
        for values, v in f.samples:
            if isinstance(v, float | int):
                yield f.defn.name, dict(zip(names, values)), float(v)


@dataclass(frozen=True)
class _Read:
    t: float  # the reader's clock
    totals: dict[tuple[str, Group], float]  # (counter, group) -> running total of what reads added
    stamps: dict[Group, dict[str, float]]  # group -> process (pid; BY_READ) -> when it last published


@dataclass(frozen=True)
class Window:
    """A group's rate window: the reads at its two ends and its length by the publishers' clock."""

    start: int
    end: int
    seconds: float


class CounterHistory:
    """Reads of the counters `counters` names (a sweep, a read of /metrics), each with when each of their
    publishers published what the read saw."""

    def __init__(self, counters: Counters, keep: int = KEEP) -> None:
        self._by_metric: dict[str, list[tuple[str, Mapping[str, str]]]] = {}
        for key, (metric, want) in counters.items():
            self._by_metric.setdefault(metric, []).append((key, want))
        self.metrics = frozenset({*self._by_metric, HEARTBEAT})  # what a read needs of a sweep
        self._reads: collections.deque[_Read] = collections.deque(maxlen=keep)
        self._raw: dict[tuple[str, Group], float] = {}
        self._totals: dict[tuple[str, Group], float] = {}

    def add(self, t: float, samples: Iterable[Sample]) -> None:
        """One read at time t (seconds on the reader's monotonic clock): the counters' series and the hook's
        heartbeats among `samples`."""
        values: dict[tuple[str, Group], float] = {}
        stamps: dict[Group, dict[str, float]] = {}
        for metric, labels, v in samples:
            if metric == HEARTBEAT:
                if math.isfinite(v):
                    stamps.setdefault(group_of(labels), {})[labels.get("pid", "")] = v
                continue
            for key, want in self._by_metric.get(metric, ()):
                if all(labels.get(k) == x for k, x in want.items()):
                    g = group_of(labels) if _published_by_hook(metric) else None
                    values[(key, g)] = values.get((key, g), 0.0) + v
        first_read = not self._reads
        for at, value in values.items():
            last = self._raw.get(at)
            if last is None:
                # Seen at the history's first read: what it held before is not this history's to count (a job that
                # ran before `outrider top` started, a process older than the run). Seen first later: it began
                # since (a process the run started), and all it counted is this history's.
                self._totals[at] = 0.0 if first_read else max(0.0, value)
            elif value > last:
                self._totals[at] += value - last
            self._raw[at] = value
        for (_, g) in values:
            if g not in stamps:
                stamps[g] = {BY_READ: t}  # read by the agent itself, or no process publishes it any more
        self._reads.append(_Read(t, dict(self._totals), stamps))

    def __len__(self) -> int:
        return len(self._reads)

    def total(self, key: str) -> float:
        return sum(v for (k, _), v in self._totals.items() if k == key)

    def published(self, key: str) -> bool:
        """Whether any read had a series of `key`."""
        return any(k == key for k, _ in self._totals)

    def rate(self, key: str) -> float | None:
        """Growth per second of `key`, each group over its window; None before any group has one."""
        rates = [grown / w.seconds for grown, w in self._grown(key)]
        return sum(rates) if rates else None

    def ratio(self, part: str, whole: str) -> float | None:
        """Growth of `part` over growth of `whole`, on the windows of `whole` (the share of the loop's time waiting
        for data: both move at the same publications); None while `whole` did not grow in them."""
        windows = {g: w for g, w in ((g, self._window(g)) for g in self._groups(whole)) if w is not None}
        grown = sum(self._growth(whole, g, w) for g, w in windows.items())
        return sum(self._growth(part, g, w) for g, w in windows.items()) / grown if grown > 0 else None

    def window(self, key: str) -> tuple[float, float] | None:
        """The reader's times of the reads that open and close the windows of `key` (the earliest opening among
        its groups); None before any group has one."""
        windows = [w for _, w in self._grown(key)]
        if not windows:
            return None
        return self._reads[min(w.start for w in windows)].t, self._reads[-1].t

    def seconds(self, key: str) -> float | None:
        """The length of the window of `key` by its publishers' clock (the longest among its groups): what a
        screen says its rates are over."""
        windows = [w.seconds for _, w in self._grown(key)]
        return max(windows) if windows else None

    def _groups(self, key: str) -> list[Group]:
        return [g for (k, g) in self._totals if k == key]

    def _grown(self, key: str) -> list[tuple[float, Window]]:
        out = []
        for g in self._groups(key):
            w = self._window(g)
            if w is not None:
                out.append((self._growth(key, g, w), w))
        return out

    def _growth(self, key: str, g: Group, w: Window) -> float:
        return self._reads[w.end].totals.get((key, g), 0.0) - self._reads[w.start].totals.get((key, g), 0.0)

    def _window(self, g: Group) -> Window | None:
        """From the latest earlier read since which each of the group's live processes published, to the latest
        read; timed by the mean of their heartbeats' advances. Live: those present at both ends that published
        within LONGEST times the shortest window (a process that stopped publishing drops out). A group that has
        published nothing for LONGEST times its window (a stopped process) has grown by nothing since its last
        publication: that span, on the reader's clock, is its window."""
        reads = self._reads
        end_at = len(reads) - 1
        end = reads[end_at].stamps.get(g, {}) if reads else {}
        found: list[tuple[int, float, int]] = []  # (start read, seconds, processes that published since)
        for j in range(end_at - 1, -1, -1):
            start = reads[j].stamps.get(g, {})
            if BY_READ in end and BY_READ not in start:  # its processes stopped publishing since: timed by the reads
                start = {BY_READ: reads[j].t}
            both = [p for p in end if p in start]
            advanced = [end[p] - start[p] for p in both if end[p] > start[p]]
            if not advanced:
                continue
            if found and max(advanced) > LONGEST * found[0][1]:
                break
            found.append((j, sum(advanced) / len(advanced), len(advanced)))
            if len(advanced) == len(both):
                break
        if not found:
            return None
        live = found[-1][2]  # the earliest start: every process that still publishes published since
        start_at, seconds = next((j, s) for j, s, n in found if n == live)
        seen = next(i for i in range(start_at + 1, end_at + 1) if reads[i].stamps.get(g) == end)
        silent = reads[end_at].t - reads[seen].t
        return Window(seen, end_at, silent) if silent > LONGEST * seconds else Window(start_at, end_at, seconds)


def _published_by_hook(metric: str) -> bool:
    defn = CATALOG.get(metric)
    return defn is not None and defn.collector == "hook"


def intervals(points: Iterable[tuple[float, float]], whole: Iterable[tuple[float, float]] | None = None,
              warmup_fraction: float = 0.1) -> list[tuple[float, float]]:
    """Consecutive (growth of the counter, seconds) over a recorded run (points: (time, running total) per sweep),
    each from one update of the counter to the next, between its first and last update with the first
    `warmup_fraction` of that span dropped: the samples a comparison of rates resamples. Their sums' ratio is the
    rate over the span, exactly; one interval alone may be off by the reads' lag behind a publication, which only
    widens the comparison's interval. With `whole`, (growth of the counter, growth of `whole`) on the updates of
    `whole`: shares such as the loop's data wait."""
    part = dict(points)
    base = sorted(dict(whole).items()) if whole is not None else sorted(part.items())
    changes = [t for (_, prev), (t, v) in itertools.pairwise(base) if v > prev]
    if len(changes) < 2:
        return []
    values = dict(base)
    begin = changes[0] + warmup_fraction * (changes[-1] - changes[0])
    kept = [t for t in changes if t >= begin]
    return [(part.get(t1, 0.0) - part.get(t0, 0.0), values[t1] - values[t0] if whole is not None else t1 - t0)
            for t0, t1 in itertools.pairwise(kept)]
