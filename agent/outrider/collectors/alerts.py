"""The agent's own alerting on /metrics: outrider_alerts and outrider_alert_active_since_timestamp_seconds
(Prometheus's ALERTS and ALERTS_FOR_STATE under Outrider's prefix), the rule
evaluator's health and store size, and delivery metrics per receiver (sent, failed, queued, oldest queued age).
Empty when the agent evaluates no rules."""

from __future__ import annotations

from outrider.collectors.base import Collector
from outrider.metrics.family import Family


class AlertsCollector(Collector):
    name = "alerts"
    description = "the embedded rule evaluator's alerts (outrider_alerts), its health and notification delivery"
    after_listeners = True

    def collect(self) -> list[Family]:
        return self.ctx.reports(self.name)  # wired by wiring/agent.py: the rule engine's and the dispatcher's families
