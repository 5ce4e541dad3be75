"""The metrics reference (docs/metrics.md) rendered from the catalog; `python scripts/generate.py` writes it."""

from __future__ import annotations

from outrider.metrics.catalog import definitions

HEADER = """# Metrics reference

Generated from `agent/outrider/metrics/catalog.py` by `python scripts/generate.py`; a test fails when this file
drifts from the table. Prometheus names follow Prometheus conventions (base units,
`_total` on counters); OpenTelemetry names are semantic-convention names where one exists (marked *semconv*),
`outrider.*` otherwise. Labels are given as `prometheus label` → `OpenTelemetry attribute`; labels in brackets are
present only when their enrichment is on and the value known (the GPU's Kubernetes owner, with
`k8s_pod_resources_socket` set; their Prometheus names are configurable).
"""


def render_reference() -> str:
    out = [HEADER]
    collectors: list[str] = []
    for d in definitions():
        if d.collector not in collectors:
            collectors.append(d.collector)
    for collector in collectors:
        out.append(f"\n## Collector `{collector}`\n")
        out.append("| Prometheus | type | OpenTelemetry | unit | labels | help |")
        out.append("|---|---|---|---|---|---|")
        for d in definitions(collector):
            labels = ", ".join([f"`{lb.prom}`→`{lb.otel}`" if lb.otel else f"`{lb.prom}` (Prometheus only)"
                                for lb in d.labels]
                               + [f"[`{lb.prom}`→`{lb.otel}`]" for lb in d.enrichment]) or "—"
            otel = f"`{d.otel_name}`" + (" *semconv*" if d.semconv else "")
            if d.instrument != d.type:
                otel += f" ({d.instrument})"
            if d.otel_attributes:
                otel += " " + ", ".join(f"`{k}={v}`" for k, v in d.otel_attributes)
            text = d.help.replace("|", "\\|")
            out.append(f"| `{d.name}` | {d.type} | {otel} | `{d.unit}` | {labels} | {text} |")
    return "\n".join(out) + "\n"
