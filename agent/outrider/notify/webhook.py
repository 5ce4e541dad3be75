"""Generic webhook: Alertmanager's webhook payload (version 4), one transition per request, with the
transition's id in an Idempotency-Key header so a receiver can drop a re-delivery. Bearer or basic auth and a
private CA as every HTTP receiver takes them (Notifier.http_options)."""

from __future__ import annotations

from typing import Any, ClassVar

from outrider.notify.base import Notification, Notifier, Outcome, rfc3339


class WebhookNotifier(Notifier):
    type: ClassVar[str] = "webhook"

    def __post_init__(self) -> None:
        self.http_options()
        self.url = self.http_url(str(self.spec.get("url", "")))

    def payload(self, n: Notification) -> dict[str, Any]:
        alert = {"status": n.event, "labels": n.labels, "annotations": n.annotations,
                 "startsAt": rfc3339(n.starts_at), "endsAt": rfc3339(n.ends_at) if n.ends_at else
                 "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": n.fingerprint}
        return {"version": "4", "groupKey": f"{n.alertname}:{n.fingerprint}", "truncatedAlerts": 0,
                "status": n.event, "receiver": self.name, "groupLabels": {"alertname": n.alertname},
                "commonLabels": n.labels, "commonAnnotations": n.annotations, "externalURL": "",
                "alerts": [alert]}

    def send(self, notifications: list[Notification]) -> Outcome:
        n = notifications[0]
        return self.post_json(self.url, self.payload(n), {"Idempotency-Key": n.id})
