"""Alertmanager, API v2 (POST /api/v2/alerts).

A firing alert is sent with an `endsAt` lease (4 resend intervals ahead) and re-sent every resend interval while
it fires, so Alertmanager resolves it on its own if the agent dies; a resolve is sent explicitly with `endsAt`
set to the time it resolved. Alertmanager groups and deduplicates by labels, so re-sends never page twice.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from outrider.notify.base import Notification, Notifier, Outcome, rfc3339


class AlertmanagerNotifier(Notifier):
    type: ClassVar[str] = "alertmanager"
    batch: ClassVar[int] = 64
    lease_s: float = 240.0
    generator_url: str = ""

    def __post_init__(self) -> None:
        self.http_options()  # a hosted Alertmanager (Mimir, Grafana Cloud) wants auth
        url = self.http_url(str(self.spec.get("url", "")))  # user:password@ in it becomes basic auth
        self.endpoint = url.rstrip("/") + "/api/v2/alerts"

    def payload(self, n: Notification, now: float) -> dict[str, Any]:
        alert = {"labels": n.labels, "annotations": n.annotations, "startsAt": rfc3339(n.starts_at),
                 "endsAt": rfc3339(n.ends_at if n.event == "resolved" else now + self.lease_s)}
        if self.generator_url:
            alert["generatorURL"] = self.generator_url
        return alert

    def send(self, notifications: list[Notification]) -> Outcome:
        now = time.time()
        return self.post_json(self.endpoint, [self.payload(n, now) for n in notifications])

    def refresh(self, firing: list[Notification]) -> Outcome | None:
        return self.send(firing) if firing else None
