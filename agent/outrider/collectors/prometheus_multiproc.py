"""A service's own prometheus_client metrics, read from its multiprocess directory (PROMETHEUS_MULTIPROC_DIR).

Services under gunicorn or uvicorn workers that already use prometheus_client in multiprocess mode write every
worker's values to `<type>_<pid>.db` files there; this collector merges them the way prometheus_client's
MultiProcessCollector does, so the service's metrics reach the agent's /metrics and OTLP without a code change and
without a second endpoint. The files are read, never trusted and never written: each is opened without following
links, read to a bounded size and closed (no descriptor is kept), and each entry is checked on its own; a bad file
or entry costs that file or entry, counted in outrider_collector_errors_total.

The layout read (prometheus_client's mmap_dict): a 4-byte count of used bytes, 4 bytes of padding, then entries of
a 4-byte key length, the key (UTF-8 JSON `[family, sample name, {label: value}, help]`, or the older
`[family, sample name, [label names], [label values], help]`) padded so that the value that follows sits on 8 bytes,
and two doubles: the value and a timestamp.

Merging: counters and histograms are summed over every file (a dead worker's counts still count); gauges follow
the mode in the file name: `all` and `liveall` one series per pid (live pids only for liveall), `sum`/`livesum`,
`min`/`max` and `mostrecent`/`livemostrecent` one series (the `live` ones over live pids only). Summaries carry no
quantiles in multiprocess mode and are left out. Names the agent owns (`outrider_*`, the catalog's) are refused,
and the hook's caps apply (metrics/foreign.py): hook_max_series_per_metric series per metric, MAX_SERIES in all.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections.abc import Iterator

from outrider.collectors.base import Collector, CollectorContext
from outrider.metrics.family import Family
from outrider.metrics.foreign import ForeignDefinitions, ForeignMetric

MAX_FILE_BYTES = 64 << 20  # a prometheus_client file starts at 64 KiB and doubles as it fills
MAX_FILES = 10_000  # per sweep: a directory of dead workers' files is read no further than this
GAUGE_MODES = ("all", "liveall", "min", "max", "sum", "livesum", "mostrecent", "livemostrecent")
_INT = struct.Struct("<i")
_TWO_DOUBLES = struct.Struct("<dd")


def read_entries(data: bytes) -> Iterator[tuple[str, float, float]]:
    """(key, value, timestamp) of each entry of one file's bytes; ValueError at the first malformed entry."""
    if len(data) < 8:
        raise ValueError("shorter than its header")
    used = _INT.unpack_from(data, 0)[0]
    if not 8 <= used <= len(data):
        raise ValueError(f"used size {used} outside the file's {len(data)} bytes")
    pos = 8
    while pos < used:
        if pos + 4 > used:
            raise ValueError("an entry's length runs past the used size")
        length = _INT.unpack_from(data, pos)[0]
        start = pos + 4
        value_at = start + length + (8 - (length + 4) % 8)
        if length <= 0 or value_at + 16 > used:
            raise ValueError("an entry runs past the used size")
        key = data[start:start + length].decode("utf-8")
        value, stamp = _TWO_DOUBLES.unpack_from(data, value_at)
        yield key, value, stamp
        pos = value_at + 16


def _read_file(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than {MAX_FILE_BYTES}")
        return os.pread(fd, st.st_size, 0)
    finally:
        os.close(fd)


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
        metrics: dict[str, ForeignMetric] = {}
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
            if mode.startswith("live") and not alive.setdefault(pid, self._alive(pid)):
                continue  # a dead worker's live gauge (prometheus_client's mark_process_dead would remove it)
            try:
                data = _read_file(os.path.join(self._dir, filename))
                for key, value, stamp in read_entries(data):
                    self._take(metrics, typ, mode, pid, key, value, stamp)
            except (OSError, ValueError, UnicodeDecodeError) as e:
                self.drop(f"file:{filename}", f"{filename}: {e}")
        return self._defs.families(metrics, self._per_metric, self.drop)

    def _take(self, metrics: dict[str, ForeignMetric], typ: str, mode: str, pid: int, key: str, value: float,
              stamp: float) -> None:
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
        except (ValueError, TypeError, KeyError, AttributeError):
            self.drop("key", f"an entry whose key is not prometheus_client's: {key[:80]!r}")
            return
        if len(label_names) != len(label_values) or not math.isfinite(value):
            self.drop("entry", f"{family}: labels and values differ, or the value is not finite")
            return
        if typ == "histogram":
            names = tuple(n for n in label_names if n != "le")
        else:
            names = label_names + (("pid",) if typ == "gauge" and mode in ("all", "liveall") else ())
        m = metrics.get(family)
        if m is None:
            m = metrics[family] = ForeignMetric(typ, str(help_text), names)
        if m.kind != typ or m.label_names != names:
            self.drop("shape", f"{family}: published with two types or label sets; the first is kept")
            return
        if typ == "counter":
            if sample == f"{family}_total" or sample == family:
                m.values[label_values] = m.values.get(label_values, 0.0) + value
        elif typ == "histogram":
            values = tuple(v for n, v in zip(label_names, label_values, strict=True) if n != "le")
            if sample == f"{family}_bucket":
                le = dict(zip(label_names, label_values, strict=True)).get("le", "")
                try:
                    bound = float(le)
                except ValueError:
                    self.drop("entry", f"{family}: bucket bound {le!r}")
                    return
                buckets = m.buckets.setdefault(values, {})
                buckets[bound] = buckets.get(bound, 0.0) + value
            elif sample == f"{family}_sum":
                m.sums[values] = m.sums.get(values, 0.0) + value
        else:
            self._gauge(m, mode, pid, label_values, value, stamp)

    @staticmethod
    def _gauge(m: ForeignMetric, mode: str, pid: int, labels: tuple[str, ...], value: float, stamp: float) -> None:
        if mode in ("all", "liveall"):
            m.values[(*labels, str(pid))] = value
        elif mode in ("sum", "livesum"):
            m.values[labels] = m.values.get(labels, 0.0) + value
        elif mode == "min":
            m.values[labels] = min(m.values.get(labels, value), value)
        elif mode == "max":
            m.values[labels] = max(m.values.get(labels, value), value)
        elif stamp >= m.stamps.get(labels, -math.inf):  # mostrecent, livemostrecent
            m.values[labels], m.stamps[labels] = value, stamp
