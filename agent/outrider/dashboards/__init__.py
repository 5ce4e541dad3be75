"""Dashboards as code (grafana-foundation-sdk, Grafana 11.6), one file per dashboard.

The committed dashboards/*.json (and the chart's copies) are written from here by `python scripts/generate.py`;
`outrider dashboards export` writes them for a Grafana to provision.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from outrider.dashboards import alerts, gpu_node, host, inference, training
from outrider.dashboards.panels import reset_ids

BUILDERS: dict[str, Callable[[], Any]] = {
    "training": training.build,
    "inference": inference.build,
    "gpu-node": gpu_node.build,
    "host": host.build,
    "alerts": alerts.build,
}


def render_all() -> dict[str, str]:
    """{file name: JSON text} of every dashboard, deterministic (panel ids restart per dashboard)."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    out = {}
    for name, build in BUILDERS.items():
        reset_ids()
        out[f"outrider-{name}.json"] = json.dumps(build().build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"
    return out
