"""A service's own prometheus_client metrics, read from its multiprocess directory (PROMETHEUS_MULTIPROC_DIR).

Services under gunicorn or uvicorn workers that already use prometheus_client in multiprocess mode write every
worker's values to `<type>_<pid>.db` files there; this collector merges them the way prometheus_client's
MultiProcessCollector does, so the service's metrics reach the agent's /metrics and OTLP without a code change and
without a second endpoint. The files are read, never trusted and never written: each is opened without following
links, read READ_CHUNK bytes at a time (a file may be 64 MiB: it is never held whole) and closed (no descriptor is
kept), and each entry is checked on its own; a bad file or entry costs that file or entry, counted in
outrider_collector_errors_total.

The layout read (prometheus_client's mmap_dict): a 4-byte count of used bytes, 4 bytes of padding, then entries of
a 4-byte key length, the key (UTF-8 JSON `[family, sample name, {label: value}, help]`, or the older
`[family, sample name, [label names], [label values], help]`) padded so that the value that follows sits on 8 bytes,
and two doubles: the value and a timestamp.

Merging: counters and histograms are summed over every file (a dead worker's counts still count); gauges follow
the mode in the file name: `all` and `liveall` one series per pid (live pids only for liveall), `sum`/`livesum`,
`min`/`max` and `mostrecent`/`livemostrecent` one series (the `live` ones over live pids only). Summaries carry no
quantiles in multiprocess mode and are left out. Names the agent owns (`outrider_*`, the catalog's) are refused,
and the hook's caps apply while the files are read (`_Merged`): hook_max_series_per_metric series per metric and
MAX_SERIES in all are ever held, the first met in file and entry order; a series past them is dropped as it is met.
A file of 300,000 label values (64 MiB) took the agent from 23 MiB to a peak of 186 MiB when every series was
held before the caps were applied; the chart's limit is 128 MiB.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections.abc import Callable, Iterator

from outrider.collectors.base import Collector, CollectorContext
from outrider.metrics.family import Family
from outrider.metrics.foreign import MAX_SERIES, Drop, ForeignDefinitions, ForeignMetric

MAX_FILE_BYTES = 64 << 20  # a prometheus_client file starts at 64 KiB and doubles as it fills
READ_CHUNK = 1 << 20  # a file is read this much at a time
MAX_KEY_BYTES = 64 << 10  # an entry's key (its family, sample and labels as JSON) is a few hundred bytes
MAX_FILES = 10_000  # per sweep: a directory of dead workers' files is read no further than this
GAUGE_MODES = ("all", "liveall", "min", "max", "sum", "livesum", "mostrecent", "livemostrecent")
_INT = struct.Struct("<i")
_TWO_DOUBLES = struct.Struct("<dd")


def read_entries(data: bytes) -> Iterator[tuple[str, float, float]]:
    """(key, value, timestamp) of each entry of one file's bytes; ValueError at the first malformed entry."""
    return _entries(lambda at, n: data[at:at + n], len(data))


