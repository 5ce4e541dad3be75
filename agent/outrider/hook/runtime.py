"""The hook's runtime: the series registry, the shard writer, and the publisher thread.

The publisher wakes every flush interval (1 s): it sums each series over threads, writes the process's shard
(heartbeat, step progress, values), runs the periodic samplers (PyTorch allocator stats, CUDA event timing),
checks for a stall, and, while no agent holds the spool's lock, runs one in this process (standalone mode).
Stdlib only, except what the standalone agent imports when it starts.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import fcntl
import json
import logging
import mmap
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from outrider.hook import shard
from outrider.hook.series import (
    DURATION_BOUNDS,
    SIZE_BOUNDS,
    Counter,
    Dropped,
    Gauge,
    Histogram,
    NoopSeries,
    Series,
)

LOG = logging.getLogger("outrider.hook")
NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
MAX_LABEL_VALUE = 128
LOCK_NAME = "agent.lock"
WRITER_RETRY_S = 30.0


def default_spool_dir() -> str:
    return os.environ.get("OUTRIDER_SPOOL_DIR") or f"/tmp/outrider-spool-{os.getuid()}"


def shard_stack_path(shard_path: str) -> str:
    return shard_path[: -len(".shard")] + ".stacks.txt"


def try_lock(spool_dir: str) -> int | None:
    """Take the spool's agent lock without blocking; the fd holds it. None: someone else holds it."""
    fd = os.open(os.path.join(spool_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


class ShardWriter:
    def __init__(self, spool_dir: str, pid: int, start_ns: int) -> None:
        os.makedirs(spool_dir, mode=0o700, exist_ok=True)
        self.path = os.path.join(spool_dir, f"outrider-{pid}-{start_ns}.shard")
        # Written under a temporary name and renamed after the first complete write: a reader never sees a
        # shard whose header is not there yet.
        self._pending: str | None = self.path + ".new"
        fd = os.open(self._pending, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, shard.SHARD_BYTES)
            self._mm = mmap.mmap(fd, shard.SHARD_BYTES)
        finally:
            os.close(fd)
        self._seq = 0
        self._directory = b""

    def write(self, directory: bytes, values: list[float], **header: int) -> None:
        if len(directory) > shard.DIRECTORY_BYTES or len(values) > shard.MAX_VALUES:
            raise ValueError("shard full")
        mm = self._mm
        self._seq += 1  # odd: writing
        mm[shard.SEQ_OFFSET:shard.SEQ_OFFSET + 8] = self._seq.to_bytes(8, "little")
        if directory != self._directory:
            mm[shard.HEADER_BYTES:shard.HEADER_BYTES + len(directory)] = directory
            self._directory = directory
        if values:
            mm[shard.DATA_OFFSET:shard.DATA_OFFSET + 8 * len(values)] = memoryview(
                _floats(values)).cast("B")
        shard.pack_header(mm, seq=self._seq, directory_len=len(directory), value_count=len(values), **header)
        self._seq += 1  # even: consistent
        mm[shard.SEQ_OFFSET:shard.SEQ_OFFSET + 8] = self._seq.to_bytes(8, "little")
        if self._pending is not None:
            os.rename(self._pending, self.path)
            self._pending = None

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self._mm.close()


def _floats(values: list[float]) -> Any:
    import array

    a = array.array("d", values)
    if sys.byteorder != "little":
        a.byteswap()
    return a


class Hook:
    """One per process (re-created in a forked child). Thread-safe registration; lock-free recording."""

    def __init__(self, spool_dir: str | None = None, flush_interval_s: float = 1.0,
                 max_series_per_metric: int = 100, max_series: int = 2000, stall_factor: float = 10.0,
                 stall_floor_s: float = 300.0, standalone: bool = True, listen: str | None = None) -> None:
        self.spool_dir = spool_dir or default_spool_dir()
        self.flush_interval_s = flush_interval_s
        self.max_series_per_metric = max_series_per_metric
        self.max_series = max_series
        self.stall_factor = stall_factor
        self.stall_floor_s = stall_floor_s
        self.standalone = standalone
        self.listen = listen
        self.drop = Dropped()
        self._warned: set[str] = set()
        self._lock = threading.Lock()  # registration and flushing only, never the hot path
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}
        self._label_names: dict[str, tuple[str, ...]] = {}
        self._per_metric: dict[str, int] = {}
        self.samplers: list[Callable[[], None]] = []
        self._reset_process_state()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._agent: Any = None
        self._lock_fd: int | None = None
        self.closed = False

    # --- identity --------------------------------------------------------------------------------------------
    def _reset_process_state(self) -> None:
        self.pid = os.getpid()
        self.start_ns = time.time_ns()
        self.rank = os.environ.get("RANK", "")
        self.local_rank = os.environ.get("LOCAL_RANK", "")
        self.world_size = os.environ.get("WORLD_SIZE", "")
        self._writer: ShardWriter | None = None
        self._writer_failed = False
        self._writer_retry_at = 0.0
        self.steps = 0
        self.last_step_perf = 0.0
        self.recent_steps: list[float] = [0.0] * 32
        self.stalled_since_ns = 0
        self.stalls = 0

    def meta(self) -> dict[str, Any]:
        return {"pid": self.pid, "rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
                "argv0": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python",
                "start_ns": self.start_ns}

    # --- registration ----------------------------------------------------------------------------------------
    def series(self, kind: str, name: str, labels: dict[str, str] | None = None,
               bounds: tuple[float, ...] = DURATION_BOUNDS, builtin: bool = False) -> Any:
        """The series for name and labels, created on first use. Bad names or labels, or a metric past its
        series cap, give a no-op series and a counted drop: user input never raises or grows without bound."""
        try:
            labels = labels or {}
            key = (name, tuple(sorted(labels.items())))
            hit = self._series.get(key)
            if hit is not None:
                return hit
            with self._lock:
                hit = self._series.get(key)
                if hit is not None:
                    return hit
                reason = self._refuse(name, labels, builtin)
                if reason:
                    self.drop(reason)
                    if reason not in self._warned:
                        self._warned.add(reason)
                        LOG.warning("outrider: metric %r with labels %r refused (%s); further refusals are only "
                                    "counted in outrider_hook_dropped_total", name, labels, reason)
                    return NoopSeries(name, labels, 1, self.drop)
                cls: type[Series] = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}[kind]
                width = len(bounds) + 2 if kind == "histogram" else 1
                s = cls(name, dict(labels), width, self.drop, tuple(bounds) if kind == "histogram" else ())
                self._series[key] = s
                self._per_metric[name] = self._per_metric.get(name, 0) + 1
                self._label_names.setdefault(name, tuple(sorted(labels)))
                return s
        except Exception:
            self.drop("registration_error")
            return NoopSeries(name, {}, 1, self.drop)

    def _refuse(self, name: str, labels: dict[str, str], builtin: bool) -> str:
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            return "invalid_name"
        if not builtin and name.startswith("outrider_"):
            return "reserved_name"
        for k, v in labels.items():
            if not isinstance(k, str) or not LABEL_RE.fullmatch(k) or k.startswith("__") or k in ("rank", "le"):
                return "invalid_label_name"
            if not isinstance(v, str) or len(v) > MAX_LABEL_VALUE:
                return "invalid_label_value"
        known = self._label_names.get(name)
        if known is not None and known != tuple(sorted(labels)):
            return "inconsistent_label_names"
        if self._per_metric.get(name, 0) >= self.max_series_per_metric:
            return "series_limit_per_metric"
        if len(self._series) >= self.max_series:
            return "series_limit"
        return ""

    # --- steps ----------------------------------------------------------------------------------------------
    def step_completed(self, duration_s: float) -> None:
        """What the step timer does inline (api._step_done), for integrations and tests."""
        if duration_s:
            self.recent_steps[self.steps & 31] = duration_s
        self.steps += 1
        self.last_step_perf = time.perf_counter()

    def _last_step_wall_ns(self) -> int:
        """Wall time of the last step, derived at flush time so the hot path reads one clock only."""
        if not self.steps:
            return 0
        return time.time_ns() - int((time.perf_counter() - self.last_step_perf) * 1e9)

    # --- publishing ------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outrider-hook", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_lock_try = 0.0
        while not self._stop.wait(self.flush_interval_s):
            try:
                now = time.monotonic()
                if self.standalone and self._agent is None and now >= next_lock_try:
                    next_lock_try = now + 5.0
                    self._maybe_become_agent()
                self.flush()
            except Exception:  # the publisher never dies and never touches the workload
                self.drop("flush_error")
                LOG.debug("outrider hook flush failed", exc_info=True)

    def flush(self, closing: bool = False) -> None:
        for sample in list(self.samplers):
            try:
                sample()
            except Exception:
                self.drop("sampler_error")
        with self._lock:
            if self.steps:
                self._steps_series().set_total(self.steps)
            series = list(self._series.values())
            if self.drop.counts:
                for reason in list(self.drop.counts):
                    self._dropped_series(reason)
                series = list(self._series.values())
        has_data = self.steps > 0 or any(s._all for s in series)
        if self._writer is None:
            if not has_data or time.monotonic() < self._writer_retry_at:
                return
            try:
                self._writer = ShardWriter(self.spool_dir, self.pid, self.start_ns)
                if self._writer_failed:
                    LOG.info("outrider: the spool %s is writable again; publishing", self.spool_dir)
                self._writer_failed = False
            except OSError as e:
                # Spool unwritable or full: keep measuring (values are cumulative, nothing is lost), say it once,
                # try again later.
                self._writer_retry_at = time.monotonic() + WRITER_RETRY_S
                if not self._writer_failed:
                    LOG.warning("outrider: cannot write to the spool %s (%s); metrics stay in this process and "
                                "publishing is retried every %g s", self.spool_dir, e, WRITER_RETRY_S)
                self._writer_failed = True
                self.drop("spool_unwritable")
                return
        entries: list[list[Any]] = []
        values: list[float] = []
        for s in series:
            if not s._all:
                continue
            total = s.total()
            entries.append([s.name, s.kind, s.labels, len(values), list(s.bounds)])
            values.extend(total)
        stalled = self._check_stall()
        directory = json.dumps({"meta": self.meta(), "series": entries}, separators=(",", ":")).encode()
        flags = (shard.FLAG_CLOSED if closing else 0) | (shard.FLAG_STALLED if stalled else 0)
        try:
            self._writer.write(directory, values, flags=flags, pid=self.pid, stalls=self.stalls,
                               start_ns=self.start_ns, heartbeat_ns=time.time_ns(),
                               last_step_ns=self._last_step_wall_ns(),
                               steps=self.steps, stalled_since_ns=self.stalled_since_ns)
        except ValueError:
            self.drop("shard_full")

    def _steps_series(self) -> Counter:
        key = ("outrider_train_steps_total", ())
        s = self._series.get(key)
        if not isinstance(s, Counter):
            s = Counter("outrider_train_steps_total", {}, 1, self.drop)
            self._series[key] = s
        return s

    def _dropped_series(self, reason: str) -> None:
        """Drop counts travel in the shard as outrider_hook_dropped_total{reason}."""
        key = ("outrider_hook_dropped_total", (("reason", reason),))
        s = self._series.get(key)
        if s is None:
            s = Counter("outrider_hook_dropped_total", {"reason": reason}, 1, self.drop)
            self._series[key] = s
        cells = s._all[0] if s._all else s._cells()
        cells[0] = float(self.drop.counts.get(reason, 0))

    def _check_stall(self) -> bool:
        if not self.steps or self.closed:
            return False
        recent = sorted(d for d in self.recent_steps if d > 0)
        median = recent[len(recent) // 2] if recent else 0.0
        threshold = max(self.stall_factor * median, self.stall_floor_s)
        since = time.perf_counter() - self.last_step_perf
        if since <= threshold:
            self.stalled_since_ns = 0  # progress again
            return False
        if not self.stalled_since_ns:
            self.stalled_since_ns = time.time_ns()
            self.stalls += 1
            self._dump_stacks(since, threshold)
        return True

    def _dump_stacks(self, since: float, threshold: float) -> None:
        if self._writer is None:
            return
        path = shard_stack_path(self._writer.path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(f"# outrider: pid {self.pid} rank {self.rank or '-'}: no step completed for {since:.1f} s "
                         f"(threshold {threshold:.1f} s) after {self.steps} steps\n")
                fh.flush()
                faulthandler.dump_traceback(file=fh, all_threads=True)
        except OSError as e:
            self.drop("stack_dump_error")
            LOG.debug("stack dump failed: %s", e)

    def _maybe_become_agent(self) -> None:
        try:
            os.makedirs(self.spool_dir, mode=0o700, exist_ok=True)
            fd = try_lock(self.spool_dir)
        except OSError:
            return
        if fd is None:
            return  # a sidecar or another process of this job is the agent
        self._lock_fd = fd
        try:
            from outrider.hook.standalone import start_in_process_agent

            self._agent = start_in_process_agent(self.spool_dir, self.listen)
        except Exception as e:
            LOG.warning("outrider: could not start the in-process agent: %s", e)
            self._agent = False  # don't retry every few seconds

    # --- lifecycle -------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Final flush, marked closed, so the agent can tell a finished process from a dead one."""
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        with contextlib.suppress(Exception):
            self.flush(closing=True)
        if self._agent:
            with contextlib.suppress(Exception):
                self._agent.stop()

    def after_fork_in_child(self) -> None:
        """Called in a forked child: its own identity, zeroed series, no inherited lock or agent, a new thread."""
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # closing (not unlocking) leaves the parent's lock in place
            self._lock_fd = None
        self._agent = None
        self._lock = threading.Lock()
        for s in self._series.values():
            s.reset_after_fork()
        self.drop.counts.clear()
        self._reset_process_state()
        self._thread = None
        self.closed = False
        self.start()


def make_hook_from_env() -> Hook:
    """A Hook configured from OUTRIDER_* (the agent's config keys); a bad value is logged, never raised."""
    try:
        from outrider.config import load

        c = load().config
        return Hook(spool_dir=c.spool_dir or None, flush_interval_s=c.flush_interval_s,
                    max_series_per_metric=c.hook_max_series_per_metric, stall_factor=c.stall_factor,
                    stall_floor_s=c.stall_floor_s, standalone=c.standalone, listen=c.listen)
    except Exception as e:
        LOG.warning("outrider: configuration error, using defaults: %s", e)
        return Hook()


def register_exit(hook_getter: Callable[[], Hook | None]) -> None:
    def on_exit() -> None:
        h = hook_getter()
        if h is not None:
            h.close()

    atexit.register(on_exit)


BUILTIN = {
    "step": ("histogram", "outrider_train_step_duration_seconds", DURATION_BOUNDS),
    "steps": ("counter", "outrider_train_steps_total", ()),
    "samples": ("counter", "outrider_samples_total", ()),
    "tokens": ("counter", "outrider_tokens_total", ()),
    "data_wait": ("histogram", "outrider_train_data_wait_seconds", DURATION_BOUNDS),
    "gpu_step": ("histogram", "outrider_train_gpu_step_duration_seconds", DURATION_BOUNDS),
    "first_step": ("gauge", "outrider_train_time_to_first_step_seconds", ()),
    "batch_size": ("histogram", "outrider_inference_batch_size", SIZE_BOUNDS),
}
