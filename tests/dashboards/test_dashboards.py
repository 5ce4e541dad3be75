"""Dashboards as code: committed JSON matches the code, validates against Grafana's JSON schema, every panel is
complete and every query parses, every metric of the catalog is shown somewhere, links follow the one documentation
URL; with the real Prometheus scraping a real agent (hook workload, fake-NVML GPUs owned by pods of a fake kubelet,
MIG devices, the rule file loaded, OTLP export on), every query of every panel, variable and annotation returns
data."""

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
import yaml

from outrider.dashboards import render_all
from outrider.ground import links
from outrider.kernel import cgroupfs
from outrider.metrics.catalog import CATALOG
from tests.fakes.kubelet import FakeKubelet, short_socket_dir
from tests.gpu.conftest import Scenario
from tests.gpu.test_gpu_attribution import PODS, SCENARIO
from tests.helpers import REPO, AgentProcess, reap, wait_until
from tests.servers import OtlpHttpReceiver, PrometheusServer

SCHEMAS = REPO.parent / "shared" / "grafana-schema"
DASHBOARDS = {name: json.loads(text) for name, text in render_all().items()}
VARIABLES = {"$namespace": ".*", "$job": ".*", "$node": ".*", "$instance": ".*", "$workload_namespace": ".*",
             "$workload_pod": ".*", "$rank": ".*", "$gpu": ".*", "$route": ".*", "$__rate_interval": "1m",
             "$__range": "5m"}
# Metrics no dashboard shows, each with the reason. Empty: every metric Outrider exports is on a panel.
NOT_ON_A_DASHBOARD: dict[str, str] = {}
# Series that exist only where the machine has what they report on: queried, but allowed to be empty when it lacks it.
ABSENT_WITHOUT_A_LIMIT = {
    "outrider_cgroup_memory_limit_bytes": "absent by design where the agent's cgroup has no memory limit (a test "
                                          "machine); tests/collectors/test_host_collector.py reads limits from "
                                          "fixture trees",
}
ABSENT_WITHOUT_A_CPU_LIMIT = {
    "outrider_cgroup_cpu_limit_cores": "absent by design where the agent's cgroup has no CFS quota; the host "
                                       "collector's tests read quotas from fixture trees",
}
# Series that exist only once what they count happened: queried, but allowed to be empty here.
ABSENT_WITHOUT_AN_EVENT = {
    "outrider_oom_victim_kills_total": "a victim's series appears with its first OOM kill (the oom collector's and "
                                       "`outrider run`'s OOM tests make kills)",
    "outrider_oom_kernel_log_readable{": "queried as == 0: empty where the kernel log is readable",
}


def own_cpu_limit() -> bool:
    """Whether this process's cgroup has a CFS quota, as the agent's own cgroup reader sees it."""
    cg = cgroupfs.find_cpu_cgroup("/proc", "/sys")
    try:
        return cg is not None and cgroupfs.read_cpu(cg).limit_cores is not None
    except (OSError, ValueError):
        return False


def own_memory_limit() -> bool:
    """Whether this process's cgroup (the agent's, which the test starts) has a memory limit set, as the agent's own
    cgroup reader sees it."""
    cg = cgroupfs.find_memory_cgroup("/proc", "/sys")
    try:
        return cg is not None and cgroupfs.read_memory(cg).limit_bytes is not None
    except (OSError, ValueError):
        return False


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
    for definition, field in (("DynamicConfigValue", "value"), ("MatcherConfig", "options")):
        anything = doc.get("definitions", {}).get(definition, {}).get("properties", {}).get(field)
        if anything is not None and anything.get("type") == "object" and anything.get("additionalProperties") == {}:
            # Grafana's CUE schema declares an override's value and a matcher's options as `_` (any value: a unit
            # or a field name is a string, a threshold set an object); the JSON-schema export renders that `_` as
            # an object, and grafana-foundation-sdk types both `object` (any). Allow any JSON value there only.
            anything.pop("type")
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


