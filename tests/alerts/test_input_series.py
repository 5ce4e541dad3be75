"""Rule tests feed only series the exporter produces: every input series of alerts/tests/*.test.yaml has a name the
agent exports (metrics/catalog.py) and exactly its label set, plus the target labels Prometheus and the Helm chart's
monitors attach. A rule test that feeds `outrider_requests_total` without `method`, `scheme` and `status_code`
passes with rules that split every page by status code in production (alerts v3, item 1); this test refuses it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from outrider.metrics.catalog import BY_RANK, CATALOG, MetricDef
from outrider.rules.promtest import parse_series
from tests.helpers import REPO, AgentProcess, samples, wait_until

TESTS = sorted((REPO / "alerts" / "tests").glob("*.test.yaml"))

# Labels a scrape attaches to every series of a target: Prometheus's job and instance; the prometheus-operator's
# namespace, pod, container, endpoint and service; the chart's monitors' node and agent_role (the role of the
# agent: "node" for the DaemonSet, "sidecar" for a workload's own agent; helm/outrider/templates/*monitor.yaml).
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "node", "container", "endpoint", "service",
                           "agent_role"})
# Series of other exporters the rules read (Prometheus's own, Alertmanager's, kube-state-metrics' for the optional
# group): not the agent's to check.
FOREIGN = re.compile(r"(up|ALERTS|ALERTS_FOR_STATE|prometheus_\w+|alertmanager_\w+|kube_\w+)")


def _definition(name: str) -> tuple[MetricDef, bool] | None:
    """The definition a series name belongs to, and whether it is a histogram's bucket series."""
    if name in CATALOG:
        return CATALOG[name], False
    for suffix in ("_bucket", "_sum", "_count"):
        base = name.removesuffix(suffix)
        if base != name and base in CATALOG and CATALOG[base].type == "histogram":
            return CATALOG[base], suffix == "_bucket"
    return None


def problems(series: str) -> list[str]:
    """What is wrong with one input series, as its test file writes it (empty: it is one the agent exports)."""
    name, pairs = parse_series(series)
    labels = {k: v for k, v in pairs if v != ""}  # an empty label is no label (Prometheus drops it)
    if name == "up":
        extra = set(labels) - TARGET_LABELS
        return [f"up carries only target labels, not {sorted(extra)}"] if extra else []
    if FOREIGN.fullmatch(name):
        return []
    found = _definition(name)
    if found is None:
        return [f"{name} is not a metric the agent exports"]
    defn, bucket = found
    own = set(labels) - TARGET_LABELS - ({"le"} if bucket else set())
    # rank and training_job are empty where the process has none (a service, a job without an identity), and
    # enrichment only where its source is configured: Prometheus stores an empty label as no label
    optional = {lb.prom for lb in (*BY_RANK, *defn.enrichment, *defn.labels) if lb in BY_RANK or lb.optional
                or lb in defn.enrichment}
    known = set(defn.label_names) | {lb.prom for lb in defn.enrichment}
    out = []
    if bucket and "le" not in labels:
        out.append(f"{name}: a bucket without le")
    if missing := set(defn.label_names) - optional - own:
        out.append(f"{name}: missing {sorted(missing)}")
    if unknown := own - known:
        out.append(f"{name}: the agent exports no {sorted(unknown)}")
    code, cls = labels.get("status_code"), labels.get("status_class")
    if code and cls and cls != code[0] + "xx":
        out.append(f"{name}: status_class {labels['status_class']} of status code {labels['status_code']}")
    return out


def input_series(path: Path) -> list[str]:
    doc = yaml.safe_load(path.read_text())
    return [s["series"] for case in doc["tests"] for s in case.get("input_series") or []]


@pytest.mark.parametrize("path", TESTS, ids=lambda p: p.name)
def test_every_input_series_is_one_the_agent_exports(path: Path) -> None:
    bad = {f"{s}: {p}" for s in input_series(path) for p in problems(s)}
    assert sorted(bad) == []


