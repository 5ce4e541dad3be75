"""Inference service dashboard: traffic, errors, latency percentiles and heatmap, queue against compute, batching,
streaming (time to first token), GPU."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from outrider.dashboards.panels import (
    GREEN,
    SEL,
    dashboard,
    heatmap,
    percentiles,
    query,
    runbook,
    stat,
    thresholds,
    ts,
)
from outrider.dashboards.training import firing_alerts_annotation

S = f'{SEL}, route=~"$route"'
DUR = f"outrider_request_duration_seconds_bucket{{{S}}}"


def build() -> Dashboard:
    d = dashboard("outrider-inference", "Outrider / Inference service",
                  "Requests, errors, latency, batching and streaming of an inference service, by route.",
                  ["inference"], ["namespace", "job", "instance", "route"]).annotation(firing_alerts_annotation())
    d = d.with_row(Row("Traffic"))
    d = d.with_panel(stat("Requests/s", "Requests finished per second.", "reqps",
                          query(f"sum(rate(outrider_requests_total{{{S}}}[$__rate_interval]))", instant=True)))
    d = d.with_panel(stat("Error ratio", "Share of requests answering 5xx.", "percentunit",
                          query(f'sum(rate(outrider_requests_total{{{S}, status_class="5xx"}}[$__rate_interval])) '
                                f"/ sum(rate(outrider_requests_total{{{S}}}[$__rate_interval])) or vector(0)",
                                instant=True),
                          th=thresholds(GREEN, (0.01, "orange"), (0.05, "red")),
                          links=[runbook("degradation.md", "errorratespike", "error spike")]))
    d = d.with_panel(stat("p99 latency", "99th percentile request latency, all selected routes.", "s",
                          query(f"histogram_quantile(0.99, sum by (le) (rate({DUR}[$__rate_interval])))",
                                instant=True),
                          th=thresholds(GREEN, (0.5, "orange"), (1, "red")),
                          links=[runbook("degradation.md", "latencyslo", "latency SLO")]))
    d = d.with_panel(stat("In flight", "Requests being served now.", "short",
                          query(f"sum(outrider_requests_in_flight{{{SEL}}})", instant=True)))
    d = d.with_panel(ts("Requests/s by route and status", "Finished requests by route template and status class.",
                        "reqps", query(f"sum by (route, status_class) (rate(outrider_requests_total{{{S}}}"
                                       "[$__rate_interval]))", "{{route}} {{status_class}}")))
    d = d.with_panel(ts("Errors/s", "4xx and 5xx answers per second.", "reqps",
                        query(f'sum by (route, status_class) (rate(outrider_requests_total{{{S}, '
                              f'status_class=~"4xx|5xx"}}[$__rate_interval]))', "{{route}} {{status_class}}"),
                        th=thresholds(GREEN, (1, "red"))))
    d = d.with_row(Row("Latency"))
    d = d.with_panel(ts("Latency p50 / p90 / p99", "Request latency percentiles.", "s",
                        *percentiles(DUR, 0.5, 0.9, 0.99),
                        th=thresholds(GREEN, (0.5, "red")),
                        links=[runbook("degradation.md", "inferencelatencyp99regression", "latency regression")]))
    d = d.with_panel(heatmap("Latency heatmap", "Requests per latency bucket over time.", "s",
                             query(f"sum by (le) (increase({DUR}[$__rate_interval]))", "{{le}}")))
    d = d.with_panel(ts("Queue against compute", "Time requests spent queued and computing, as the server reports "
                        "them (outrider.record_phase).", "s",
                        *percentiles(f"outrider_request_phase_duration_seconds_bucket{{{SEL}}}", 0.5, by="le, phase",
                                     legend=" {{phase}}")))
    d = d.with_panel(ts("Batch size", "Requests per batch in a batching server (p50, p99).", "short",
                        *percentiles(f"outrider_inference_batch_size_bucket{{{SEL}}}", 0.5, 0.99)))
    d = d.with_row(Row("Streaming"))
    d = d.with_panel(ts("Time to first token", "Time from request start to the first streamed chunk (p50, p99).",
                        "s", *percentiles(f"outrider_inference_time_to_first_token_seconds_bucket{{{S}}}", 0.5, 0.99)))
    d = d.with_panel(ts("Inter-token latency", "Time between streamed chunks (p50, p99).", "s",
                        *percentiles(f"outrider_inference_inter_token_latency_seconds_bucket{{{S}}}", 0.5, 0.99)))
    d = d.with_row(Row("GPU"))
    d = d.with_panel(ts("GPU utilisation", "Kernel-time utilisation of the service's GPUs.", "percentunit",
                        query(f'avg by (gpu) (outrider_gpu_utilization_ratio{{{SEL}, task="general"}})',
                              "GPU {{gpu}}"), min_val=0, max_val=1))
    d = d.with_panel(ts("GPU memory used", "Device memory in use against capacity.", "percentunit",
                        query(f"sum by (gpu) (outrider_gpu_memory_used_bytes{{{SEL}}}) / "
                              f"sum by (gpu) (outrider_gpu_memory_total_bytes{{{SEL}}})", "GPU {{gpu}}"),
                        th=thresholds(GREEN, (0.9, "orange"), (0.95, "red")), min_val=0, max_val=1,
                        links=[runbook("exhaustion.md", "gpumemorynearlyfull", "GPU memory")]))
    return d
