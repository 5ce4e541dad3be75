"""outrider.instrument(meter_provider=...): the hook's series on the application's own OpenTelemetry MeterProvider.

A real hooked process with the real OTel SDK (its InMemoryMetricReader) beside its own instruments. What its provider
collects is compared with what the agent's OTLP export makes of the same flush (the agent's hook collector reading
the process's shard, then the exporter's conversion): the same names, units, instrument kinds, attributes and
values, histograms as their bucket, count and sum counters; and with the catalog. While a real agent serves the
spool the provider gets none of the hook's series (the agent exports them), and it gets them again once that agent
is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import accumulate
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.exporters.otlp import to_metrics_data
from outrider.ground.config import Config
from outrider.metrics.catalog import CATALOG
from tests.helpers import AgentProcess, reap, samples, value, wait_until

# Collects what the provider has and writes it as JSON: {metric name: {scope, unit, kind, points: [[attrs, value]]}}
COLLECT = r"""
import json
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum
from opentelemetry.sdk.resources import Resource

reader = InMemoryMetricReader()
provider = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": "shop"}))

def collect(path):
    out, data = {}, reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                d = m.data
                kind = ("gauge" if isinstance(d, Gauge) else "histogram" if isinstance(d, Histogram) else
                        "counter" if d.is_monotonic else "updowncounter")
                out[m.name] = {"scope": sm.scope.name, "unit": m.unit, "kind": kind,
                               "resource": dict(rm.resource.attributes),
                               "points": [[dict(p.attributes), getattr(p, "value", None)] for p in d.data_points]}
    with open(path + ".tmp", "w") as fh:
        json.dump(out, fh)
    import os
    os.replace(path + ".tmp", path)
"""

SERVICE = COLLECT + r"""
import sys, time
from pathlib import Path
import outrider
from outrider.hook import api

out = Path(sys.argv[1])
mine = provider.get_meter("shop").create_counter("shop.orders", unit="{order}")
assert outrider.instrument(meter_provider=provider)
for i in range(12):
    with outrider.step(samples=4, tokens=64):
        pass
    outrider.record_request(0.05 * (i % 3), route="/pay", status=200 if i % 4 else 503, method="POST")
    outrider.counter("shop_refunds_total", {"reason": "late"}).inc(2)
    outrider.histogram("shop_basket_seconds", {"kind": "web"}).observe(0.02 * i)
    mine.add(1)
outrider.gauge("shop_queue_depth").set(7)
outrider.flush()
collect(str(out / "first.json"))    # a custom name first seen here gets its instrument after this collection
import threading                    # created on a thread of the bridge's own, outside the SDK's collection lock
while any(t.name == "outrider-otel-bridge" for t in threading.enumerate()):
    time.sleep(0.01)
for _ in range(3):                  # after the flush: not in what the provider collects (the flush's snapshot)
    with outrider.step(samples=4):
        pass
    outrider.counter("shop_refunds_total", {"reason": "late"}).inc(100)
    outrider.record_request(0.05, route="/pay", status=200, method="POST")
collect(str(out / "collected.json"))
(out / "standalone").write_text(str(api.S.hook.settings.standalone))
(out / "done").touch()
time.sleep(120)                     # alive, so that its shard stays as this flush left it
"""


def _hooked(script: str, tmp_path: Path, **env_extra: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    path = tmp_path / "service.py"
    path.write_text(script)
    spool_dir, out = tmp_path / "spool", tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_"))}
    env.update({"OUTRIDER_SPOOL_DIR": str(spool_dir), "OUTRIDER_FLUSH_INTERVAL_S": "3600", **env_extra})
    return subprocess.Popen([sys.executable, str(path), str(out)], env=env), spool_dir, out


def _agent_otlp(spool_dir: Path) -> dict[str, Any]:
    """What the agent's OTLP export makes of the spool now: {name: (unit, kind, data points)}."""
    collector = HookCollector(CollectorContext(Config(spool_dir=str(spool_dir)), hold_spool_lock=False))
    try:
        families = collector.collect()
    finally:
        collector.close()
    data = to_metrics_data(families, Resource.create({}), 0, 1)
    out: dict[str, Any] = {}
    for m in data.resource_metrics[0].scope_metrics[0].metrics:
        d: Any = m.data
        kind = type(d).__name__.lower() if type(d).__name__ != "Sum" else (
            "counter" if d.is_monotonic else "updowncounter")
        out[m.name] = (m.unit, kind, d.data_points)
    return out


