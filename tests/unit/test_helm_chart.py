"""The Helm chart, rendered by the real Helm Go SDK (helm-python-sdk), linted, and every manifest validated against
the Kubernetes schemas of two versions (kubernetes-validate --strict); the security and wiring properties asserted;
the chart's copies of the rules and dashboards and the rendered examples kept current; the image definition
checked as far as possible without a Docker engine."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
import yaml

from tests.helpers import REPO

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is a dev dependency (.ci/run installs it)")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

CHART = REPO / "helm" / "outrider"
VALUES_FILES = [None, *sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))]
K8S_VERSIONS = ("1.29.0", "1.33.0")
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def render(values_file: str | None, overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    values = yaml.safe_load((CHART / "ci" / values_file).read_text()) if values_file else {}
    values = {**values, **(overrides or {})}
    chart = helm.Chart.load(str(CHART))
    out = chart.render(values, name="outrider", namespace="monitoring")
    return [d for path, text in sorted(out.items()) if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def kind(docs: list[dict[str, Any]], k: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == k]


def pod_specs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("DaemonSet", "Deployment", "Job")]


def test_lint_is_clean() -> None:
    report = helm.lint(str(CHART), strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values_file", VALUES_FILES)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_strictly(values_file: str | None, version: str) -> None:
    docs = render(values_file)
    assert docs
    for d in docs:
        if d["kind"] in CRD_KINDS:
            assert d["apiVersion"] == "monitoring.coreos.com/v1" and d["spec"]
            continue
        kubernetes_validate.validate(d, version, strict=True)


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_containers_are_hardened(values_file: str | None) -> None:
    for spec in pod_specs(render(values_file)):
        assert spec["automountServiceAccountToken"] is False
        agents = [c for c in spec["containers"] if c["name"] == "outrider"]
        assert len(agents) == 1
        sc = agents[0]["securityContext"]
        assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert agents[0]["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert agents[0]["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert agents[0]["resources"]["limits"]["memory"]


def test_node_agent_on_gpu_nodes_with_rolling_config() -> None:
    docs = render(None)
    ds = kind(docs, "DaemonSet")[0]
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["hostPID"] is False
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env
    checksum = ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    changed = kind(render(None, {"config": {"interval_s": 10}}), "DaemonSet")[0]
    assert changed["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != checksum, \
        "a config change rolls the pods"
    assert {c["metadata"]["name"] for c in kind(docs, "ConfigMap")} >= {"outrider", "outrider-training"}


def test_everything_on_wires_monitoring_otlp_auth_and_secrets() -> None:
    docs = render("node-agent-values.yaml")
    spec = kind(docs, "DaemonSet")[0]["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel-collector.observability:4318"
    assert env["OTEL_RESOURCE_ATTRIBUTES"]["value"] == "deployment.environment=prod"
    assert env["PAGERDUTY_ROUTING_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "outrider-pager",
                                                                          "key": "routing-key"}
    assert env["OUTRIDER_BASIC_AUTH_PASSWORD_FILE"]["value"] == "/etc/outrider/basic-auth/password"
    assert spec["containers"][0]["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    text = yaml.safe_dump_all(docs)
    assert "routing-key" in text and not re.search(r"password:\s*\S", text), "secrets by reference only"
    sm = kind(docs, "ServiceMonitor")[0]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["scheme"] == "https"
    rule = kind(docs, "PrometheusRule")[0]
    source = yaml.safe_load((REPO / "alerts" / "outrider.rules.yaml").read_text())
    assert rule["spec"]["groups"] == source["groups"], "the PrometheusRule is the rule file"
    assert kind(docs, "PodMonitor")[0]["spec"]["selector"]["matchLabels"] == {"outrider.dev/sidecar": "true"}


def test_sidecar_examples_share_the_spool_and_the_process_namespace() -> None:
    for values_file, k in (("training-job-values.yaml", "Job"), ("inference-deployment-values.yaml", "Deployment")):
        workload = kind(render(values_file), k)[0]
        spec = workload["spec"]["template"]["spec"]
        assert spec["shareProcessNamespace"] is True
        spool = next(v for v in spec["volumes"] if v["name"] == "outrider-spool")
        assert "emptyDir" in spool
        for c in spec["containers"]:
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            assert mounts["outrider-spool"] == "/var/run/outrider", c["name"]
        app = next(c for c in spec["containers"] if c["name"] != "outrider")
        assert {"name": "OUTRIDER_SPOOL_DIR", "value": "/var/run/outrider"} in app["env"]
        assert workload["spec"]["template"]["metadata"]["labels"]["outrider.dev/sidecar"] == "true"


@pytest.mark.parametrize(("values", "message"), [
    ({"nodeAgent": {"hostPid": True}}, "hostPid"),
    ({"port": "9477"}, "port"),
    ({"otlp": {"protocol": "udp"}}, "protocol"),
    ({"serviceMonitor": {"interval": "often"}}, "interval"),
    ({"metricsAuth": {"basicAuthUsername": "prometheus"}}, "basicAuthPasswordSecretName"),
    ({"secretEnv": {"KEY": {"secretName": "s"}}}, "key"),
])
def test_schema_rejects_bad_values(values: dict[str, Any], message: str) -> None:
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmError, match=message):
        chart.validate_schema(values)


def test_every_value_is_documented() -> None:
    """Every top-level key and its direct children carry a '# --' comment (helm-docs style); the children of
    `config` (agent settings, documented by `outrider config show`) and `secretEnv` (user entries) are free-form."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    parent = ""
    for i, line in enumerate(lines):
        m = re.match(r"^( {0,2})([A-Za-z][\w.]*):", line)
        if not m:
            continue
        if not m.group(1):
            parent = m.group(2)
        elif parent in ("config", "secretEnv"):
            continue
        block = []
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            block.append(lines[j].strip())
            j -= 1
        assert any(c.startswith("# --") for c in block), f"values.yaml:{i + 1}: {line.strip()} lacks a '# --' comment"


def test_the_charts_copies_of_rules_and_dashboards_are_current() -> None:
    rules = (REPO / "alerts" / "outrider.rules.yaml").read_text()
    assert (CHART / "files" / "outrider.rules.yaml").read_text() == rules
    committed = {p.name: p.read_text() for p in (REPO / "dashboards").glob("*.json")}
    copies = {p.name: p.read_text() for p in (CHART / "files" / "dashboards").glob("*.json")}
    assert copies == committed, "cp alerts/outrider.rules.yaml dashboards/*.json into helm/outrider/files/"


@pytest.mark.parametrize("example", ["training-job", "inference-deployment"])
def test_rendered_examples_are_current(example: str) -> None:
    rendered = yaml.safe_dump_all(render(f"{example}-values.yaml"), sort_keys=False)
    path = CHART / "examples" / f"{example}.rendered.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(rendered)
    assert path.read_text() == rendered, f"{path} is stale (UPDATE_GOLDEN=1 regenerates it)"


def test_image_definition() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "torch" not in dockerfile.lower().replace("no torch", "")
    assert re.search(r"^USER 65532", dockerfile, re.M), "non-root"
    assert 'ENTRYPOINT ["outrider"]' in dockerfile
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'outrider = "outrider.cli:main"' in pyproject, "the entrypoint command exists"
    for src in re.findall(r"^COPY (?!--)(\S+)", dockerfile, re.M):
        for part in src.split():
            assert (REPO / part).exists(), f"Dockerfile copies {part}, which does not exist"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"].endswith("/outrider")
