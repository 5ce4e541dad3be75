"""Prometheus's names: its grammar, and the names it keeps for itself, which nothing that enters the agent may carry
out of it.

A scraped target's own samples share their names and labels with what Prometheus records about the scrape: a page
that says `up 0` is stored as the target's `up` (Prometheus then records the healthy agent as down), and a sample
with a label `__name__` (`weird{__name__="x"} 1`) fails the whole scrape (a label name given twice), so one line
of a workload's page would take every series of the agent's target with it. Labels starting with `__` are
Prometheus's internal ones, and `ALERTS`/`ALERTS_FOR_STATE` are the series its rule evaluation writes.

Every way in applies these: the hook refuses such a custom metric at registration and the spool's reader refuses
such an entry (what the workload chose itself is an error to tell it about); the workload's own instrumentation
(scraped pages, prometheus_client's multiprocess files, OTLP pushed to the receiver, annotated pods) is renamed the
way Prometheus renames a target's labels that collide with its own: `exported_<name>` (metrics/foreign.py), so its
values are kept. A name outside Prometheus's grammar, or a label given twice, fails a scrape as well (`valid`):
what is read from a file or a page with one is left out. Standard library only: the hook and the spool import it.
"""

from __future__ import annotations

import re

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# What Prometheus writes for every scrape (with --enable-feature=extra-scrape-metrics the last three), and for its
# alerting rules: a target's sample of the same name is taken for it.
PROMETHEUS_SERIES = frozenset({
    "up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
    "scrape_series_added", "scrape_timeout_seconds", "scrape_sample_limit", "scrape_body_size_bytes",
    "ALERTS", "ALERTS_FOR_STATE",
})
INTERNAL_PREFIX = "__"  # Prometheus's internal labels (__name__, __address__, __meta_*) and reserved names
EXPORTED_PREFIX = "exported_"


def valid(name: str, label_names: tuple[str, ...]) -> str:
    """Why a metric with these names cannot be exposed ("" when it can): a name outside Prometheus's grammar, or a
    label given twice (either fails a whole scrape)."""
    if not METRIC_NAME.fullmatch(name):
        return f"{name[:80]!r} is not a Prometheus metric name"
    for label in label_names:
        if not LABEL_NAME.fullmatch(label):
            return f"{label[:80]!r} is not a Prometheus label name"
    if len(set(label_names)) != len(label_names):
        return "a label name given twice"
    return ""


def reserved_metric(name: str) -> bool:
    """Whether a metric of this name would be taken for a series Prometheus writes itself."""
    return name in PROMETHEUS_SERIES or name.startswith(INTERNAL_PREFIX)


def reserved_label(name: str) -> bool:
    """Whether a label of this name is one of Prometheus's internal ones (`__name__` among them)."""
    return name.startswith(INTERNAL_PREFIX)


def exported(name: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """The name as Prometheus renames a target's label that collides with its own: `exported_<name>`, prefixed
    again while the result is taken."""
    name = EXPORTED_PREFIX + name
    while name in taken:
        name = EXPORTED_PREFIX + name
    return name