def _points(metric: dict[str, Any]) -> dict[frozenset[tuple[str, Any]], float]:
    return {frozenset(attrs.items()): v for attrs, v in metric["points"]}


# What the agent derives from the shards' headers and its own reading of the spool, not from a process's series:
# the bridge in one process has none of these to give.
AGENT_DERIVED = {"outrider.hook.processes", "outrider.hook.stalled", "outrider.hook.heartbeat.time",
                 "outrider.hook.shard_errors", "outrider.hook.retired_series", "outrider.train.last_step.time",
                 "outrider.train.start.time", "outrider.hook.spool.owner", "outrider.hook.spool.rejected_files",
                 "outrider.hook.stopped",
                 # the efficiency and goodput collectors' (MFU against the device's peak, time by cause across restarts)
                 "outrider.train.goodput.time", "outrider.train.goodput", "outrider.train.restarts",
                 "outrider.train.peak_flops", "outrider.train.mfu", "outrider.train.flops.peak_time",
                 "outrider.train.flops.timed", "outrider.train.device.token_rate"}


def test_the_providers_pipeline_carries_the_hooks_series_as_the_agents_otlp_export_names_them(tmp_path: Path) -> None:
    proc, spool_dir, out = _hooked(SERVICE, tmp_path, RANK="3", TORCHELASTIC_RUN_ID="job-7")
    try:
        wait_until((out / "done").exists, timeout_s=120, what="the hooked process to collect")
        agent = _agent_otlp(spool_dir)  # the same flush, read from the shard as the agent reads it
    finally:
        proc.kill()
        reap([proc])
    got = json.loads((out / "collected.json").read_text())
    assert (out / "standalone").read_text() == "False", "with a meter provider the hook starts no agent of its own"

    assert got["shop.orders"]["scope"] == "shop" and got["shop.orders"]["points"] == [[{}, 12]], "the app's own"
    ours = {name: m for name, m in got.items() if m["scope"] == "outrider"}
    assert all(m["resource"]["service.name"] == "shop" for m in ours.values()), "the application's resource"

    expected: set[str] = set()
    for name, (unit, kind, points) in agent.items():
        if name in AGENT_DERIVED:
            continue
        if kind in ("histogram", "exponentialhistogram"):
            # the agent sends the hook's durations as exponential histograms (their sketches); the bridge has the
            # classic buckets of the same series: the same count and sum, the buckets compared where both are
            # explicit
            expected |= {f"{name}.bucket", f"{name}.count", f"{name}.sum"}
            assert ours[f"{name}.sum"]["unit"] == unit and ours[f"{name}.count"]["kind"] == "counter"
            counts = _points(ours[f"{name}.count"])
            sums = _points(ours[f"{name}.sum"])
            buckets = _points(ours[f"{name}.bucket"])
            assert len(counts) == len(points)
            for p in points:
                key = frozenset(p.attributes.items())
                assert counts[key] == p.count and abs(sums[key] - p.sum) < 1e-9, name
                if kind == "exponentialhistogram":
                    continue
                bounds = [*(repr(float(b)) for b in p.explicit_bounds), "+Inf"]
                cumulative = list(accumulate(p.bucket_counts))
                assert [buckets[key | {("le", le)}] for le in bounds] == cumulative, name
        else:
            expected.add(name)
            assert (ours[name]["unit"], ours[name]["kind"]) == (unit, kind), name
            assert _points(ours[name]) == {frozenset(p.attributes.items()): p.value for p in points}, name
    assert set(ours) == expected, "the agent's names, no more, no less"

    by_otel_name = {d.otel_name: d for d in CATALOG.values()}
    for name, m in ours.items():  # and the catalog's: names, units, instruments
        base = name if name in by_otel_name else name.rsplit(".", 1)[0]
        defn = by_otel_name.get(base)
        if defn is None:
            assert name.startswith("shop_"), f"{name}: neither the catalog's nor the workload's own"
            continue
        assert defn.collector == "hook"
        if base == name:
            assert (m["unit"], m["kind"]) == (defn.unit, defn.instrument), name
        else:
            assert defn.instrument == "histogram" and m["kind"] == "counter"
            assert m["unit"] == (defn.unit if name.endswith(".sum") else "{observation}"), name

    rank = {"outrider.rank": "3", "outrider.training_job": "job-7"}
    assert _points(ours["outrider.train.steps"]) == {frozenset(rank.items()): 12}, "the flush's, not the live cells"
    assert _points(ours["outrider.tokens"]) == {frozenset(rank.items()): 12 * 64}
    ok = frozenset({**rank, "http.route": "/pay", "http.request.method": "POST",
                    "http.response.status_code": 200}.items())
    assert _points(ours["outrider.requests"])[ok] == 9
    assert _points(ours["http.server.request.duration.count"])[ok] == 9
    assert _points(ours["http.server.request.duration.bucket"])[ok | {("le", "0.05")}] == 6
    custom = frozenset({"reason": "late", "rank": "3", "training_job": "job-7"}.items())
    assert _points(ours["shop_refunds_total"]) == {custom: 24}, "the flush's, not the live cells"
    assert ours["shop_basket_seconds.sum"]["unit"] == "s" and ours["shop_queue_depth"]["kind"] == "gauge"
    first = json.loads((out / "first.json").read_text())
    assert "outrider.train.steps" in first and "shop_refunds_total" not in first, \
        "built-in series from the first collection, a new custom name from the next"


