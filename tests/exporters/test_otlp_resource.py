"""The OTLP resource's Kubernetes attributes come only from the Downward API variables the chart sets: read from the
chart's own template, so the two cannot drift apart; a CONTAINER_NAME outside Kubernetes names no container."""

from __future__ import annotations

import re

import pytest

from outrider.exporters import otlp
from outrider.ground.config import K8S_ENV, Config
from tests.helpers import REPO


def downward_api_variables() -> set[str]:
    helpers = (REPO / "helm" / "outrider" / "templates" / "_helpers.tpl").read_text()
    return set(re.findall(r"- name: (\w+)\n\s+valueFrom: \{fieldRef:", helpers))


def test_the_resource_reads_exactly_the_variables_the_chart_sets_from_the_downward_api() -> None:
    assert downward_api_variables() == {K8S_ENV[name] for name in otlp.K8S_ATTRIBUTES}


def test_a_container_name_outside_kubernetes_is_no_resource_attribute(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*K8S_ENV.values(), "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CONTAINER_NAME", "some-docker-container")
    assert not {k for k in otlp._resource(Config()).attributes if k.startswith("k8s.")}
    monkeypatch.setenv("POD_NAME", "trainer-0")
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    attrs = otlp._resource(Config()).attributes
    assert {k: v for k, v in attrs.items() if k.startswith("k8s.")} == {"k8s.pod.name": "trainer-0",
                                                                         "k8s.node.name": "gpu-node-1"}
