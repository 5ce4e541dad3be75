"""Publishing one process's state into its shard in the spool, through outrider.shared.spool's writer.

The shard is created at the first flush that has data. When the spool cannot be used (unwritable, full, unsafe),
the process keeps measuring (values are cumulative: nothing is lost), says so once, counts the reason and tries
again every 10 flush intervals (at most every WRITER_RETRY_S). A write that fails later (a volume gone
read-only) drops the writer and takes the same path. Nothing here raises into the workload, and nothing waits for
a logging lock while the flush lock is held (series.log_aside).

A shard never goes dark:
- It grows. When the directory or the values outgrow the file, the next generation (capacities doubled as needed)
  is written whole and renamed over it. Within the registry's caps (hook_max_series_per_metric, 2,000 series)
  this always fits; past the format's limit (or while the larger file cannot be created) the series that do not
  fit are left out, the hook's own (outrider_*) kept first, each counted once as
  outrider_hook_dropped_total{reason="shard_full"} and said once. The header (heartbeat, steps, stall) is written
  every flush whatever happens, so a full shard is never a false stall.
- It heals. Every flush checks the shard is still where readers look (same inode at its path): a spool deleted,
  replaced or remounted under the job is re-created (with the same checks: private, 0700, O_NOFOLLOW) and the shard
  written again whole. Values are cumulative, so the agent counts nothing twice.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import time
from collections.abc import Callable
from typing import Any, TextIO

from outrider.hook.series import Dropped, log_aside
from outrider.shared import spool

LOG = logging.getLogger("outrider.hook")
WRITER_RETRY_S = 30.0


class ShardPublisher:
    def __init__(self, spool_dir: str, explicit: bool, drop: Dropped,
                 trusted_uids: frozenset[int] = frozenset(), retry_s: float = WRITER_RETRY_S) -> None:
        self.spool_dir = spool_dir
        self.retry_s = retry_s
        self.explicit = explicit  # configured (a shared volume) rather than the private default
        self.trusted_uids = trusted_uids
        self.drop = drop
        self.writer: spool.ShardWriter | None = None
        self.failing = False
        self.retry_at = 0.0
        self.grow_retry_at = 0.0
        self.left_out: set[str] = set()  # series left out of a full shard, counted once each
        self.healed = 0  # times the shard was re-created after the spool lost it
        self.grow_failures = 0

    def _open(self, pid: int, start_ns: int) -> spool.ShardWriter | None:
        if time.monotonic() < self.retry_at:
            return None
        try:
            spool.prepare_dir(self.spool_dir, private=not self.explicit, trusted_uids=self.trusted_uids)
            mode = spool.shared_file_mode(self.spool_dir) if self.explicit else spool.PRIVATE_FILE_MODE
            writer = spool.ShardWriter(self.spool_dir, pid, start_ns, mode)
        except OSError as e:
            self._failed("spool_unsafe" if isinstance(e, spool.SpoolError) else "spool_unwritable", e)
            return None
        if self.failing:
            log_aside(LOG, logging.INFO, "outrider: the spool %s is usable again; publishing", self.spool_dir)
        self.failing = False
        return writer

    def _failed(self, reason: str, error: OSError) -> None:
        self.retry_at = time.monotonic() + self.retry_s
        if not self.failing:
            log_aside(LOG, logging.WARNING, "outrider: cannot publish to the spool %s (%s); metrics stay in this "
                      "process and publishing is retried every %g s", self.spool_dir, error, self.retry_s)
        self.failing = True
        self.drop(reason)

    def publish(self, pid: int, start_ns: int, meta: dict[str, Any], entries: list[list[Any]],
                values: list[float], sketches: list[list[int]] | None = None, **header: int) -> bool:
        """Write the shard (creating, growing or re-creating it as needed); False when it could not be written
        now (counted)."""
        if self.writer is not None and not self.writer.intact():
            # The spool was deleted, replaced or remounted under the job: re-create it now, not after a retry.
            if not self.healed:
                log_aside(LOG, logging.WARNING, "outrider: the shard %s left the spool (deleted, replaced or "
                          "remounted); re-creating it", self.writer.path)
            self.healed += 1
            self.writer.close()
            self.writer = None
            self.retry_at = 0.0
        if self.writer is None:
            self.writer = self._open(pid, start_ns)
            if self.writer is None:
                return False
        sketches = sketches or []
        directory = _directory(meta, entries, sketches)
        if not self.writer.fits(len(directory), len(values)):
            bigger = self._grow(self.writer, len(directory), len(values))
            if bigger is not None:
                try:
                    fitted, fitted_values = directory, values
                    if not bigger.fits(len(directory), len(values)):  # past the format's limit
                        fitted, fitted_values = self._trim(meta, entries, values, sketches, bigger)
                    bigger.write(fitted, fitted_values, pid=pid, start_ns=start_ns, **header)
                except (OSError, ValueError) as e:
                    bigger.close()
                    self._grow_failed(e)
                else:
                    self.writer.close()  # the previous generation, replaced by the rename
                    self.writer = bigger
                    return True
            if not self.writer.fits(len(directory), len(values)):
                directory, values = self._trim(meta, entries, values, sketches, self.writer)
        try:
            self.writer.write(directory, values, pid=pid, start_ns=start_ns, **header)
        except (OSError, ValueError) as e:
            self.writer.close()
            self.writer = None
            self._failed("spool_unwritable", e if isinstance(e, OSError) else OSError(str(e)))
            return False
        return True

    def _grow(self, writer: spool.ShardWriter, directory_len: int, value_count: int) -> spool.ShardWriter | None:
        """The next, larger generation; None when the shard is as large as the format allows, or while a larger
        file cannot be created (counted, said once, retried like a failed creation): the current one is then
        written with the series that fit, so its heartbeat and progress never stop."""
        if time.monotonic() < self.grow_retry_at:
            return None
        if writer.room_for(directory_len, value_count) == (writer.directory_capacity, writer.value_capacity):
            return None
        try:
            return writer.grown(directory_len, value_count)
        except (OSError, ValueError) as e:
            self._grow_failed(e)
            return None

    def _grow_failed(self, error: Exception) -> None:
        self.grow_retry_at = time.monotonic() + self.retry_s
        self.drop("spool_unwritable")
        if not self.grow_failures:
            log_aside(LOG, logging.WARNING, "outrider: cannot grow the shard in %s (%s); series that do not fit are "
                      "left out until it can (retried every %g s)", self.spool_dir, error, self.retry_s)
        self.grow_failures += 1

    def _trim(self, meta: dict[str, Any], entries: list[list[Any]], values: list[float], sketches: list[list[int]],
              writer: spool.ShardWriter) -> tuple[bytes, list[float]]:
        """As many series as fit this shard, the hook's own first (steps, drops, phases), the rest in order, each
        with its sketch where that fits too (a series kept without its sketch still has its classic buckets); each
        series left out is counted once."""
        head = json.dumps({"meta": meta, "series": []}, separators=(",", ":")).encode()[:-2]
        size = len(head) + len(',"sketches":[]') + 2
        kept: list[bytes] = []
        out: list[float] = []
        sketch_of = {index: (offset, n) for index, offset, n in sketches}
        kept_sketches: list[tuple[int, list[float]]] = []
        order = sorted(range(len(entries)), key=lambda i: not str(entries[i][0]).startswith("outrider_"))
        for i in order:
            name, kind, labels, offset, bounds = entries[i]
            width = len(bounds) + 2 if kind == "histogram" else 1
            piece = json.dumps([name, kind, labels, len(out), bounds], separators=(",", ":")).encode()
            if size + len(piece) + 1 <= writer.directory_capacity and len(out) + width <= writer.value_capacity:
                kept.append(piece)
                size += len(piece) + 1
                out.extend(values[offset:offset + width])
                if i in sketch_of:
                    at, n = sketch_of[i]
                    kept_sketches.append((len(kept) - 1, values[at:at + 1 + 2 * n]))
                continue
            key = json.dumps([name, labels], separators=(",", ":"), sort_keys=True)
            if key not in self.left_out:
                if not self.left_out:
                    log_aside(LOG, logging.WARNING, "outrider: the shard %s is full (%d series); series that do not "
                              "fit are left out and counted in outrider_hook_dropped_total{reason=\"shard_full\"}",
                              writer.path, len(entries))
                self.left_out.add(key)
                self.drop("shard_full")
        placed: list[list[int]] = []
        for index, data in kept_sketches:
            piece = json.dumps([index, len(out), (len(data) - 1) // 2], separators=(",", ":")).encode()
            if size + len(piece) + 1 <= writer.directory_capacity and len(out) + len(data) <= writer.value_capacity:
                placed.append([index, len(out), (len(data) - 1) // 2])
                size += len(piece) + 1
                out.extend(data)
            else:
                self.drop("sketch_left_out")
        series = head + b",".join(kept) + b"]"
        if placed:
            series += b',"sketches":' + json.dumps(placed, separators=(",", ":")).encode()
        return series + b"}", out

    def dump_stacks(self, first_line: str, dump: Callable[[TextIO], None] | None = None) -> str | None:
        """The Python stacks of every thread, beside the shard (for the stall page); None when it failed."""
        if self.writer is None:
            return None
        try:
            return self.writer.write_stacks(first_line, dump or _all_threads)
        except OSError as e:
            self.drop("stack_dump_error")
            log_aside(LOG, logging.DEBUG, "stack dump failed: %s", e)
            return None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _directory(meta: dict[str, Any], entries: list[list[Any]], sketches: list[list[int]]) -> bytes:
    directory: dict[str, Any] = {"meta": meta, "series": entries}
    if sketches:
        directory["sketches"] = sketches
    return json.dumps(directory, separators=(",", ":")).encode()


def _all_threads(fh: TextIO) -> None:
    faulthandler.dump_traceback(file=fh, all_threads=True)