def read_file(path: str) -> Iterator[tuple[str, float, float]]:
    """The entries of the file at path, read READ_CHUNK bytes at a time, opened without following a link and closed
    when the iteration ends; OSError or ValueError when it cannot be read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than {MAX_FILE_BYTES}")
        yield from _entries(lambda at, n: os.pread(fd, n, at), st.st_size)
    finally:
        os.close(fd)


def _entries(read: Callable[[int, int], bytes], size: int) -> Iterator[tuple[str, float, float]]:
    """The entries of a file of `size` bytes, through read(offset, n): a window of READ_CHUNK bytes is kept and
    moved on when an entry runs past it."""
    head = read(0, 8)
    if len(head) < 8:
        raise ValueError("shorter than its header")
    used = _INT.unpack_from(head, 0)[0]
    if not 8 <= used <= size:
        raise ValueError(f"used size {used} outside the file's {size} bytes")
    window, start = b"", 0  # the bytes of the file from `start`

    def view(at: int, n: int) -> bytes:
        nonlocal window, start
        if at < start or at + n > start + len(window):
            window, start = read(at, max(n, READ_CHUNK)), at
            if len(window) < n:
                raise ValueError("the file ends before its used size (cut short while read)")
        return window[at - start:at - start + n]

    pos = 8
    while pos < used:
        if pos + 4 > used:
            raise ValueError("an entry's length runs past the used size")
        length = _INT.unpack_from(view(pos, 4), 0)[0]
        value_at = pos + 4 + length + (8 - (length + 4) % 8)
        if length <= 0 or value_at + 16 > used:
            raise ValueError("an entry runs past the used size")
        if length > MAX_KEY_BYTES:
            raise ValueError(f"an entry's key of {length} bytes, more than {MAX_KEY_BYTES}")
        key = view(pos + 4, length).decode("utf-8")
        value, stamp = _TWO_DOUBLES.unpack_from(view(value_at, 16), 0)
        yield key, value, stamp
        pos = value_at + 16


def _kind_of(filename: str) -> tuple[str, str, int] | None:
    """(type, gauge mode, pid) from `counter_123.db`, `gauge_livesum_123.db`, ...; None for other files."""
    if not filename.endswith(".db"):
        return None
    parts = filename[:-3].split("_")
    if len(parts) < 2 or not parts[-1].isdigit():
        return None
    kind, pid = parts[0], int(parts[-1])
    if kind == "gauge":
        mode = "_".join(parts[1:-1])
        return ("gauge", mode, pid) if mode in GAUGE_MODES else None
    return (kind, "", pid) if kind in ("counter", "histogram", "summary") and len(parts) == 2 else None


class PrometheusMultiprocCollector(Collector):
    name = "prometheus_multiproc"
    description = "a service's own prometheus_client metrics from its multiprocess directory"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self._dir = ctx.config.prometheus_multiproc_dir
        self._proc = ctx.config.proc_root
        self._per_metric = ctx.config.hook_max_series_per_metric
        self._defs = ForeignDefinitions(self.name, "A metric of the service's own prometheus_client instrumentation.")

    def _alive(self, pid: int) -> bool:
        return os.path.exists(f"{self._proc}/{pid}")

    def collect(self) -> list[Family]:
        if not self._dir:
            return []
        try:
            names = sorted(os.listdir(self._dir))
        except OSError as e:
            self.drop("directory", f"{self._dir}: {e.strerror or e}")
            return []
        merged = _Merged(self._per_metric)
        alive: dict[int, bool] = {}
        files = 0
        for filename in names:
            kind = _kind_of(filename)
            if kind is None:
                continue
            files += 1
            if files > MAX_FILES:
                self.drop("too_many_files", f"{self._dir} holds more than {MAX_FILES} files; the rest are left out")
                break
            typ, mode, pid = kind
            if typ == "summary":
                self.drop("summary", f"{filename}: summaries carry no quantiles in multiprocess mode; left out")
                continue
            if mode.startswith("live"):
                if pid not in alive:  # asked once a sweep for all of a pid's files
                    alive[pid] = self._alive(pid)
                if not alive[pid]:
                    continue  # a dead worker's live gauge (prometheus_client's mark_process_dead would remove it)
            try:
                for key, value, stamp in read_file(os.path.join(self._dir, filename)):
                    self._take(merged, typ, mode, pid, key, value, stamp)
            except (OSError, ValueError, UnicodeDecodeError) as e:
                self.drop(f"file:{filename}", f"{filename}: {e}")
        return self._defs.families(merged.metrics, self._per_metric, self.drop)

    def _take(self, merged: _Merged, typ: str, mode: str, pid: int, key: str, value: float, stamp: float) -> None:
        """One entry into the merge: a series the caps leave no room for is dropped here, never held."""
        # a histogram's series is several entries (its sum and each bucket, each a key of its own): parsed, so that a
        # series held keeps every one of them
        if typ != "histogram" and merged.past_caps(key, self.drop):
            return
        try:
            parsed = json.loads(key)
            if len(parsed) == 4:  # [family, sample, {label: value}, help] (prometheus_client >= 0.14)
                family, sample, labels, help_text = parsed
                label_names = tuple(str(n) for n in labels)
                label_values = tuple(str(labels[n]) for n in labels)
            else:  # [family, sample, [label names], [label values], help] (older)
                family, sample, names_raw, values_raw, help_text = parsed
                label_names = tuple(str(n) for n in names_raw)
                label_values = tuple(str(v) for v in values_raw)
            family, sample = str(family), str(sample)
        except (ValueError, TypeError, LookupError, AttributeError):  # LookupError: a label list indexed by its names
            self.drop("key", f"an entry whose key is not prometheus_client's: {key[:80]!r}")
            return
        if len(label_names) != len(label_values) or not math.isfinite(value):
            self.drop("entry", f"{family}: labels and values differ, or the value is not finite")
            return
        if (typ == "counter" and sample not in (f"{family}_total", family)) or \
                (typ == "histogram" and sample not in (f"{family}_bucket", f"{family}_sum")):
            return  # not a value merged (a _created, a _count prometheus_client derives itself)
        if typ == "histogram":
            names = tuple(n for n in label_names if n != "le")
            series = tuple(v for n, v in zip(label_names, label_values, strict=True) if n != "le")
        elif typ == "gauge" and mode in ("all", "liveall"):
            names, series = (*label_names, "pid"), (*label_values, str(pid))
        else:
            names, series = label_names, label_values
        m = merged.room(family, typ, names, series, str(help_text), self.drop)
        if m is None:
            return
        merged.accepted.add(hash(key))
        if typ == "counter":
            m.values[series] = m.values.get(series, 0.0) + value
        elif typ == "histogram":
            if sample == f"{family}_bucket":
                le = dict(zip(label_names, label_values, strict=True)).get("le", "")
                try:
                    bound = float(le)
                except ValueError:
                    self.drop("entry", f"{family}: bucket bound {le!r}")
                    return
                buckets = m.buckets.setdefault(series, {})
                buckets[bound] = buckets.get(bound, 0.0) + value
            else:
                m.sums[series] = m.sums.get(series, 0.0) + value
        else:
            self._gauge(m, mode, series, value, stamp)

    @staticmethod
    def _gauge(m: ForeignMetric, mode: str, series: tuple[str, ...], value: float, stamp: float) -> None:
        if mode in ("all", "liveall"):
            m.values[series] = value
        elif mode in ("sum", "livesum"):
            m.values[series] = m.values.get(series, 0.0) + value
        elif mode == "min":
            m.values[series] = min(m.values.get(series, value), value)
        elif mode == "max":
            m.values[series] = max(m.values.get(series, value), value)
        elif stamp >= m.stamps.get(series, -math.inf):  # mostrecent, livemostrecent
            m.values[series], m.stamps[series] = value, stamp


class _Merged:
    """One sweep's merge of every file, within the caps as it is read: at most `per_metric` series per metric and
    MAX_SERIES in all are ever held; a series past them is dropped as it is met, each cut said once and counted once
    a sweep.

    Once a metric's cap is reached, an entry of it whose key's text is not one already taken (its hash) is dropped
    without parsing its key: a file of 300,000 label values of one metric costs a read and a set lookup per entry
    (a sweep of it took 3 s parsing every key). A series kept from one file is found again in the next by the same
    key text, as prometheus_client writes it (sorted labels); one written otherwise (an older client's layout in one
    file and a newer one's in another) is left out of a metric at its cap. Histograms' entries are always parsed: one
    series is its sum and each of its buckets, keys of their own, and the series that reached the cap (its sum first,
    as prometheus_client writes it) would lose its buckets."""

    def __init__(self, per_metric: int) -> None:
        self.per_metric = per_metric
        self.metrics: dict[str, ForeignMetric] = {}
        self.per_family: dict[str, int] = {}  # series held of each
        self.series = 0  # held, all metrics together
        self.accepted: set[int] = set()  # hashes of the keys of entries taken, bounded by the caps
        self._cut: set[str] = set()  # metrics cut this sweep (said and counted once)

    def _full(self, family: str) -> bool:
        return self.series >= MAX_SERIES or self.per_family.get(family, 0) >= self.per_metric

    def _say_cut(self, family: str, drop: Drop) -> None:
        if family in self._cut:
            return
        self._cut.add(family)
        if self.series >= MAX_SERIES:
            drop("cap", f"past {MAX_SERIES} series in all: series of {family} and others are left out")
        else:
            drop(f"cap:{family}", f"{family}: past the cap of {self.per_metric} series per metric; the rest are "
                                  "left out")

    def past_caps(self, key: str, drop: Drop) -> bool:
        """Whether the entry of this key is of a metric at its cap and none of its series taken (told, not
        parsed): the metric's name is the key's first JSON string."""
        if not key.startswith('["'):
            return False
        end = key.find('"', 2)
        family = key[2:end]
        if end < 0 or "\\" in family or not self._full(family) or hash(key) in self.accepted:
            return False
        self._say_cut(family, drop)
        return True

    def room(self, family: str, kind: str, names: tuple[str, ...], series: tuple[str, ...], help_text: str,
             drop: Drop) -> ForeignMetric | None:
        """The metric to merge this series into; None when it has another shape, or when it is new and the caps
        leave no room for it."""
        m = self.metrics.get(family)
        if m is not None and (m.kind != kind or m.label_names != names):
            drop(f"shape:{family}", f"{family}: published with two types or label sets; the first is kept")
            return None
        if m is not None and (series in m.values or series in m.buckets or series in m.sums):
            return m
        if self._full(family):
            self._say_cut(family, drop)
            return None
        if m is None:
            m = self.metrics[family] = ForeignMetric(kind, help_text, names)
        self.per_family[family] = self.per_family.get(family, 0) + 1
        self.series += 1
        return m
