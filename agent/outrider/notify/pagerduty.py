"""PagerDuty Events API v2: `trigger` on firing, `resolve` on resolved, one incident per alert.

The dedup_key comes from the rule and its identity labels (the alert's fingerprint), so a trigger re-sent after
an agent restart or a lost response lands on the same incident instead of paging again. The routing key is read
from routing_key_env or routing_key_file.
"""

from __future__ import annotations

from typing import Any, ClassVar

from outrider.notify.base import (
    Notification,
    Notifier,
    NotifyConfigError,
    Outcome,
    check_url,
    read_secret,
    rfc3339,
)

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
SEVERITIES = {"critical": "critical", "warning": "warning", "info": "info"}


class PagerDutyNotifier(Notifier):
    type: ClassVar[str] = "pagerduty"

    def __post_init__(self) -> None:
        self.routing_key = read_secret(self.spec, "routing_key", self.name)
        self.secrets.append(self.routing_key)
        self.url = str(self.spec.get("url") or EVENTS_URL)
        parts = check_url(self.url, self.name, "url")
        if parts.username is not None or parts.password is not None:
            raise NotifyConfigError(f"receiver {self.name!r}: url carries credentials; PagerDuty takes none")

    @staticmethod
    def dedup_key(n: Notification) -> str:
        return f"outrider-{n.alertname}-{n.fingerprint}"

    def payload(self, n: Notification) -> dict[str, Any]:
        if n.event == "resolved":
            return {"routing_key": self.routing_key, "event_action": "resolve", "dedup_key": self.dedup_key(n)}
        summary = n.annotations.get("summary") or n.alertname
        body: dict[str, Any] = {
            "routing_key": self.routing_key,
            "event_action": "trigger",
            "dedup_key": self.dedup_key(n),
            "payload": {
                "summary": summary[:1024],
                "source": n.labels.get("instance") or n.labels.get("job") or "outrider",
                "severity": SEVERITIES.get(n.labels.get("severity", ""), "error"),
                "timestamp": rfc3339(n.starts_at),
                "component": n.labels.get("job", ""),
                "group": n.labels.get("instance", ""),
                "class": n.alertname,
                "custom_details": {"labels": n.labels, "annotations": n.annotations},
            },
            "client": "Outrider",
        }
        runbook = n.annotations.get("runbook_url")
        if runbook:
            body["links"] = [{"href": runbook, "text": "Runbook"}]
        return body

    def send(self, notifications: list[Notification]) -> Outcome:
        return self.post_json(self.url, self.payload(notifications[0]))
