"""What the rule engine hands to the notifiers: one alert transition for one receiver.

Defined on the rules' side (the producer) so the engine imports nothing of the notifiers; the notifiers, above it,
import this type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The severity of heartbeats: always-firing alerts (the Watchdog) whose silence, at a dead man's switch, is the alarm
HEARTBEAT_SEVERITY = "none"


@dataclass(frozen=True)
class Notification:
    """One alert transition for one receiver: `firing` or `resolved`."""

    id: str  # unique per transition: receivers that cannot dedupe get it as an idempotency key
    event: str  # firing | resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float  # unix seconds: when the alert became active (pending), as Alertmanager's startsAt
    ends_at: float  # unix seconds; 0 while firing
    fingerprint: str
    created: float = 0.0
    value: float = 0.0
    fired_at: float = 0.0  # unix seconds: when it began firing (after its `for`); 0 where not known (an old outbox)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "event": self.event, "labels": self.labels, "annotations": self.annotations,
                "starts_at": self.starts_at, "ends_at": self.ends_at, "fingerprint": self.fingerprint,
                "created": self.created, "value": self.value, "fired_at": self.fired_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Notification:
        return cls(str(data["id"]), str(data["event"]), dict(data["labels"]), dict(data.get("annotations", {})),
                   float(data["starts_at"]), float(data.get("ends_at", 0.0)), str(data["fingerprint"]),
                   float(data.get("created", 0.0)), float(data.get("value", 0.0)),
                   float(data.get("fired_at", 0.0)))

    @property
    def firing_since(self) -> float:
        """When it began firing: fired_at, or starts_at for a notification that does not carry it."""
        return self.fired_at or self.starts_at

    @property
    def heartbeat(self) -> bool:
        """An always-firing alert (the Watchdog): news only when it stops."""
        return self.labels.get("severity") == HEARTBEAT_SEVERITY

    @property
    def alertname(self) -> str:
        return self.labels.get("alertname", "")