def used_metrics(dashboards: dict[str, dict[str, Any]]) -> set[str]:
    """The catalog metrics some panel, variable or annotation query of the dashboards reads."""
    text = "\n".join(expr for d in dashboards.values() for _, expr in queries(d))
    used = set()
    for name, defn in CATALOG.items():
        suffix = "(_bucket|_sum|_count)?" if defn.type == "histogram" else ""
        if re.search(rf"\b{re.escape(name)}{suffix}\b", text):
            used.add(name)
    return used


def test_every_metric_of_the_catalog_is_on_a_dashboard() -> None:
    unused = sorted(set(CATALOG) - used_metrics(DASHBOARDS) - set(NOT_ON_A_DASHBOARD))
    assert unused == [], "metrics collected but shown on no dashboard:\n" + "\n".join(unused)
    assert not set(NOT_ON_A_DASHBOARD) - set(CATALOG), "the exclusion list names a metric that does not exist"


def test_the_unused_metric_check_sees_a_missing_panel() -> None:
    gpu_node = json.loads(render_all()["outrider-gpu-node.json"])
    gpu_node["panels"] = [p for p in gpu_node["panels"] if p["title"] != "Performance state"]
    assert "outrider_gpu_performance_state" not in used_metrics({**DASHBOARDS, "outrider-gpu-node.json": gpu_node})


def test_node_pod_and_gpu_variables_narrow_each_other() -> None:
    variables = {v["name"]: v for v in DASHBOARDS["outrider-gpu-node.json"]["templating"]["list"]}
    names = list(variables)
    assert names.index("node") < names.index("instance") < names.index("workload_namespace") \
        < names.index("workload_pod") < names.index("gpu")
    assert '$node' in variables["instance"]["query"]
    assert "exported_pod" in variables["workload_pod"]["query"] and "$workload_namespace" in \
        variables["workload_pod"]["query"]
    assert "$workload_pod" in variables["gpu"]["query"]
    for p in panels(DASHBOARDS["outrider-gpu-node.json"]):
        for t in p.get("targets", []):
            if re.search(r"outrider_gpu_(?!count|nvml_up)\w+\{", t["expr"]):
                assert 'exported_pod=~"$workload_pod"' in t["expr"], (p["title"], t["expr"])


def test_the_process_table_has_nvitops_columns() -> None:
    table = next(p for p in panels(DASHBOARDS["outrider-gpu-node.json"]) if p["title"] == "Processes on the GPUs")
    columns = {o["matcher"]["options"]: {pr["id"]: pr["value"] for pr in o["properties"]}
               for o in table["fieldConfig"]["overrides"]}
    names = {c["displayName"]: c["unit"] for c in columns.values()}
    assert names == {"GPU memory": "bytes", "SM share": "percentunit", "CPU": "percentunit", "Host memory": "bytes",
                     "Running": "dtdurations", "User and command": "short"}
    exprs = " ".join(t["expr"] for t in table["targets"])
    for metric in ("outrider_gpu_process_memory_bytes", "outrider_gpu_process_sm_utilization_ratio",
                   "outrider_process_cpu_seconds_total", "outrider_process_memory_rss_bytes",
                   "outrider_process_start_time_seconds", "outrider_process_info"):
        assert metric in exprs
    assert table["transformations"][0]["id"] == "merge"


def test_every_link_starts_with_the_one_documentation_url() -> None:
    mirror = "https://wiki.example.com/outrider/"
    for name, text in render_all(mirror).items():
        d = json.loads(text)
        urls = [link["url"] for p in panels(d) for link in p.get("links", [])] + \
            [link["url"] for link in d.get("links", []) if link.get("url")]
        assert urls and all(u.startswith(mirror) for u in urls), name
        assert links.DEFAULT_DOCS_URL not in text, name
    assert render_all() == {n: t.replace(mirror, links.DEFAULT_DOCS_URL) for n, t in render_all(mirror).items()}


