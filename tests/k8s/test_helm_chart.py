"""The Helm chart, rendered by the real Helm Go SDK (helm-python-sdk), linted, and every manifest validated against
the Kubernetes schemas of two versions (kubernetes-validate --strict): the security and wiring properties, the
sidecar's lifecycle (native or exiting with the workload), the monitors' TLS and basic auth, a parent chart that
includes the sidecar, the chart's copies of the rules and dashboards and the rendered examples kept current, and
the image definition read statically (tests/container builds and runs the image itself)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import helm_python as helm  # [dev] dependencies, imported plainly: a broken import fails, never skips the chart
import kubernetes_validate
import pytest
import yaml

from tests.helpers import REPO
from tests.k8s import pod_security

CHART = REPO / "helm" / "outrider"
VALUES_FILES = [None, *sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))]
K8S_VERSIONS = ("1.29.0", "1.33.0")
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def render(values_file: str | None, overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    values = yaml.safe_load((CHART / "ci" / values_file).read_text()) if values_file else {}
    values = merged(values, overrides or {})
    chart = helm.Chart.load(str(CHART))
    out = chart.render(values, name="outrider", namespace="monitoring")
    return [d for path, text in sorted(out.items()) if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def kind(docs: list[dict[str, Any]], k: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == k]


def pod_specs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("DaemonSet", "Deployment", "Job")]


def agents(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The agent containers of a pod: a native sidecar (an init container) or an ordinary container."""
    return [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "outrider"]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _values_of(key: str, node: Any) -> Any:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from _values_of(key, v)
    elif isinstance(node, list):
        for item in node:
            yield from _values_of(key, item)


