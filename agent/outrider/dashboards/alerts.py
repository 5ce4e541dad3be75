"""Alerts overview: what fires now, by severity, and the alert history; and what the agents raised themselves."""

from __future__ import annotations

from grafana_foundation_sdk.builders import statetimeline
from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from outrider.dashboards.panels import GREEN, SEL, _common, dashboard, query, stat, table, thresholds, ts


def build() -> Dashboard:
    d = dashboard("outrider-alerts", "Outrider / Alerts", "Outrider's alerts (alerts/outrider.rules.yaml) as "
                  "Prometheus evaluates them: firing now, by severity, and over time; and as the agents evaluate "
                  "them themselves (outrider_alerts), with their notification delivery. Each alert's runbook_url "
                  "annotation links its runbook.", ["alerts"], ["namespace", "job", "instance"])
    d = d.with_row(Row("Now"))
    for severity, color in (("critical", "red"), ("warning", "orange"), ("info", "blue")):
        d = d.with_panel(stat(f"Firing {severity}", f"Alerts of severity {severity} firing now.", "short",
                              query(f'count(ALERTS{{alertstate="firing", severity="{severity}", {SEL}}}) or vector(0)',
                                    instant=True), width=8, th=thresholds(GREEN, (1, color))))
    d = d.with_panel(table("Firing and pending alerts", "Every alert firing or pending now, with its labels.",
                           "short", query(f'ALERTS{{alertstate=~"firing|pending", {SEL}}}', instant=True, table=True)))
    d = d.with_row(Row("History"))
    d = d.with_panel(ts("Firing alerts by name", "Number of firing series per alert over time.", "short",
                        query(f'count by (alertname, severity) (ALERTS{{alertstate="firing", {SEL}}})',
                              "{{alertname}} ({{severity}})")))
    d = d.with_panel(_common(statetimeline.Panel(), "Alert timeline", "When each alert was pending or firing.",
                             "short", [query(f'max by (alertname, alertstate) (ALERTS{{{SEL}}})',
                                             "{{alertname}} {{alertstate}}")], 12, 8,
                             thresholds(GREEN, (1, "red")), None))
    d = d.with_row(Row("Raised by the agents themselves"))
    d = d.with_panel(table("Agents' firing and pending alerts", "Alerts the agents' embedded evaluators hold now "
                           "(outrider_alerts): the same rules, evaluated where no Prometheus may run.", "short",
                           query(f'outrider_alerts{{alertstate=~"firing|pending", {SEL}}}', instant=True,
                                 table=True)))
    d = d.with_panel(ts("Agents' alerts active for", "How long each alert of the agents' own evaluation has been "
                        "pending or firing (ALERTS_FOR_STATE under Outrider's prefix).", "s",
                        query(f"time() - outrider_alert_active_since_timestamp_seconds{{{SEL}}}",
                              "{{alertname}} {{instance}}"), width=24))
    d = d.with_panel(ts("Notifications queued", "Alert notifications waiting in each agent's outbox, per receiver: "
                        "above zero for long, a receiver is down or refusing.", "short",
                        query(f"sum by (instance, receiver) (outrider_notify_queued{{{SEL}}})",
                              "{{instance}} {{receiver}}"), width=12))
    d = d.with_panel(ts("Notification failures", "Failed deliveries per second, by receiver and reason (retry: "
                        "429/5xx/timeouts, tried again; rejected: other 4xx, dropped).", "short",
                        query(f"sum by (receiver, reason) (rate(outrider_notify_failed_total{{{SEL}}}[5m]))",
                              "{{receiver}} {{reason}}"), width=12))
    return d
