"""Publishing one process's state into its shard in the spool, through outrider.spool's writer.

The shard is created at the first flush that has data. When the spool cannot be used (unwritable, full, unsafe),
the process keeps measuring (values are cumulative: nothing is lost), says so once, counts the reason and tries
again every 10 flush intervals (at most every WRITER_RETRY_S). A write that fails later (a volume gone
read-only) drops the writer and takes the same path. Nothing here raises into the workload, and nothing waits for
a logging lock while the flush lock is held (series.log_aside).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import time
from collections.abc import Callable
from typing import Any, TextIO

from outrider import spool
from outrider.hook.series import Dropped, log_aside

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
                values: list[float], **header: int) -> bool:
        """Write the shard (creating it if needed); False when it could not be written now (counted)."""
        if self.writer is None:
            self.writer = self._open(pid, start_ns)
            if self.writer is None:
                return False
        directory = json.dumps({"meta": meta, "series": entries}, separators=(",", ":")).encode()
        try:
            self.writer.write(directory, values, pid=pid, start_ns=start_ns, **header)
        except ValueError:
            self.drop("shard_full")
            return False
        except OSError as e:
            self.writer.close()
            self.writer = None
            self._failed("spool_unwritable", e)
            return False
        return True

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


def _all_threads(fh: TextIO) -> None:
    faulthandler.dump_traceback(file=fh, all_threads=True)
