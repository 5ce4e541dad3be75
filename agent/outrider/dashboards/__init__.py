"""Dashboards as code (grafana-foundation-sdk, Grafana 11.6), one file per dashboard.

The committed dashboards/*.json (and the chart's copies) are written from here by `python scripts/generate.py`;
`outrider dashboards export` writes them for a Grafana to provision. Their links start with the documentation URL
(outrider.ground.links: the repository, or OUTRIDER_DOCS_URL / --docs-url).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from outrider.dashboards import agents, alerts, gpu_node, host, inference, training
from outrider.dashboards.panels import reset_ids, set_docs_url

BUILDERS: dict[str, Callable[[], Any]] = {
    "training": training.build,
    "inference": inference.build,
    "gpu-node": gpu_node.build,
    "host": host.build,
    "alerts": alerts.build,
    "agents": agents.build,
}


def render_all(docs_url: str | None = None) -> dict[str, str]:
    """{file name: JSON text} of every dashboard, deterministic (panel ids restart per dashboard). `docs_url`: the
    documentation base URL of their links (default: outrider.ground.links.docs_url())."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    out = {}
    set_docs_url(docs_url)
    try:
        for name, build in BUILDERS.items():
            reset_ids()
            out[f"outrider-{name}.json"] = json.dumps(build().build(), cls=JSONEncoder, sort_keys=True,
                                                      indent=2) + "\n"
    finally:
        set_docs_url(None)
    return out
