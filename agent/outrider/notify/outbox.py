"""The durable outbox: one queue per receiver, each notification a file written before delivery is tried and
removed only once the receiver has confirmed it (or rejected it for good).

Files are `<seq>.json` in `<state_dir>/outbox/<receiver>/`, created 0600 under a temporary name, fsynced and
renamed, so a crash leaves either the whole notification or none. Delivery is in sequence order, so a receiver
sees a trigger before its resolve. If the disk is full (or the directory unwritable) a notification is held in
memory, counted in write_errors, and written out as soon as the disk takes it again; only an agent killed while
the disk is still full loses those.

One bound holds for memory and disk alike: at most `max_entries` notifications and `max_bytes` of them per receiver
(a receiver down for days under an alert storm). Past it the oldest is dropped, its file removed with it, so a
restart never re-sends what was reported dropped; drops are counted by reason (`full`, `unreadable`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

from outrider.notify.base import Notification

LOG = logging.getLogger("outrider.notify")


MAX_ENTRIES = 10_000  # per receiver: a day of a storm that pages every 10 s
MAX_BYTES = 16 << 20  # per receiver, of serialised notifications (about 1 KiB each)
DROP_REASONS = ("full", "unreadable")


@dataclass
class Entry:
    seq: int
    notification: Notification
    path: str | None  # None: not on disk (memory-only outbox, or the disk refused it)
    size: int  # bytes of its serialised form, on disk or not


class Outbox:
    def __init__(self, directory: str | None, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.directory = directory
        self.max_entries = max(1, max_entries)
        self.max_bytes = max(1, max_bytes)
        self._entries: deque[Entry] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self.write_errors = 0
        self.dropped: dict[str, int] = {}  # by reason: full, unreadable
        self._warned_full = False
        self._seq = 0
        if directory:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            self._load()
            with self._lock:
                self._enforce_bounds()

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def _enforce_bounds(self) -> None:
        """Drop the oldest entries, files and all, until the queue is within both bounds (keeps the newest)."""
        while len(self._entries) > 1 and (len(self._entries) > self.max_entries or self._bytes > self.max_bytes):
            entry = self._entries.popleft()
            self._bytes -= entry.size
            if entry.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
            self._drop("full")
            if not self._warned_full:
                self._warned_full = True
                LOG.warning("outbox %s is full (%d notifications, %d bytes at most): dropping the oldest (counted in "
                            "outrider_notify_dropped_total)", self.directory or "(memory)", self.max_entries,
                            self.max_bytes)

    def _load(self) -> None:
        assert self.directory
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if name.endswith(".tmp"):  # a write that never finished: nothing was promised for it
                os.unlink(path)
                continue
            if not name.endswith(".json") or not name[:-5].isdigit():
                continue
            try:
                with open(path, "rb") as fh:
                    raw = fh.read(self.max_bytes + 1)
                if len(raw) > self.max_bytes:
                    raise ValueError("larger than the outbox's bound")
                n = Notification.from_json(json.loads(raw))
            except (OSError, ValueError, KeyError, TypeError) as e:
                self._drop("unreadable")
                LOG.warning("outbox %s: skipping unreadable %s: %s", self.directory, name, e)
                with contextlib.suppress(OSError):
                    os.unlink(path)  # counted and logged; kept, it would be skipped again at every start
                continue
            seq = int(name[:-5])
            self._entries.append(Entry(seq, n, path, len(raw)))
            self._bytes += len(raw)
            self._seq = max(self._seq, seq)

    def _write(self, seq: int, data: bytes) -> str:
        assert self.directory
        path = os.path.join(self.directory, f"{seq:020d}.json")
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        os.replace(tmp, path)
        return path

    def put(self, n: Notification) -> None:
        data = json.dumps(n.to_json(), separators=(",", ":")).encode()
        with self._lock:
            self._seq += 1
            entry = Entry(self._seq, n, None, len(data))
            # What the disk refused is always a suffix of the queue (written in order, retried in order), so the
            # newest entry says whether anything is still waiting to be written.
            if self.directory and (not self._entries or self._entries[-1].path is not None):
                try:
                    entry.path = self._write(entry.seq, data)
                except OSError as e:
                    self.write_errors += 1
                    LOG.warning("outbox %s: cannot write a notification (%s): holding it in memory until the disk "
                                "takes it (counted in outrider_notify_outbox_write_errors_total)", self.directory,
                                e.strerror or e)
            elif self.directory:
                self.write_errors += 1
            self._entries.append(entry)
            self._bytes += entry.size
            self._enforce_bounds()

    def persist_pending(self) -> None:
        """Write out, in order, what the disk refused before."""
        if not self.directory:
            return
        with self._lock:
            for entry in self._entries:
                if entry.path is None:
                    try:
                        data = json.dumps(entry.notification.to_json(), separators=(",", ":")).encode()
                        entry.path = self._write(entry.seq, data)
                    except OSError:
                        return

    def peek(self, n: int) -> list[Notification]:
        with self._lock:
            return [self._entries[i].notification for i in range(min(n, len(self._entries)))]

    def ack(self, n: int) -> None:
        with self._lock:
            for _ in range(min(n, len(self._entries))):
                entry = self._entries.popleft()
                self._bytes -= entry.size
                if entry.path is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)

    def __len__(self) -> int:
        return len(self._entries)

    def oldest_age_s(self) -> float:
        with self._lock:
            if not self._entries:
                return 0.0
            return max(0.0, time.time() - self._entries[0].notification.created)

    def in_memory_only(self) -> int:
        with self._lock:
            return sum(1 for e in self._entries if e.path is None) if self.directory else 0
