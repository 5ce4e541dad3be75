"""Slack incoming webhook. Slack cannot deduplicate, so each transition is sent once (only one whose delivery was
not confirmed is sent again), and transitions arriving together are grouped: the first waits group_wait_s (5 s by
default) for others, and up to 20 go in one message, so fifty GPUs throttling at once post one message, not fifty.
The webhook URL is a secret: it is read from url_env or url_file and never logged."""

from __future__ import annotations

from typing import Any, ClassVar

from outrider.notify.base import (
    Notification,
    Notifier,
    NotifyConfigError,
    Outcome,
    check_url,
    read_secret,
    url_secrets,
)

ICONS = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


class SlackNotifier(Notifier):
    type: ClassVar[str] = "slack"
    batch: ClassVar[int] = 20
    default_group_wait_s: ClassVar[float] = 5.0

    def __post_init__(self) -> None:
        self.url = read_secret(self.spec, "url", self.name)
        self.secrets += url_secrets(self.url)
        parts = check_url(self.url, self.name, "the webhook URL")
        if parts.username is not None or parts.password is not None:
            raise NotifyConfigError(f"receiver {self.name!r}: the webhook URL carries credentials; a Slack "
                                    f"webhook URL has none")

    @staticmethod
    def _section(n: Notification, detail: bool) -> str:
        summary = n.annotations.get("summary") or n.alertname
        if n.event == "resolved":
            head = f":white_check_mark: RESOLVED {n.alertname}: {summary}"
        else:
            head = f"{ICONS.get(n.labels.get('severity', ''), ':bell:')} FIRING {n.alertname}: {summary}"
        lines = [f"*{head}*"]
        if detail and n.annotations.get("description"):
            lines.append(n.annotations["description"])
        labels = ", ".join(f"{k}={v}" for k, v in sorted(n.labels.items()) if k != "alertname")
        lines.append(f"_{labels}_")
        if n.annotations.get("runbook_url"):
            lines.append(f"<{n.annotations['runbook_url']}|Runbook>")
        if detail and n.event == "firing" and n.annotations.get("stack_dump"):
            lines.append("```" + n.annotations["stack_dump"][:2500] + "```")
        return "\n".join(lines)[:2900]

    def payload(self, notifications: list[Notification]) -> dict[str, Any]:
        if len(notifications) == 1:
            n = notifications[0]
            section = self._section(n, detail=True)
            return {"text": section.split("\n", 1)[0].strip("*"),
                    "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": section}}]}
        firing = sum(1 for n in notifications if n.event == "firing")
        names = sorted({n.alertname for n in notifications})
        text = (f"{firing} firing, {len(notifications) - firing} resolved: {', '.join(names)}")[:300]
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": f"*{text}*"}}]
        blocks += [{"type": "section", "text": {"type": "mrkdwn", "text": self._section(n, detail=False)}}
                   for n in notifications]
        return {"text": text, "blocks": blocks}

    def send(self, notifications: list[Notification]) -> Outcome:
        return self.post_json(self.url, self.payload(notifications))
