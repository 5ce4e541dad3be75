"""Prometheus native histograms, end to end: Debian's Prometheus 2.42 started with --enable-feature=native-histograms
scrapes /metrics, asks for the protobuf exposition first, and answers PromQL over the native histograms it stored.

Three targets in one Prometheus: the endpoint serving a sweep with a recorded distribution (request latencies as a
sketch, a batch of known values added every sweep, so the rate over any window is that batch's distribution); the
same sweep from an endpoint told not to serve protobuf (native_histograms: false); and the real `outrider agent`,
whose every family must arrive through the protobuf exposition as it does through the text one.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrider.collectors.base import Collector, CollectorContext
from outrider.exporters.prometheus import Endpoints, MetricsServer, alerts_api_json
from outrider.ground.config import Config
from outrider.metrics.family import Family, HistogramValue
from outrider.shared.sketch import BASE, Sketch, lower_bound, upper_bound
from outrider.wiring.sampler import Sampler
from tests.helpers import AgentProcess, samples, wait_until
from tests.servers import PrometheusServer

pytestmark = pytest.mark.integration
BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH = [random.Random(42).lognormvariate(math.log(0.08), 0.9) for _ in range(400)]
BATCH_SKETCH = Sketch.of_values(BATCH)
BATCH_COUNTS = tuple(sum(1 for v in BATCH if bisect_left(BOUNDS, v) == i) for i in range(len(BOUNDS) + 1))
LATENCY = "outrider_request_duration_seconds"
BATCH_SIZE = "outrider_inference_batch_size"  # a classic histogram: no sketch
LABELS = ("/generate", "POST", "http", "200", "2xx", "0", "serve")


class Latencies(Collector):
    """Each sweep, the same batch of request latencies more (cumulative), and a classic histogram beside them."""

    name = "latencies"

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.sweeps = 0

    def collect(self) -> list[Family]:
        self.sweeps += 1  # one sweep at a time: the sampler's thread
        k = self.sweeps
        sketch = Sketch.of(BATCH_SKETCH.zero * k, {i: c * k for i, c in BATCH_SKETCH.buckets.items()})
        latency = HistogramValue(BOUNDS, tuple(c * k for c in BATCH_COUNTS), sum(BATCH) * k, sketch)
        sizes = HistogramValue((1.0, 4.0, 16.0), (k, 2 * k, 0, 0), 5.0 * k)
        return [Family(LATENCY).add(latency, *LABELS),
                Family(BATCH_SIZE).add(sizes, *([""] * Family(BATCH_SIZE).defn.arity))]


@pytest.fixture
def sweeps() -> Iterator[tuple[Sampler, MetricsServer, MetricsServer]]:
    """A sampler sweeping Latencies every second, served by two endpoints: protobuf allowed, and not."""
    sampler = Sampler(Config(interval_s=1.0), collectors=[])
    sampler.collectors = [Latencies(sampler.ctx)]
    endpoints = Endpoints(lambda fmt, gz: sampler.exposition(fmt, gz), lambda: alerts_api_json([]),
                          lambda: True, sampler.ready.is_set)
    native = MetricsServer(endpoints, "127.0.0.1", 0)
    classic = MetricsServer(endpoints, "127.0.0.1", 0, protobuf=False)
    sampler.start()
    native.start()
    classic.start()
    try:
        yield sampler, native, classic
    finally:
        native.stop()
        classic.stop()
        sampler.stop()


def instance(server: MetricsServer) -> str:
    return f"127.0.0.1:{server.address[1]}"


def scalar(prom: PrometheusServer, promql: str) -> float:
    (result,) = prom.wait_for(promql)
    return float(result["value"][1])


def test_prometheus_stores_native_histograms_whose_quantiles_and_counts_are_the_values(
        tmp_path: Path, sweeps: tuple[Sampler, MetricsServer, MetricsServer]) -> None:
    sampler, native, classic = sweeps
    with AgentProcess() as agent, PrometheusServer(
            tmp_path / "prom", [instance(native), instance(classic), f"127.0.0.1:{agent.port}"],
            flags=("--enable-feature=native-histograms",)) as prom:
        on_native = f'{{instance="{instance(native)}"}}'
        # the count is exact: a whole number of batches
        count = scalar(prom, f"histogram_count({LATENCY}{on_native})")
        assert count > 0 and count % len(BATCH) == 0, count
        # what Prometheus stored is the sketch, bucket by bucket: each of its buckets (lower, upper] is the sketch's
        # bucket i, (2**(i/32), 2**((i+1)/32)], with the count the sketch has there
        ((_, stored),) = [r["histogram"] for r in prom.wait_for(f"{LATENCY}{on_native}")]
        batches = int(stored["count"]) // len(BATCH)
        buckets = {}
        for rule, lower, upper, n in stored["buckets"]:
            i = round(math.log2(float(upper)) * 32) - 1
            assert rule == 0, "left-open, right-closed: (lower, upper]"
            assert (float(lower), float(upper)) == pytest.approx((lower_bound(i), upper_bound(i)), rel=1e-12)
            buckets[i] = int(n)
        assert buckets == {i: c * batches for i, c in BATCH_SKETCH.buckets.items()}
        assert float(stored["sum"]) == pytest.approx(sum(BATCH) * batches, rel=1e-12)
        # the rate over a window holds whole batches: its mean is the batch's, its quantiles the batch's within
        # the width of one bucket (Prometheus interpolates inside the bucket that holds the rank)
        window = f"rate({LATENCY}{on_native}[1m])"
        prom.wait_for(f"histogram_count({window}) > 0")
        mean = scalar(prom, f"histogram_sum({window}) / histogram_count({window})")
        assert mean == pytest.approx(sum(BATCH) / len(BATCH), rel=1e-9)
        ordered = sorted(BATCH)
        errors = {}
        for q in (0.5, 0.9, 0.99):
            true = ordered[math.ceil(q * len(BATCH)) - 1]
            errors[q] = scalar(prom, f"histogram_quantile({q}, {window})") / true - 1
        print("histogram_quantile over the native histogram, relative to the values':",
              {q: f"{e:+.3%}" for q, e in errors.items()})
        assert all(abs(e) <= BASE - 1 for e in errors.values()), errors

        # What 2.42 keeps: of a native histogram, nothing classic (no _bucket, _count or _sum series); a histogram
        # with no sketch stays classic in the same scrape; an endpoint that serves no protobuf keeps every _bucket
        for suffix in ("_bucket", "_count", "_sum"):
            assert prom.query(f"{LATENCY}{suffix}{on_native}") == [], suffix
        assert prom.wait_for(f'{BATCH_SIZE}_bucket{{instance="{instance(native)}", le="4.0"}}')
        on_classic = f'instance="{instance(classic)}"'
        les = {r["metric"]["le"] for r in prom.wait_for(f"{LATENCY}_bucket{{{on_classic}}}")}
        assert les == {repr(b) for b in BOUNDS} | {"+Inf"}
        assert prom.query(f"histogram_count({LATENCY}{{{on_classic}}})") == [], "no native histogram from it"

        # the real agent's every family arrives through the protobuf exposition: the names Prometheus stored are
        # those of the agent's text exposition, and every sample it parsed was ingested
        on_agent = f'instance="127.0.0.1:{agent.port}"'

        def names_match() -> bool:
            stored = {r["metric"]["__name__"] for r in prom.query(
                f'group by (__name__) ({{{on_agent}, __name__!~"up|scrape_.+"}})')}
            return stored == {name for name, _ in samples(agent.metrics())}
        wait_until(names_match, timeout_s=30, what="the names Prometheus stored to be those the agent exposes")
        ingested = f'count({{{on_agent}, __name__!~"up|scrape_.+"}})'
        assert prom.wait_for(f"{ingested} == scalar(scrape_samples_scraped{{{on_agent}}})")
    assert sampler.stats.sweeps >= 3
