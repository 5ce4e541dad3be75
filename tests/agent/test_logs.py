"""The log-once helper stays bounded however many different keys come: a spool with thousands of planted files
(each its own key) once wrote a warning per file."""

from __future__ import annotations

import logging
import re

from outrider.ground.logs import LogOnce
from tests.helpers import wait_until


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _logger(name: str) -> tuple[logging.Logger, Kept]:
    logger = logging.getLogger(f"outrider.test.{name}")
    kept = Kept()
    logger.handlers[:] = [kept]
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    return logger, kept


def test_thousands_of_keys_give_a_burst_of_warnings_then_one_line_saying_the_rest_are_counted() -> None:
    logger, kept = _logger("burst")
    once = LogOnce(logger, burst=10, period_s=60.0)
    for i in range(5000):
        once.warning(f"shard {i}", "dropped reading shard %d", i)
        once.warning(f"shard {i}", "dropped reading shard %d", i)  # a key seen before is never logged again
    assert kept.messages[:10] == [f"dropped reading shard {i}" for i in range(10)]
    assert len(kept.messages) == 11 and "counted, not logged" in kept.messages[10]


def test_once_the_rate_falls_the_next_warning_says_how_many_were_not_logged() -> None:
    logger, kept = _logger("refill")
    once = LogOnce(logger, burst=2, period_s=0.2)
    for i in range(50):
        once.warning(f"k{i}", "warning %d", i)
    assert len(kept.messages) == 3

    tries = iter(range(10**6))

    def logged_again() -> bool:
        once.warning(f"later {next(tries)}", "a later warning")
        return len(kept.messages) > 3
    wait_until(logged_again, timeout_s=10, interval_s=0.05, what="a token back")
    said = re.fullmatch(r"a later warning \((\d+) other warnings were not logged: .*\)", kept.messages[3])
    assert said and int(said.group(1)) >= 48, kept.messages[3]  # and the later tries before a token was back


def test_the_keys_remembered_are_bounded() -> None:
    logger, _ = _logger("keys")
    once = LogOnce(logger, max_keys=100)
    for i in range(1000):
        once.warning(f"k{i}", "w")
    assert len(once._seen) == 100
