"""The log notifier: every transition as one line on the agent's log (on by default; no outbox needed)."""

from __future__ import annotations

import logging
from typing import ClassVar

from outrider.notify.base import DELIVERED, Notification, Notifier, Outcome

LOG = logging.getLogger("outrider.alerts")


class LogNotifier(Notifier):
    type: ClassVar[str] = "log"
    durable: ClassVar[bool] = False

    def send(self, notifications: list[Notification]) -> Outcome:
        for n in notifications:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(n.labels.items()) if k != "alertname")
            summary = n.annotations.get("summary", "")
            level = logging.WARNING if n.event == "firing" else logging.INFO
            LOG.log(level, "alert %s %s {%s}: %s", n.alertname, n.event.upper(), labels, summary)
        return DELIVERED
