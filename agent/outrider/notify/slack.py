"""Slack incoming webhook: one message per transition (Slack cannot deduplicate, so the outbox sends each
transition once and only re-sends one whose delivery was not confirmed). The webhook URL is a secret: it is read
from url_env or url_file and never logged."""

from __future__ import annotations

from typing import Any, ClassVar

from outrider.notify.base import Notification, Notifier, Outcome, read_secret

ICONS = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


class SlackNotifier(Notifier):
    type: ClassVar[str] = "slack"

    def __post_init__(self) -> None:
        self.url = read_secret(self.spec, "url", self.name)
        self.secrets.append(self.url)

    def payload(self, n: Notification) -> dict[str, Any]:
        summary = n.annotations.get("summary") or n.alertname
        if n.event == "resolved":
            head = f":white_check_mark: RESOLVED {n.alertname}: {summary}"
        else:
            head = f"{ICONS.get(n.labels.get('severity', ''), ':bell:')} FIRING {n.alertname}: {summary}"
        lines = [f"*{head}*"]
        if n.annotations.get("description"):
            lines.append(n.annotations["description"])
        labels = ", ".join(f"{k}={v}" for k, v in sorted(n.labels.items()) if k != "alertname")
        lines.append(f"_{labels}_")
        if n.annotations.get("runbook_url"):
            lines.append(f"<{n.annotations['runbook_url']}|Runbook>")
        if n.event == "firing" and n.annotations.get("stack_dump"):
            lines.append("```" + n.annotations["stack_dump"][:2500] + "```")
        text = "\n".join(lines)
        return {"text": head, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text[:2900]}}]}

    def send(self, notifications: list[Notification]) -> Outcome:
        return self.post_json(self.url, self.payload(notifications[0]))