PHASES = COLLECT + r"""
import sys, time
from pathlib import Path
import outrider

out = Path(sys.argv[1])
provider.get_meter("shop").create_counter("shop.orders").add(1)
assert outrider.instrument(meter_provider=provider)
for phase in ("alone", "agent", "alone_again"):
    while not (out / f"go-{phase}").exists():
        time.sleep(0.05)
    with outrider.step(samples=1):
        pass
    outrider.flush()
    collect(str(out / f"{phase}.json"))
time.sleep(120)
"""


def test_while_an_agent_serves_the_spool_it_exports_the_series_and_the_provider_gets_none(tmp_path: Path) -> None:
    proc, spool_dir, out = _hooked(PHASES, tmp_path)
    agent: AgentProcess | None = None
    try:
        def phase(name: str) -> dict[str, Any]:
            (out / f"go-{name}").touch()
            wait_until((out / f"{name}.json").exists, timeout_s=60, what=f"the {name} collection")
            return json.loads((out / f"{name}.json").read_text())  # type: ignore[no-any-return]

        alone = phase("alone")
        agent = AgentProcess(env={"OUTRIDER_SPOOL_DIR": str(spool_dir)})  # holds the spool's lock once ready
        served = phase("agent")
        wait_until(lambda: value(samples(agent.metrics()), "outrider_train_steps_total") == 2, timeout_s=30,
                   what="the agent to export the steps meanwhile")
        agent.stop()
        again = phase("alone_again")
    finally:
        if agent is not None:
            agent.stop()
        proc.kill()
        reap([proc])
    assert alone["outrider.train.steps"]["points"] == [[{}, 1]]
    assert [n for n, m in served.items() if m["scope"] == "outrider"] == [], "the agent's path only"
    assert "shop.orders" in served, "the application's own instruments are not the bridge's to hold back"
    assert again["outrider.train.steps"]["points"] == [[{}, 3]], "the bridge takes over again"
