"""Dashboards as code: committed JSON matches the code, validates against Grafana's JSON schema, every panel is
complete and every query parses; with the real Prometheus scraping a real agent (hook workload, fake-NVML GPUs and
the rule file loaded), every query of every panel, variable and annotation returns data."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import promql_parser
import pytest

from outrider.dashboards import render_all
from tests.gpu.conftest import Scenario
from tests.gpu.test_gpu_collector import FULL
from tests.helpers import REPO, AgentProcess, wait_until
from tests.integration.servers import PrometheusServer

SCHEMAS = REPO.parent / "shared" / "grafana-schema"
DASHBOARDS = {name: json.loads(text) for name, text in render_all().items()}
VARIABLES = {"$namespace": ".*", "$job": ".*", "$instance": ".*", "$rank": ".*", "$gpu": ".*", "$route": ".*",
             "$__rate_interval": "1m"}


def schema(name: str, ref: str | None = None) -> dict[str, Any]:
    path = SCHEMAS / name
    if not path.exists():
        pytest.fail(f"{path} missing: the Grafana schemas come with shared/ beside the repository")
    doc = json.loads(path.read_text())
    threshold = doc.get("definitions", {}).get("Threshold", {}).get("properties", {}).get("value")
    if threshold is not None and "Nulls currently appear here" in threshold.get("description", ""):
        # The base threshold step is -Infinity, which Grafana itself writes as null; the schema's own description
        # says so. Allow exactly that, nothing else.
        threshold["type"] = ["number", "null"]
    return {**doc, "$ref": f"#/definitions/{ref}"} if ref else doc


def panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in d["panels"] if p["type"] != "row"]


def expand(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def queries(d: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, PromQL) of every panel target, variable and annotation of a dashboard."""
    out = [(f"{p['title']} / {t['refId']}", t["expr"]) for p in panels(d) for t in p.get("targets", [])]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"])
            assert m, v["query"]
            out.append((f"variable {v['name']}", f"count by ({m.group(2)}) ({m.group(1)})"))
    for a in d.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append((f"annotation {a['name']}", a["expr"]))
    return out


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_valid_against_grafanas_schemas(name: str) -> None:
    d = DASHBOARDS[name]
    jsonschema.validate(d, schema("dashboard.jsonschema.json"))
    for p in panels(d):
        for t in p.get("targets", []):
            jsonschema.validate(t, schema("prometheus.jsonschema.json"))
        if p["type"] == "timeseries":
            jsonschema.validate(p.get("options", {}), schema("timeseries.jsonschema.json", "Options"))
            jsonschema.validate(p["fieldConfig"]["defaults"].get("custom", {}),
                                schema("timeseries.jsonschema.json", "FieldConfig"))
        if p["type"] == "stat":
            jsonschema.validate(p.get("options", {}), schema("stat.jsonschema.json", "Options"))


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_is_complete_and_every_query_parses(name: str) -> None:
    d = DASHBOARDS[name]
    assert {v["name"] for v in d["templating"]["list"]} >= {"datasource", "namespace", "job", "instance"}
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    for p in panels(d):
        assert p["description"].strip(), p["title"]
        assert p["fieldConfig"]["defaults"]["unit"], p["title"]
        assert p["fieldConfig"]["defaults"]["thresholds"]["steps"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        for link in p.get("links", []):
            m = re.search(r"alerts/runbooks/(\w+\.md)#(\w+)$", link["url"])
            assert m, link
            text = (REPO / "alerts" / "runbooks" / m.group(1)).read_text()
            assert any(re.sub(r"[^a-z0-9]", "", line[3:].lower()) == m.group(2) for line in text.splitlines()
                       if line.startswith("## ")), link
    for what, expr in queries(d):
        try:
            promql_parser.parse(expand(expr))
        except Exception as e:
            pytest.fail(f"{name}: {what}: {expr!r} does not parse: {e}")


def test_dashboards_cover_the_numbers_that_matter() -> None:
    text = json.dumps(DASHBOARDS)
    for metric in ("outrider_train_step_duration_seconds_bucket", "outrider_samples_total", "outrider_tokens_total",
                   "outrider_train_data_wait_seconds", "outrider_gpu_sm_activity_ratio", "outrider_torch_cuda_memory",
                   "outrider_request_duration_seconds_bucket", "outrider_request_phase_duration_seconds_bucket",
                   "outrider_inference_time_to_first_token_seconds", "outrider_gpu_clock_event_active",
                   "outrider_gpu_xid_errors_total", "outrider_gpu_nvlink_bytes_total", "outrider_gpu_process_memory",
                   "outrider_host_pressure_stalled_seconds_total", "outrider_host_filesystem_avail_bytes", "ALERTS",
                   "outrider_alerts", "outrider_notify_queued", "outrider_notify_failed_total"):
        assert metric in text, metric
    assert any(p["type"] == "heatmap" for p in panels(DASHBOARDS["outrider-inference.json"]))


@pytest.mark.integration
def test_every_query_returns_data_from_the_real_prometheus(fake_nvml: dict[str, str], scenario: Scenario,
                                                           tmp_path: Path) -> None:
    scenario.write(FULL + "gpu 0 proc 4242 1073741824 50\ngpu 0 remap_failure 1\ngpu 0 xid 1 13\n")
    spool, hold = tmp_path / "spool", tmp_path / "hold"
    env = {"LD_LIBRARY_PATH": os.path.dirname(fake_nvml["full"]), "FAKE_NVML_SCENARIO": str(scenario.path),
           "OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2"}
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    publisher = subprocess.Popen([sys.executable, str(Path(__file__).with_name("publisher.py")), str(hold)],
                                 env={**base, **env, "RANK": "0"})
    try:
        with AgentProcess(env=env, interval_s=0.5) as agent, \
                PrometheusServer(tmp_path / "prom", [f"127.0.0.1:{agent.port}"],
                                 rule_files=[str(REPO / "alerts" / "outrider.rules.yaml")]) as prom:
            prom.wait_for("rate(outrider_train_steps_total[1m]) > 0", timeout_s=90)
            prom.wait_for('ALERTS{alertname="GPURowRemapFailure", alertstate="firing"}', timeout_s=90)
            prom.wait_for("rate(outrider_host_cpu_seconds_total[1m])", timeout_s=90)
            empty: list[str] = []
            for name, d in sorted(DASHBOARDS.items()):
                for what, expr in queries(d):
                    def answered(e: str = expr) -> bool:
                        return bool(prom.query(expand(e)))
                    try:
                        wait_until(answered, timeout_s=20, interval_s=1, what=what)
                    except AssertionError:
                        empty.append(f"{name}: {what}: {expr}")
            assert empty == [], "queries without data:\n" + "\n".join(empty)
    finally:
        hold.write_text("x")
        publisher.wait(timeout=30)
