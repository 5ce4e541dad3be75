"""Agents dashboard: Outrider's own health. Which agents run where (version, uptime, Kubernetes identity), what they
cost, whether their sweeps, collectors, scrapes and OTLP exports succeed, the spool they read, and their own alert
evaluation and notification delivery."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, DashboardLink, Row

from outrider.dashboards.panels import GREEN, SEL, dashboard, joined_table, query, runbook, stat, table, thresholds, ts


def _failing() -> DashboardLink:
    return runbook("meta.md", "outridercollectorfailing", "collector failing")


def build() -> Dashboard:
    d = dashboard("outrider-agents", "Outrider / Agents",
                  "Outrider's own health: agents, their cost, sweeps and collectors, scrapes and OTLP exports, the "
                  "hook spool, and their embedded alert evaluation and notifications.", ["agents"],
                  ["namespace", "job", "instance"])
    d = d.with_row(Row("Agents"))
    d = d.with_panel(stat("Agents", "Agents answering scrapes.", "short",
                          query(f"count(outrider_agent_info{{{SEL}}})", instant=True), width=4,
                          links=[runbook("meta.md", "outrideragentdown", "agent down")]))
    d = d.with_panel(joined_table("Versions and uptime", "Each agent's version and time since it started.", [
        ("Version", "short", query(f"max by (instance, version) (outrider_agent_info{{{SEL}}})")),
        ("Uptime", "dtdurations", query(f"time() - max by (instance) (outrider_agent_start_time_seconds{{{SEL}}})")),
    ], width=10, height=6))
    d = d.with_panel(table("Kubernetes identity", "The pod, namespace, node and container each agent runs in (Downward "
                           "API; only the k8s_labels allow-list).", "short",
                           query(f"outrider_k8s_info{{{SEL}}}", instant=True, table=True), width=10, height=6))
    d = d.with_panel(ts("Agent CPU", "CPU the agents use themselves (1 = one core), by mode.", "percentunit",
                        query(f"sum by (instance, mode) (rate(outrider_agent_cpu_seconds_total{{{SEL}}}"
                              "[$__rate_interval]))", "{{instance}} {{mode}}"),
                        th=thresholds(GREEN, (0.1, "orange"), (0.5, "red"))))
    d = d.with_panel(ts("Agent memory", "Resident memory of each agent.", "bytes",
                        query(f"outrider_agent_memory_rss_bytes{{{SEL}}}", "{{instance}}"),
                        th=thresholds(GREEN, (256 << 20, "orange"), (1 << 30, "red"))))
    d = d.with_row(Row("Sweeps and collectors"))
    d = d.with_panel(ts("Sweeps and scrapes", "Sweeps completed and /metrics requests served per second, and "
                        "connections the HTTP server could not accept (out of descriptors: it pauses, never spins).",
                        "short",
                        query(f"rate(outrider_agent_sweeps_total{{{SEL}}}[$__rate_interval])", "sweeps {{instance}}"),
                        query(f"rate(outrider_agent_scrapes_total{{{SEL}}}[$__rate_interval])",
                              "scrapes {{instance}}"),
                        query(f"sum by (instance, reason) (rate(outrider_agent_accept_errors_total{{{SEL}}}"
                              "[$__rate_interval])) or vector(0)", "accept errors {{instance}} {{reason}}")))
    d = d.with_panel(ts("Endpoint connections closed", "Connections the agent's endpoint closed itself per second: "
                        "evicted to make room at max_connections (more clients than the table), or timed out at a "
                        "deadline (a half-sent request, an idle kept-alive connection, a response not read).",
                        "short",
                        query(f"sum by (instance, reason) (rate(outrider_agent_connections_closed_total{{{SEL}}}"
                              "[$__rate_interval]))", "{{reason}} {{instance}}"),
                        th=thresholds(GREEN, (1, "orange"))))
    d = d.with_panel(ts("Sweep duration", "Wall time of the last sweep over all collectors, and of each collector's "
                        "last sweep.", "s",
                        query(f"outrider_agent_sweep_duration_seconds{{{SEL}}}", "all {{instance}}"),
                        query(f"outrider_collector_duration_seconds{{{SEL}}}", "{{collector}} {{instance}}"),
                        th=thresholds(GREEN, (1, "orange"), (3, "red"))))
    d = d.with_panel(ts("Collectors failing or hung", "Collectors whose last sweep failed (1 - success) or that have "
                        "not answered within collector_timeout_s (hung).", "short",
                        query(f"1 - outrider_collector_success{{{SEL}}}", "failed {{collector}} {{instance}}"),
                        query(f"outrider_collector_hung{{{SEL}}}", "hung {{collector}} {{instance}}"),
                        th=thresholds(GREEN, (1, "red")), min_val=0, max_val=1, links=[_failing()]))
    d = d.with_panel(ts("Dropped readings", "Readings each collector could not take (a file it could not read, a "
                        "value that did not parse) per second: dropped and counted, never fatal.", "short",
                        query(f"sum by (collector) (rate(outrider_collector_errors_total{{{SEL}}}[$__rate_interval]))",
                              "{{collector}}"), th=thresholds(GREEN, (0.1, "orange")), links=[_failing()]))
    d = d.with_panel(ts("OTLP exports", "OTLP export attempts per second by result (success, failure, skipped while "
                        "backing off).", "short",
                        query(f"sum by (result) (rate(outrider_agent_otlp_exports_total{{{SEL}}}[$__rate_interval]))",
                              "{{result}}")))
    d = d.with_panel(ts("OTLP receiver requests", "Requests to the agent's own OTLP receiver per second by result "
                        "(accepted, bad_request, too_large, busy: answered 503, aborted, timed_out, evicted): zero "
                        "when the receiver is off.", "short",
                        query(f"sum by (result) (rate(outrider_otlp_receiver_requests_total{{{SEL}}}"
                              "[$__rate_interval])) or vector(0)", "{{result}}")))
    d = d.with_row(Row("Hook spool"))
    d = d.with_panel(ts("Refused and unreadable", "Measurements the hook refused (bad value, invalid name, series "
                        "limit) and shards or series the agent could not read, per interval, by reason.", "short",
                        query(f"sum by (reason) (increase(outrider_hook_dropped_total{{{SEL}}}[$__rate_interval])) "
                              "or vector(0)", "hook: {{reason}}"),
                        query(f"sum by (reason) (increase(outrider_hook_shard_errors_total{{{SEL}}}"
                              "[$__rate_interval])) or vector(0)", "shards: {{reason}}"),
                        th=thresholds(GREEN, (1, "orange"))))
    d = d.with_panel(ts("Retired series", "Series of exited processes the agent still holds so merged counters never "
                        "go backwards (expire after 15 minutes, at most 10,000).", "short",
                        query(f"outrider_hook_retired_series{{{SEL}}}", "{{instance}}"),
                        th=thresholds(GREEN, (5000, "orange"), (9000, "red"))))
    d = d.with_panel(ts("Files refused in the spool", "Files named like shards that each agent refuses now "
                        "(planted or broken: not a regular file, another user's, writable by others, too large, "
                        "truncated, corrupt), by reason; never opened again while unchanged.", "short",
                        query(f"sum by (instance, reason) (outrider_hook_spool_rejected_files{{{SEL}}}) "
                              "or vector(0)", "{{instance}} {{reason}}"),
                        th=thresholds(GREEN, (1, "orange"))))
    d = d.with_panel(ts("Spool owner", "1 for the agent that owns its spool (holds agent.lock, cleans up finished "
                        "processes' shards), 0 for another agent reading the same spool: both report every process, "
                        "so count one of them.", "short",
                        query(f"outrider_hook_spool_owner{{{SEL}}}", "{{instance}}"), min_val=0, max_val=1))
    d = d.with_row(Row("Alert evaluation and notifications"))
    d = d.with_panel(ts("Rule evaluations", "Evaluations per second of the agents' own rule groups, and failed ones "
                        "by rule (the agent's log says why; the rule's alerts keep their state).", "short",
                        query(f"rate(outrider_rule_evaluations_total{{{SEL}}}[$__rate_interval])", "{{instance}}"),
                        query(f"sum by (rule) (rate(outrider_rule_evaluation_failures_total{{{SEL}}}"
                              "[$__rate_interval])) or vector(0)", "failed: {{rule}}"),
                        th=thresholds(GREEN, (0.01, "red"))))
    d = d.with_panel(ts("Rule evaluation duration", "Wall time of the last evaluation of all rule groups.", "s",
                        query(f"outrider_rule_evaluation_duration_seconds{{{SEL}}}", "{{instance}}"),
                        th=thresholds(GREEN, (1, "orange"), (5, "red"))))
    d = d.with_panel(ts("Rule sample store", "Series and samples held for rule evaluation (only those the rules read, "
                        "as far back as they read), and samples it dropped as out of order (above 0: a bug).",
                        "short",
                        query(f"outrider_rule_store_series{{{SEL}}}", "series {{instance}}"),
                        query(f"outrider_rule_store_samples{{{SEL}}}", "samples {{instance}}"),
                        query(f"increase(outrider_rule_store_out_of_order_samples_total{{{SEL}}}[$__rate_interval])",
                              "out of order {{instance}}")))
    d = d.with_panel(ts("Rule sample store memory", "Approximate memory of the rule evaluation's sample store.",
                        "bytes", query(f"outrider_rule_store_bytes{{{SEL}}}", "{{instance}}"),
                        th=thresholds(GREEN, (64 << 20, "orange"))))
    d = d.with_panel(ts("Notifications sent", "Notifications per second each receiver confirmed.", "short",
                        query(f"sum by (receiver, type) (rate(outrider_notify_sent_total{{{SEL}}}[$__rate_interval]))",
                              "{{receiver}} ({{type}})")))
    d = d.with_panel(ts("Notification backlog", "Age of the oldest notification waiting in each receiver's outbox, "
                        "notifications the outbox could not write to disk (held in memory meanwhile), and those "
                        "dropped undelivered (outbox full, or unreadable at start).", "s",
                        query(f"max by (receiver) (outrider_notify_oldest_queued_age_seconds{{{SEL}}})",
                              "oldest {{receiver}}"),
                        query(f"sum by (receiver) (increase(outrider_notify_outbox_write_errors_total{{{SEL}}}"
                              "[$__rate_interval]))", "write errors {{receiver}}"),
                        query(f"sum by (receiver, reason) (increase(outrider_notify_dropped_total{{{SEL}}}"
                              "[$__rate_interval]))", "dropped {{receiver}} ({{reason}})"),
                        th=thresholds(GREEN, (300, "orange"), (1800, "red"))))
    return d
