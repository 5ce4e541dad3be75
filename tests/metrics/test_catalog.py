"""The metric table: conventions hold (its generated reference is checked by tests/house/test_generated.py)."""

from __future__ import annotations

import re
import subprocess
import sys

from outrider.collectors import REGISTRY
from outrider.metrics.catalog import CATALOG


def test_names_follow_prometheus_conventions() -> None:
    for d in CATALOG.values():
        assert re.fullmatch(r"outrider_[a-z0-9_]+", d.name), d.name
        assert (d.type == "counter") == d.name.endswith("_total"), f"{d.name}: only counters end in _total"
        assert not re.search(r"_(milliseconds|kilobytes|megabytes|percent)", d.name), f"{d.name}: base units"
        if d.unit == "s":
            assert "_seconds" in d.name, d.name
        if d.unit == "By":
            assert "_bytes" in d.name, d.name
        assert d.help.strip() and d.collector in REGISTRY, d.name
        assert len({lb.prom for lb in d.labels}) == len(d.labels), d.name


def test_importing_outrider_pulls_in_no_heavy_dependency() -> None:
    code = ("import sys, outrider; heavy = [m for m in ('opentelemetry', 'prometheus_client', 'psutil', 'pynvml', "
            "'torch') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