def test_the_rule_files_runbook_urls_use_the_same_documentation_url() -> None:
    rules = yaml.safe_load((REPO / "alerts" / "outrider.rules.yaml").read_text())
    urls = [r["annotations"]["runbook_url"] for g in rules["groups"] for r in g["rules"]
            if "runbook_url" in r.get("annotations", {})]
    assert urls and all(u.startswith(links.DEFAULT_DOCS_URL + links.RUNBOOKS) for u in urls)
    assert links.rebase(urls[0], "https://wiki.example.com/o") == \
        "https://wiki.example.com/o/" + urls[0][len(links.DEFAULT_DOCS_URL):]


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
    spool, hold = tmp_path / "spool", tmp_path / "hold"
    env = {"LD_LIBRARY_PATH": os.path.dirname(fake_nvml["full"]), "FAKE_NVML_SCENARIO": str(scenario.path),
           "OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2"}
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    publisher = subprocess.Popen([sys.executable, str(Path(__file__).with_name("publisher.py")), str(hold)],
                                 env={**base, **env, "RANK": "0"})
    # The publisher is the compute process on GPU 0 (owned by the research/train-0 pod), so that the process table
    # joins NVML's view of it with the process collector's; GPU 1 has MIG devices, one owned by serving/llm-0.
    scenario.write(SCENARIO.replace("gpu 0 proc 4242", f"gpu 0 proc {publisher.pid}")
                   + "gpu 0 remap_failure 1\ngpu 0 xid 1 13\ngpu 0 nvlinks 2\ngpu 0 nvlink_error 0 2 5\n")
    try:
        with short_socket_dir() as sock_dir, FakeKubelet(os.path.join(sock_dir, "kubelet.sock"), PODS), \
                OtlpHttpReceiver() as receiver:
            agent_env = {**env, "OUTRIDER_K8S_POD_RESOURCES_SOCKET": os.path.join(sock_dir, "kubelet.sock"),
                         "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OUTRIDER_OTLP_INTERVAL_S": "1",
                         "POD_NAME": "outrider-node-abcde", "POD_NAMESPACE": "monitoring", "NODE_NAME": "gpu-node-1"}
            with AgentProcess("--pid", str(publisher.pid), env=agent_env, interval_s=0.5) as agent, \
                    PrometheusServer(tmp_path / "prom", [f"127.0.0.1:{agent.port}"],
                                     rule_files=[str(REPO / "alerts" / "outrider.rules.yaml")]) as prom:
                prom.wait_for("rate(outrider_train_steps_total[1m]) > 0", timeout_s=90)
                prom.wait_for('ALERTS{alertname="GPURowRemapFailure", alertstate="firing"}', timeout_s=90)
                prom.wait_for("rate(outrider_host_cpu_seconds_total[1m])", timeout_s=90)
                prom.wait_for(f'outrider_gpu_process_memory_bytes{{pid="{publisher.pid}", exported_pod="train-0"}}',
                              timeout_s=60)
                empty: list[str] = []
                absent_here = [*ABSENT_WITHOUT_AN_EVENT, *([] if own_memory_limit() else ABSENT_WITHOUT_A_LIMIT),
                               *([] if own_cpu_limit() else ABSENT_WITHOUT_A_CPU_LIMIT)]
                for name, d in sorted(DASHBOARDS.items()):
                    for what, expr in queries(d):
                        def answered(e: str = expr) -> bool:
                            return bool(prom.query(expand(e)))
                        try:
                            wait_until(answered, timeout_s=20, interval_s=1, what=what)
                        except AssertionError:
                            if not any(m in expr for m in absent_here):
                                empty.append(f"{name}: {what}: {expr}")
                assert empty == [], "queries without data:\n" + "\n".join(empty)
                narrowed = ('outrider_gpu_up{exported_pod="llm-0"} or '
                            'outrider_gpu_mig_memory_used_bytes{exported_pod="llm-0"}')
                assert {r["metric"].get("mig_uuid") for r in prom.query(narrowed)} == {"MIG-aaaa"}, \
                    "a workload pod selects its own MIG device, not the whole GPU"
    finally:
        hold.write_text("x")
        reap([publisher], timeout_s=30)
