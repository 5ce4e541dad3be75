"""Logging setup and the log-once helper: a broken reading is reported the first time, then only counted."""

from __future__ import annotations

import logging
import sys
import threading

LOG = logging.getLogger("outrider")


def setup_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s outrider %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("outrider")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


class LogOnce:
    """Logs a warning the first time a key is seen; later occurrences are left to the counters."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def warning(self, key: str, msg: str, *args: object) -> None:
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        self._logger.warning(msg, *args)
