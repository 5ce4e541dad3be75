"""Logging setup and the log-once helper: a broken reading is reported the first time, then only counted."""

from __future__ import annotations

import logging
import sys
import threading
import time

LOG = logging.getLogger("outrider")


def setup_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s outrider %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("outrider")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


class LogOnce:
    """Logs a warning the first time a key is seen; later occurrences are left to the counters.

    Bounded however many keys come (a spool with thousands of planted files, each its own key): at most `burst`
    warnings per `period_s` (a token bucket), the rest counted and said in the next warning that is logged, with
    one line when the limit starts; at most `max_keys` keys remembered (the oldest forgotten)."""

    def __init__(self, logger: logging.Logger, burst: int = 10, period_s: float = 60.0,
                 max_keys: int = 10_000) -> None:
        self._logger = logger
        self._seen: dict[str, None] = {}
        self._lock = threading.Lock()
        self._burst = burst
        self._rate = burst / period_s
        self._tokens = float(burst)
        self._at = time.monotonic()
        self._max_keys = max_keys
        self._suppressed = 0

    def warning(self, key: str, msg: str, *args: object) -> None:
        with self._lock:
            if key in self._seen:
                return
            self._seen[key] = None
            if len(self._seen) > self._max_keys:
                del self._seen[next(iter(self._seen))]
            now = time.monotonic()
            self._tokens = min(float(self._burst), self._tokens + (now - self._at) * self._rate)
            self._at = now
            if self._tokens < 1.0:
                self._suppressed += 1
                first = self._suppressed == 1
                if not first:
                    return
            else:
                self._tokens -= 1.0
                first = False
                suppressed, self._suppressed = self._suppressed, 0
        if first:
            self._logger.warning("too many different warnings at once: the next ones are counted, not logged, "
                                 "until the rate falls (at most %d a minute)", round(self._rate * 60))
            return
        if suppressed:
            msg += " (%d other warnings were not logged: too many at once; the counters have them)"
            args = (*args, suppressed)
        self._logger.warning(msg, *args)