@pytest.mark.parametrize(("series", "complaint"), [
    # what the old request tests fed: no method, scheme or status code
    ('outrider_requests_total{job="outrider",instance="a:9477",route="/v1/chat",status_class="5xx"}',
     "missing ['method', 'scheme', 'status_code']"),
    ('outrider_request_duration_seconds_bucket{job="outrider",instance="a",route="/",method="GET",scheme="http",'
     'status_code="200",status_class="2xx"}', "a bucket without le"),
    ('outrider_requests_total{job="o",instance="a",route="/",method="GET",scheme="http",status_code="504",'
     'status_class="2xx"}', "status_class 2xx of status code 504"),
    ('outrider_gpu_temperature_celsius{job="o",instance="a",gpu="0",uuid="GPU-1",model="H100",sensor="memory",'
     'colour="red"}', "the agent exports no ['colour']"),
    ('outrider_gpu_temprature_celsius{job="o",instance="a"}', "not a metric the agent exports"),
    ('up{job="outrider",instance="a",rank="0"}', "only target labels"),
])
def test_the_check_refuses_series_the_agent_never_produces(series: str, complaint: str) -> None:
    assert any(complaint in p for p in problems(series)), problems(series)


def test_the_check_takes_the_real_label_sets() -> None:
    ok = [
        'outrider_requests_total{job="outrider",instance="a:9477",namespace="s",pod="p",route="/v1/chat",'
        'method="POST",scheme="http",status_code="500",status_class="5xx"}',
        # rank and training_job are empty for a service (Prometheus drops empty labels)
        'outrider_request_duration_seconds_bucket{job="o",instance="a",route="/",method="GET",scheme="https",'
        'status_code="200",status_class="2xx",le="0.5"}',
        'outrider_train_steps_total{job="o",instance="a",rank="3",training_job="llm"}',
        # a GPU with its Kubernetes owner (enrichment), and without
        'outrider_gpu_utilization_ratio{job="o",instance="a",node="n1",gpu="0",uuid="GPU-1",model="H100",'
        'task="general",exported_namespace="ml",exported_pod="train-0"}',
        'up{job="outrider",instance="a",namespace="m",pod="outrider-x",node="n1",agent_role="node"}',
    ]
    assert {s: problems(s) for s in ok} == {s: [] for s in ok}


def test_the_real_exposition_of_request_series_passes_the_check(tmp_path: Path) -> None:
    """The check's label sets are the exporter's: a hooked process records requests as the WSGI/ASGI middleware do,
    the real agent publishes them, and every request series of its /metrics (with the job and instance a scrape
    adds) passes the check, carrying route, method, scheme, status_code and status_class."""
    spool, hold = tmp_path / "spool", tmp_path / "hold"
    env = {"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2"}
    script = tmp_path / "served.py"
    script.write_text(textwrap.dedent(f"""
        import os, time
        import outrider
        from outrider.hook import api
        outrider.instrument()
        while not os.path.exists({str(hold)!r}):
            api.record_request(0.02, "/v1/chat", 200, "POST", "http")
            api.record_request(0.60, "/v1/chat", 504, "POST", "http")
            time.sleep(0.05)
    """))
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    with AgentProcess(env=env, interval_s=0.5) as agent:
        served = subprocess.Popen([sys.executable, str(script)], env={**base, **env})
        try:
            def request_series() -> list[str] | None:
                found = [name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"
                         for name, labels in samples(agent.metrics())
                         if name.startswith(("outrider_requests_total", "outrider_request_duration_seconds"))]
                return found if any('status_code="504"' in f for f in found) else None

            exposed = wait_until(request_series, timeout_s=30, what="request series on /metrics")
        finally:
            hold.touch()
            served.wait(timeout=30)
    assert exposed is not None
    scraped = [s.replace("{", '{job="outrider",instance="10.0.0.1:9477",', 1) for s in exposed]
    assert {s: problems(s) for s in scraped} == {s: [] for s in scraped}
    counts = [s for s in scraped if s.startswith("outrider_requests_total{")]
    assert {tuple(sorted(k for k, _ in parse_series(s)[1])) for s in counts} == {
        ("instance", "job", "method", "route", "scheme", "status_class", "status_code")}
