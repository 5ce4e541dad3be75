"""The chart rendered with the real Helm SDK for the container tests, with the image under test."""

from __future__ import annotations

from typing import Any

import helm_python as helm  # a [dev] dependency: a broken import fails the container tests, never skips them
import yaml

from tests.helpers import REPO

CHART = REPO / "helm" / "outrider"


def render(image: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    repository, tag = image.rsplit(":", 1)
    values = {**values, "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}}
    out = helm.Chart.load(str(CHART)).render(values, name="outrider", namespace="monitoring")
    return [d for path, text in sorted(out.items()) if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def configmaps(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}


def pod_spec(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = next(d for d in docs if d["kind"] == kind)["spec"]["template"]["spec"]
    return spec
