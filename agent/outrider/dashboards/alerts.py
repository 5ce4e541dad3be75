"""Alerts overview: what fires now, by severity, and the alert history."""

from __future__ import annotations

from grafana_foundation_sdk.builders import statetimeline
from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from outrider.dashboards.panels import GREEN, SEL, _common, dashboard, query, stat, table, thresholds, ts


def build() -> Dashboard:
    d = dashboard("outrider-alerts", "Outrider / Alerts", "Outrider's alerts (alerts/outrider.rules.yaml) as "
                  "Prometheus evaluates them: firing now, by severity, and over time. Each alert's runbook_url "
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
    return d