def validate(docs: list[dict[str, Any]]) -> None:
    for d in docs:
        if d["kind"] in CRD_KINDS:
            assert d["apiVersion"] == "monitoring.coreos.com/v1" and d["spec"]
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(d, version, strict=True)


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
    for doc in kind(render(values_file), "DaemonSet") + kind(render(values_file), "Deployment") + \
            kind(render(values_file), "Job"):
        spec = doc["spec"]["template"]["spec"]
        # A token only where the node agent lists its node's pods (pods: list; see the test below)
        lists_pods = "OUTRIDER_SCRAPE_ANNOTATED_PODS" in env_of(agents(spec)[0])
        assert spec["automountServiceAccountToken"] is lists_pods and (doc["kind"] == "DaemonSet" or not lists_pods)
        found = agents(spec)
        assert len(found) == 1
        sc = found[0]["securityContext"]
        assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
        assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert sc["runAsNonRoot"] and sc["runAsUser"] == 65532, "no agent runs as root unless asked (runAsRoot)"
        assert found[0]["startupProbe"]["httpGet"]["path"] == "/readyz"
        assert found[0]["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert found[0]["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert found[0]["resources"]["limits"]["memory"]


def test_the_node_agent_runs_as_non_root_by_default_and_as_root_only_when_asked() -> None:
    """As node_exporter's chart runs it: uid 65532, no capabilities, the host's /proc, /sys and / read-only; no
    kubelet socket. Root is an opt-in (privileges: root), with every capability still dropped; the kubelet's
    pod-resources socket (root only) needs it, and without it the chart refuses rather than mount a socket it cannot
    use; every process's I/O needs CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH besides (privileges: all-processes), and
    nothing else is ever added."""
    (ds,) = kind(render(None), "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (agent,) = agents(spec)
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                       "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}}
    assert agent["securityContext"]["runAsUser"] == 65532 and agent["securityContext"]["runAsNonRoot"]
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "pod-resources" not in {v["name"] for v in spec["volumes"]}
    assert "OUTRIDER_K8S_POD_RESOURCES_SOCKET" not in env_of(agent)

    for privileges, added in (("root", None), ("all-processes", ["DAC_READ_SEARCH", "SYS_PTRACE"])):
        (ds,) = kind(render(None, {"nodeAgent": {"privileges": privileges}}), "DaemonSet")
        spec = ds["spec"]["template"]["spec"]
        (agent,) = agents(spec)
        assert (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsNonRoot"]) == (0, False)
        sc = agent["securityContext"]
        assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (0, 0, False)
        assert sc["capabilities"].get("add") == added and sc["capabilities"]["drop"] == ["ALL"]
        assert not sc["allowPrivilegeEscalation"] and sc["readOnlyRootFilesystem"]
        assert "pod-resources" not in {v["name"] for v in spec["volumes"]}, "root alone mounts no socket"

    (ds,) = kind(render(None, {"nodeAgent": {"privileges": "root", "podResources": {"enabled": True}}}),
                 "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (agent,) = agents(spec)
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert mounts["pod-resources"]["mountPath"] == "/var/lib/kubelet/pod-resources" and mounts["pod-resources"][
        "readOnly"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert env_of(agent)["OUTRIDER_K8S_POD_RESOURCES_SOCKET"]["value"] == \
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    with pytest.raises(helm.HelmError, match=r"nodeAgent\.podResources needs nodeAgent\.privileges=root"):
        render(None, {"nodeAgent": {"podResources": {"enabled": True}}})


def test_node_agent_lists_its_nodes_pods_with_a_role_that_may_only_get_and_list_pods() -> None:
    from outrider.ground.config import load

    off = render(None)
    assert not [d for d in off if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    (ds,) = kind(off, "DaemonSet")
    assert "OUTRIDER_SCRAPE_ANNOTATED_PODS" not in env_of(agents(ds["spec"]["template"]["spec"])[0])
    assert "serviceAccountName" not in ds["spec"]["template"]["spec"], "off by default: no token, no RBAC"

    docs = render(None, {"nodeAgent": {"annotatedPods": {"enabled": True, "discoveryIntervalSeconds": 45}}})
    (account,), (role,), (binding,) = (kind(docs, k) for k in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"))
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "monitoring"}]
    (ds,) = kind(docs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == account["metadata"]["name"] and spec["automountServiceAccountToken"] is True
    env = env_of(agents(spec)[0])
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    set_here = ("OUTRIDER_SCRAPE_ANNOTATED_PODS", "OUTRIDER_POD_DISCOVERY_INTERVAL_S")
    config = load(env={"NODE_NAME": "gpu-node-7", **{k: env[k]["value"] for k in set_here}}).config
    assert (config.scrape_annotated_pods, config.pod_discovery_interval_s, config.k8s_node_name) == \
        (True, 45.0, "gpu-node-7"), "the agent reads the chart's settings as the chart means them"
    sidecar_only = render(None, {"nodeAgent": {"enabled": False, "annotatedPods": {"enabled": True}}})
    assert not kind(sidecar_only, "ClusterRole"), "the role is the node agent's, and goes with it"


def test_node_agent_sees_the_host_network_root_proc_and_sys() -> None:
    docs = render(None)
    ds = kind(docs, "DaemonSet")[0]
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["hostPID"] is False
    assert spec["priorityClassName"] == "system-node-critical"
    agent = spec["containers"][0]
    assert agent["args"] == ["agent", "--proc-root", "/host/proc", "--sys-root", "/host/sys"]
    env = env_of(agent)
    assert env["OUTRIDER_HOST_ROOT"]["value"] == "/host/root", "config.filesystems are host paths"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for name, host_path, mount_path in (("host-proc", "/proc", "/host/proc"), ("host-sys", "/sys", "/host/sys"),
                                        ("host-root", "/", "/host/root")):
        assert volumes[name]["hostPath"]["path"] == host_path
        assert mounts[name]["mountPath"] == mount_path and mounts[name]["readOnly"] is True
    assert mounts["host-root"]["mountPropagation"] == "HostToContainer", "the host's later mounts show up"
    no_host_net = kind(render(None, {"nodeAgent": {"hostNetwork": False}}), "DaemonSet")[0]["spec"]["template"]
    assert no_host_net["spec"]["hostNetwork"] is False and "dnsPolicy" not in no_host_net["spec"]


def test_a_config_change_rolls_the_pods() -> None:
    docs = render(None)
    ds = kind(docs, "DaemonSet")[0]
    checksum = ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    changed = kind(render(None, {"config": {"interval_s": 10}}), "DaemonSet")[0]
    assert changed["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != checksum
    deployment = kind(render("inference-deployment-values.yaml"), "Deployment")[0]
    deployment2 = kind(render("inference-deployment-values.yaml", {"config": {"interval_s": 10}}), "Deployment")[0]
    assert (deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            != deployment2["spec"]["template"]["metadata"]["annotations"]["checksum/config"]), "sidecar pods roll too"
    assert {c["metadata"]["name"] for c in kind(docs, "ConfigMap")} >= {"outrider", "outrider-training"}


def upgrade_refusals(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    """What `helm upgrade` from `before` to `after` would have the API server refuse: a Job's pod template is
    immutable, so a Job kept under its name must keep its template (one under a new name is a new Job)."""
    old = {d["metadata"]["name"]: d for d in before if d["kind"] == "Job"}
    return [name for name, job in ((d["metadata"]["name"], d) for d in after if d["kind"] == "Job")
            if name in old and old[name]["spec"]["template"] != job["spec"]["template"]]


def test_helm_upgrade_of_a_release_with_a_job_never_changes_its_immutable_pod_template() -> None:
    """A new agent configuration leaves the Job as it is (a Job's pods are never rolled: no checksum/config on its
    template); a new image is a new template, and so a new Job, named by its template's hash; the same values give
    the same Job, which the upgrade leaves alone."""
    base = render("training-job-values.yaml")
    (job,) = kind(base, "Job")
    assert "checksum/config" not in job["spec"]["template"]["metadata"].get("annotations", {})
    assert re.fullmatch(r"outrider-example-training-[0-9a-f]{8}", job["metadata"]["name"])
    for changed in ({"config": {"interval_s": 10}}, {"image": {"tag": "0.2.0"}}, {"sidecar": {"native": False}},
                    {"sidecar": {"resources": {"limits": {"memory": "256Mi"}}}}):
        after = render("training-job-values.yaml", changed)
        assert upgrade_refusals(base, after) == [], changed
    assert kind(render("training-job-values.yaml"), "Job")[0]["metadata"]["name"] == job["metadata"]["name"]
    assert kind(render("training-job-values.yaml", {"config": {"interval_s": 10}}), "Job") == [job]
    assert kind(render("training-job-values.yaml", {"image": {"tag": "0.2.0"}}), "Job")[0]["metadata"]["name"] != \
        job["metadata"]["name"], "a new image: a new Job"


def test_everything_on_wires_monitoring_otlp_auth_secrets_and_extras() -> None:
    docs = render("node-agent-values.yaml")
    pod = kind(docs, "DaemonSet")[0]["spec"]["template"]
    spec = pod["spec"]
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    agent = spec["containers"][0]
    env = env_of(agent)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel-collector.observability:4318"
    assert env["OTEL_RESOURCE_ATTRIBUTES"]["value"] == "deployment.environment=prod"
    assert env["PAGERDUTY_ROUTING_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "outrider-pager",
                                                                          "key": "routing-key"}
    # from the Secret's volume, which the kubelet updates in place and the agent reads again (no restart)
    assert env["OUTRIDER_BASIC_AUTH_USERNAME_FILE"]["value"] == "/etc/outrider/basic-auth/username"
    assert env["OUTRIDER_BASIC_AUTH_PASSWORD_FILE"]["value"] == "/etc/outrider/basic-auth/password"
    assert "OUTRIDER_BASIC_AUTH_USERNAME" not in env, "an environment variable keeps the old user until a restart"
    auth = next(v for v in spec["volumes"] if v["name"] == "outrider-basic-auth")["secret"]
    assert auth == {"secretName": "outrider-metrics-auth", "items": [{"key": "username", "path": "username"},
                                                                     {"key": "password", "path": "password"}]}
    assert {"name": "outrider-basic-auth", "mountPath": "/etc/outrider/basic-auth", "readOnly": True} in \
        agent["volumeMounts"], "a directory, not a subPath: a subPath mount is never updated"
    assert agent["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    passwords = list(_values_of("password", docs))
    assert passwords and all(isinstance(v, dict) and set(v) == {"name", "key"} for v in passwords), \
        "secrets by reference only"
    # the extras
    assert env["OUTRIDER_LOG_LEVEL"]["value"] == "debug"
    assert agent["args"][-1] == "--no-collector.diagnosis"
    assert {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True} in agent["volumeMounts"]
    assert any(v["name"] == "checkpoints" for v in spec["volumes"])
    assert pod["metadata"]["labels"]["team"] == "ml-platform"
    assert pod["metadata"]["annotations"]["example.com/owner"] == "ml-platform"
    assert spec["affinity"]["nodeAffinity"]
    assert agent["image"] == "registry.example.com/mirror/outrider:0.1.0"
    rule = kind(docs, "PrometheusRule")[0]
    assert kind(docs, "PodMonitor")[0]["spec"]["selector"]["matchLabels"] == {"outrider.dev/sidecar": "true"}
    assert len(rule["spec"]["groups"]) == len(yaml.safe_load((REPO / "alerts" / "outrider.rules.yaml").read_text())
                                              ["groups"])


def test_kube_prometheus_stack_selects_every_monitoring_object() -> None:
    docs = render("node-agent-values.yaml")
    for k in CRD_KINDS:
        objects = kind(docs, k)
        assert objects, k
        assert all(o["metadata"]["labels"]["release"] == "kube-prometheus-stack" for o in objects), k


@pytest.mark.parametrize("auth", [
    {"tlsSecretName": "tls", "caSecretName": "ca", "basicAuthSecretName": "auth"},
    {"tlsSecretName": "tls", "basicAuthSecretName": "auth", "serverName": "agents.example.com"},
])
def test_with_metrics_auth_every_monitor_endpoint_has_tls_and_basic_auth(auth: dict[str, str]) -> None:
    docs = render(None, {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                         "metricsAuth": auth})
    endpoints = [e for sm in kind(docs, "ServiceMonitor") for e in sm["spec"]["endpoints"]]
    endpoints += [e for pm in kind(docs, "PodMonitor") for e in pm["spec"]["podMetricsEndpoints"]]
    assert len(endpoints) == 2
    for e in endpoints:
        assert e["scheme"] == "https"
        assert e["tlsConfig"]["ca"]["secret"] == {"name": auth.get("caSecretName", "tls"), "key": "ca.crt"}
        assert e["tlsConfig"]["serverName"] == auth.get("serverName", "outrider.monitoring.svc")
        assert e["basicAuth"] == {"username": {"name": "auth", "key": "username"},
                                  "password": {"name": "auth", "key": "password"}}
    assert "insecureSkipVerify" not in yaml.safe_dump_all(docs), "no blanket insecureSkipVerify"


def test_without_metrics_auth_monitors_scrape_plain_http() -> None:
    docs = render(None, {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}})
    for e in (kind(docs, "ServiceMonitor")[0]["spec"]["endpoints"]
              + kind(docs, "PodMonitor")[0]["spec"]["podMetricsEndpoints"]):
        assert not {"scheme", "tlsConfig", "basicAuth"} & set(e)


TUNING = {"scrapeTimeout": "7s", "honorLabels": True, "interval": "30s",
          "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_label_team"], "targetLabel": "team"}],
          "metricRelabelings": [{"sourceLabels": ["__name__"], "regex": "outrider_process_.*", "action": "drop"}]}


def test_monitors_take_the_tuning_people_expect() -> None:
    docs = render(None, {"serviceMonitor": {"enabled": True, **TUNING}, "podMonitor": {"enabled": True, **TUNING},
                         "service": {"annotations": {"prometheus.io/scrape": "false"}}})
    validate(docs)
    for e in (kind(docs, "ServiceMonitor")[0]["spec"]["endpoints"]
              + kind(docs, "PodMonitor")[0]["spec"]["podMetricsEndpoints"]):
        assert (e["interval"], e["scrapeTimeout"], e["honorLabels"]) == ("30s", "7s", True)
        assert e["relabelings"][-1] == TUNING["relabelings"][0], "after the chart's own"
        assert {r["targetLabel"] for r in e["relabelings"][:-1]} >= {"namespace", "pod", "node"}
        assert e["metricRelabelings"] == TUNING["metricRelabelings"]
    assert kind(docs, "Service")[0]["metadata"]["annotations"] == {"prometheus.io/scrape": "false"}


def test_monitors_without_tuning_carry_none_of_it() -> None:
    docs = render(None, {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}})
    for e in (kind(docs, "ServiceMonitor")[0]["spec"]["endpoints"]
              + kind(docs, "PodMonitor")[0]["spec"]["podMetricsEndpoints"]):
        assert not {"scrapeTimeout", "honorLabels", "metricRelabelings"} & set(e)
    assert "annotations" not in kind(docs, "Service")[0]["metadata"]


def test_monitors_keep_classic_histograms_only_when_asked() -> None:
    """Prometheus with native histograms keeps only the native histogram of a metric that has both, unless the
    monitor says scrapeClassicHistograms (a spec field, not an endpoint's): the rules query the classic buckets."""
    for asked in (None, True, False):
        values: dict[str, Any] = {"enabled": True} if asked is None else {"enabled": True,
                                                                          "scrapeClassicHistograms": asked}
        docs = render(None, {"serviceMonitor": values, "podMonitor": values})
        validate(docs)
        for monitor, endpoints in ((kind(docs, "ServiceMonitor")[0], "endpoints"),
                                   (kind(docs, "PodMonitor")[0], "podMetricsEndpoints")):
            assert monitor["spec"].get("scrapeClassicHistograms") is asked
            assert all("scrapeClassicHistograms" not in e for e in monitor["spec"][endpoints])


def test_each_sidecar_workload_is_its_own_job() -> None:
    pm = kind(render(None, {"podMonitor": {"enabled": True}}), "PodMonitor")[0]
    assert pm["spec"]["jobLabel"] == "outrider.dev/job"
    jobs = set()
    for values_file, k in (("training-job-values.yaml", "Job"), ("inference-deployment-values.yaml", "Deployment")):
        labels = kind(render(values_file), k)[0]["spec"]["template"]["metadata"]["labels"]
        jobs.add(labels["outrider.dev/job"])
    assert len(jobs) == 2, "the examples' pods carry the job label, one value per workload"


def test_monitors_mark_node_agents_and_sidecars_as_the_rules_expect() -> None:
    """The rules tell a sidecar (which leaves with its finished Job and may have any job name) from a node agent by
    the agent_role label the monitors set; alerts/tests/meta.test.yaml runs the rules on exactly these labels."""
    docs = render(None, {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}})
    sm = kind(docs, "ServiceMonitor")[0]["spec"]["endpoints"][0]["relabelings"]
    pm = kind(docs, "PodMonitor")[0]["spec"]["podMetricsEndpoints"][0]["relabelings"]
    marks = {name: [r.get("replacement") for r in rel if r.get("targetLabel") == "agent_role"]
             for name, rel in (("service", sm), ("pod", pm))}
    assert marks == {"service": ["node"], "pod": ["sidecar"]}
    # both monitors give the node label, so the label is the only way to tell a sidecar from a node agent
    assert all(any(r.get("targetLabel") == "node" for r in rel) for rel in (sm, pm))
    rules = {r["alert"]: r["expr"] for g in yaml.safe_load((REPO / "alerts" / "outrider.rules.yaml").read_text())[
        "groups"] for r in g["rules"] if "alert" in r}
    assert 'up{agent_role="sidecar"} == 0' in rules["OutriderAgentDown"]
    assert rules["OutriderTargetMissing"].count('agent_role!="sidecar"') == 2


def test_runbook_urls_follow_the_base_the_values_set() -> None:
    source = yaml.safe_load((REPO / "alerts" / "outrider.rules.yaml").read_text())
    urls = [r["annotations"]["runbook_url"] for g in source["groups"] for r in g["rules"] if "alert" in r]
    base = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["runbookUrlBase"]
    assert urls and all(u.startswith(base + "/") for u in urls), "the chart rewrites every runbook URL"
    docs = render(None, {"prometheusRule": {"enabled": True, "runbookUrlBase": "https://wiki.example.com/rb/"}})
    rendered = [r["annotations"]["runbook_url"] for g in kind(docs, "PrometheusRule")[0]["spec"]["groups"]
                for r in g["rules"] if "alert" in r]
    assert rendered == ["https://wiki.example.com/rb/" + u[len(base) + 1:] for u in urls]
    default = kind(render(None, {"prometheusRule": {"enabled": True}}), "PrometheusRule")[0]
    assert default["spec"]["groups"] == source["groups"], "by default the PrometheusRule is the rule file"


def test_training_job_runs_the_agent_as_a_native_sidecar() -> None:
    spec = kind(render("training-job-values.yaml"), "Job")[0]["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["outrider"]
    sidecar = spec["initContainers"][0]
    assert sidecar["restartPolicy"] == "Always", "a native sidecar: the Job completes when the trainer does"
    assert "OUTRIDER_EXIT_WHEN_WORKLOAD_EXITS" not in env_of(sidecar), "SIGTERM after the trainer stops it"
    assert [c["name"] for c in spec["containers"]] == ["trainer"]


def test_legacy_sidecar_is_a_container_that_exits_with_the_workload() -> None:
    """Listed after the workload's containers, which the kubelet starts first: a workload none of whose processes
    is there when the agent starts has exited already, and the agent waits for it sidecar.startupGraceSeconds."""
    spec = kind(render("legacy-sidecar-values.yaml"), "Job")[0]["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    sidecar = agents(spec)[0]
    assert spec["containers"][-1] is sidecar and "restartPolicy" not in sidecar
    env = env_of(sidecar)
    assert env["OUTRIDER_EXIT_WHEN_WORKLOAD_EXITS"]["value"] == "true"
    assert env["OUTRIDER_STARTUP_GRACE_S"]["value"] == "30"
    from outrider.ground.config import load

    assert load(env={"OUTRIDER_STARTUP_GRACE_S": env["OUTRIDER_STARTUP_GRACE_S"]["value"]}).config.startup_grace_s \
        == 30.0


def test_a_native_sidecar_on_a_cluster_without_them_stops_the_install(capfd: pytest.CaptureFixture[str]) -> None:
    """Before 1.29 the API server drops an init container's restartPolicy, and the agent, a plain init container
    then, would hold the pod in Init forever: the chart refuses with what to do. (Helm's lint runs templates
    against a given Kubernetes version and reports a template's `fail` on its log instead of stopping.)"""
    job = {"examples": {"trainingJob": True}, "nodeAgent": {"enabled": False}}
    message = "sidecar.native needs Kubernetes >= 1.29"
    helm.lint(str(CHART), job, kube_version="1.29.0")
    assert message not in capfd.readouterr().err
    helm.lint(str(CHART), job, kube_version="1.28.3")
    assert message in capfd.readouterr().err
    helm.lint(str(CHART), {**job, "sidecar": {"native": False}}, kube_version="1.27.0")
    assert message not in capfd.readouterr().err


@pytest.mark.parametrize("values_file", ["training-job-values.yaml", "inference-deployment-values.yaml",
                                         "legacy-sidecar-values.yaml"])
def test_sidecar_examples_share_the_spool_and_the_process_namespace(values_file: str) -> None:
    workload = next(d for d in render(values_file) if d["kind"] in ("Job", "Deployment"))
    spec = workload["spec"]["template"]["spec"]
    assert spec["shareProcessNamespace"] is True
    spool = next(v for v in spec["volumes"] if v["name"] == "outrider-spool")
    assert "emptyDir" in spool
    for c in spec.get("initContainers", []) + spec["containers"]:
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["outrider-spool"] == "/var/run/outrider", c["name"]
        assert env_of(c)["OUTRIDER_SPOOL_DIR"]["value"] == "/var/run/outrider", c["name"]
    app = next(c for c in spec["containers"] if c["name"] != "outrider")
    assert env_of(app)["OUTRIDER_STANDALONE"]["value"] == "false", "the sidecar is the agent, never the workload"
    assert workload["spec"]["template"]["metadata"]["labels"]["outrider.dev/sidecar"] == "true"


@pytest.mark.parametrize(("values", "message"), [
    ({"nodeAgent": {"hostPid": True}}, "hostPid"),
    ({"port": "9477"}, "port"),
    ({"otlp": {"protocol": "udp"}}, "protocol"),
    ({"serviceMonitor": {"interval": "often"}}, "interval"),
    ({"podMonitor": {"scrapeTimeout": "soon"}}, "scrapeTimeout"),
    ({"serviceMonitor": {"relabelings": [{"action": "explode"}]}}, "action"),
    ({"podMonitor": {"metricRelabelings": [{"target_label": "x"}]}}, "target_label"),
    ({"metricsAuth": {"basicAuthUsername": "prometheus"}}, "basicAuthUsername"),
    ({"secretEnv": {"KEY": {"secretName": "s"}}}, "key"),
    ({"sidecar": {"native": "yes"}}, "native"),
    ({"nodeAgent": {"extraEnv": [{"value": "x"}]}}, "name"),
    ({"prometheusRule": {"runbookUrlBase": "wiki/runbooks"}}, "runbookUrlBase"),
    ({"nodeAgent": {"annotatedPods": {"discoveryIntervalSeconds": 0}}}, "discoveryIntervalSeconds"),
    ({"nodeAgent": {"annotatedPods": {"port": 8000}}}, "port"),
    ({"nodeAgent": {"privileges": "admin"}}, "privileges"),
    ({"nodeAgent": {"enabled": "auto"}}, "enabled"),
    ({"sidecar": {"startupGraceSeconds": -1}}, "startupGraceSeconds"),
])
def test_schema_rejects_bad_values(values: dict[str, Any], message: str) -> None:
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmError, match=message):
        chart.validate_schema(values)


def test_schema_accepts_a_parent_charts_global_values() -> None:
    chart = helm.Chart.load(str(CHART))
    chart.validate_schema({"global": {"imageRegistry": "registry.example.com"}})
    with pytest.raises(helm.HelmError, match="globalx"):  # taken as the one key allowed, not as any key
        chart.validate_schema({"globalx": {"imageRegistry": "registry.example.com"}})


PARENT_TEMPLATE = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Release.Name }}-train
spec:
  template:
    metadata:
      labels:
        {{- include "outrider.sidecarPodLabels" . | nindent 8 }}
        outrider.dev/job: {{ .Release.Name }}-train
    spec:
      restartPolicy: Never
      shareProcessNamespace: true
      securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}
      initContainers:
        {{- include "outrider.sidecar" . | nindent 8 }}
      containers:
        - name: trainer
          image: {{ .Values.image.repository }}:{{ .Values.image.tag }}
          securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
          env:
            {{- include "outrider.workloadEnv" . | nindent 12 }}
          volumeMounts:
            {{- include "outrider.workloadVolumeMounts" . | nindent 12 }}
      volumes:
        {{- include "outrider.sidecarVolumes" . | nindent 8 }}
---
{{- $sidecar := dict "context" . "values" (dict "sidecar" (dict "native" false "spoolDir" "/spool")) }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-serve
spec:
  selector: {matchLabels: {app: serve}}
  template:
    metadata:
      labels: {app: serve}
    spec:
      shareProcessNamespace: true
      containers:
        - name: server
          image: {{ .Values.image.repository }}:{{ .Values.image.tag }}
          env:
            {{- include "outrider.workloadEnv" $sidecar | nindent 12 }}
          volumeMounts:
            {{- include "outrider.workloadVolumeMounts" $sidecar | nindent 12 }}
        {{- include "outrider.sidecar" $sidecar | nindent 8 }}
      volumes:
        {{- include "outrider.sidecarVolumes" $sidecar | nindent 8 }}
"""


def render_parent(tmp_path: Path, outrider_values: dict[str, Any]) -> list[dict[str, Any]]:
    """A workload's chart depending on outrider (a file:// dependency, fetched by Helm's dependency update), with
    these values under `outrider:`, rendered and validated."""
    parent = tmp_path / "trainer"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v2", "name": "trainer", "version": "1.0.0",
        "dependencies": [{"name": "outrider", "version": "0.1.0", "repository": f"file://{CHART}"}]}))
    (parent / "values.yaml").write_text(yaml.safe_dump({
        "image": {"repository": "example.com/trainer", "tag": "2.0"}, "global": {"team": "ml"},
        "outrider": outrider_values}))
    (parent / "templates" / "workloads.yaml").write_text(PARENT_TEMPLATE)
    helm.dependency_update(str(parent))
    out = helm.Chart.load(str(parent)).render({}, name="run1", namespace="ml")
    docs = [d for p, text in sorted(out.items()) if p.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    validate(docs)
    return docs


def test_a_parent_chart_includes_the_sidecar_with_the_subcharts_values(tmp_path: Path) -> None:
    """A workload's own chart depending on outrider renders the sidecar with outrider's defaults plus what its
    values pass under `outrider:`, never its own `image`; a second workload passes values of its own inline. Helm's
    `global` reaches the subchart's schema. The sidecar is all it gets: no second node-agent DaemonSet (which would
    clash with the cluster's on the node's port) and no second copy of the dashboards, unless asked for."""
    docs = render_parent(tmp_path, {"image": {"tag": "9.9.9"}, "config": {"interval_s": 2}})
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Deployment", "Job"], \
        "the sidecar's ConfigMap and the parent's workloads: no DaemonSet, Service or dashboards"
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    assert configmap["metadata"]["name"] == "run1-outrider" and "interval_s: 2" in configmap["data"]["outrider.yaml"]

    job = kind(docs, "Job")[0]["spec"]["template"]
    sidecar = job["spec"]["initContainers"][0]
    assert sidecar["image"] == "ghcr.io/outrider-dev/outrider:9.9.9", "the subchart's repository, the tag passed"
    assert sidecar["restartPolicy"] == "Always"
    volumes = {v["name"]: v for v in job["spec"]["volumes"]}
    assert volumes["outrider-config"]["configMap"]["name"] == "run1-outrider", "the subchart's own ConfigMap"
    assert env_of(job["spec"]["containers"][0])["OUTRIDER_SPOOL_DIR"]["value"] == "/var/run/outrider"
    assert job["metadata"]["labels"]["outrider.dev/sidecar"] == "true"

    serve = kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    inline = agents(serve)[0]
    assert "initContainers" not in serve and "restartPolicy" not in inline
    assert env_of(inline)["OUTRIDER_EXIT_WHEN_WORKLOAD_EXITS"]["value"] == "true"
    assert env_of(inline)["OUTRIDER_SPOOL_DIR"]["value"] == "/spool"
    assert env_of(serve["containers"][0])["OUTRIDER_SPOOL_DIR"]["value"] == "/spool"
    assert inline["image"] == "ghcr.io/outrider-dev/outrider:9.9.9"
    train = kind(docs, "Job")[0]["spec"]["template"]
    assert pod_security.restricted(train["spec"]) == [], "a workload written so passes PodSecurity restricted"


def test_a_parent_chart_gets_the_node_agent_and_dashboards_only_when_it_asks(tmp_path: Path) -> None:
    docs = render_parent(tmp_path, {"nodeAgent": {"enabled": True}, "dashboards": {"enabled": True}})
    assert len(kind(docs, "DaemonSet")) == 1 and len(kind(docs, "Service")) == 1
    assert any(d["metadata"].get("labels", {}).get("grafana_dashboard") for d in kind(docs, "ConfigMap"))
    on_its_own = render(None)
    assert len(kind(on_its_own, "DaemonSet")) == 1, "installed on its own, the chart is the node agents' by default"
    assert any(d["metadata"].get("labels", {}).get("grafana_dashboard") for d in kind(on_its_own, "ConfigMap"))
    assert kind(render(None, {"nodeAgent": {"enabled": False}}), "DaemonSet") == []


@pytest.mark.parametrize("values_file", ["training-job-values.yaml", "inference-deployment-values.yaml",
                                         "legacy-sidecar-values.yaml"])
def test_the_example_workloads_pass_podsecurity_restricted(values_file: str) -> None:
    """The Pod Security Standards' "restricted" profile, which a namespace labelled
    pod-security.kubernetes.io/enforce=restricted admits (tests/k8s/pod_security.py has its controls)."""
    workload = next(d for d in render(values_file) if d["kind"] in ("Job", "Deployment"))
    template = workload["spec"]["template"]
    assert pod_security.restricted(template["spec"], template["metadata"].get("annotations")) == []


def test_the_pod_security_checks_find_what_each_profile_forbids() -> None:
    """The checks themselves: the node agent needs the "privileged" level (the host's network and paths), which
    baseline already refuses, and an example pod stripped of its settings fails restricted on each one."""
    (ds,) = kind(render(None), "DaemonSet")
    assert sorted(pod_security.baseline(ds["spec"]["template"]["spec"])) == [
        "pod: hostNetwork", "volume host-proc: hostPath", "volume host-root: hostPath", "volume host-sys: hostPath"]
    pod = kind(render("training-job-values.yaml"), "Job")[0]["spec"]["template"]["spec"]
    assert pod_security.baseline(pod) == []
    del pod["securityContext"]
    trainer = next(c for c in pod["containers"] if c["name"] == "trainer")
    del trainer["securityContext"]
    assert pod_security.restricted(pod) == [
        "container trainer: allowPrivilegeEscalation is not false",
        "container trainer: runAsNonRoot is not true (here or on the pod)",
        "container trainer: seccomp profile is not RuntimeDefault or Localhost (here or on the pod)",
        "container trainer: does not drop ALL capabilities"], "the sidecar carries its own settings"
    pod["volumes"].append({"name": "data", "hostPath": {"path": "/data"}})
    pod["containers"][0]["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}, "privileged": True}
    assert {"volume data: hostPath", "container trainer: privileged",
            "container trainer: adds capabilities ['SYS_ADMIN']"} <= set(pod_security.baseline(pod))


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
    """What can be read without building: tests/container builds the image and runs its ENV and CMD."""
    from outrider.ground.config import FIELDS

    dockerfile = (REPO / "Dockerfile").read_text()
    assert "torch" not in dockerfile.lower().replace("no torch", "")
    assert re.search(r"^ARG BASE=\S*python:3\.\d+-slim$", dockerfile, re.M), "the base is a build argument"
    assert re.search(r"^FROM \$\{BASE\}", dockerfile, re.M)
    assert re.search(r"^USER 65532", dockerfile, re.M), "non-root"
    assert 'ENTRYPOINT ["outrider"]' in dockerfile
    for key in re.findall(r"\bOUTRIDER_(\w+)=", dockerfile):
        assert key.lower() in FIELDS, f"the image sets OUTRIDER_{key}, which the agent rejects as unknown"
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'outrider = "outrider.commands.cli:main"' in pyproject, "the entrypoint command exists"
    for src in re.findall(r"^COPY (?!--)(.+) \S+$", dockerfile, re.M):
        for part in src.split():
            assert "*" in part or (REPO / part).exists(), f"Dockerfile copies {part}, which does not exist"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"].endswith("/outrider")
