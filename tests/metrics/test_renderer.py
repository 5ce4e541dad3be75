"""The sampler's renderer keeps each family's text between sweeps: whatever the sweeps do, what it serves is what
rendering each sweep afresh gives, byte for byte, in both formats."""

from __future__ import annotations

import random

import pytest

from outrider.metrics.exposition import Renderer, render
from outrider.metrics.family import Family, HistogramValue


def sweep(rng: random.Random, kept: Family) -> list[Family]:
    """A sweep where some families change, some do not, some vanish, names repeat and series duplicate."""
    fams = [kept]
    if rng.random() < 0.7:
        fams.append(Family("outrider_host_logical_cpus").add(4))  # static
    io = Family("outrider_host_disk_io_bytes_total")
    for dev in rng.sample(["sda", "sdb", "nvme0n1"], rng.randint(0, 3)):
        io.add(rng.choice([0, 1, 2**40, 0.5]), dev, "read").add(rng.choice([7, 8]), dev, "write")
    fams.append(io)
    if rng.random() < 0.3:
        io2 = Family("outrider_host_disk_io_bytes_total").add(rng.choice([1, 2]), "sda", "read")  # same name again
        fams.append(io2)
    fams.append(Family("outrider_host_load1").add(rng.choice([0.25, float("nan"), float("inf"), -0.0, 1e17])))
    if rng.random() < 0.5:
        h = HistogramValue((0.1, 1.0), (rng.randint(0, 2), 1, 0), rng.choice([0.5, 1.5]))
        fams.append(Family("outrider_request_duration_seconds").add(h, "/x", "GET", "http", "200", "2xx", "0", "job"))
    return fams


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_kept_text_equals_a_fresh_render_sweep_after_sweep(openmetrics: bool) -> None:
    rng = random.Random(7)
    renderer = Renderer(openmetrics)
    kept = Family("outrider_agent_sweeps_total").add(1)  # a collector that keeps its Family and changes it
    for i in range(300):
        if rng.random() < 0.3:
            kept.samples[0] = ((), float(i))
        fams = sweep(rng, kept)
        assert renderer.render(fams) == render(fams, openmetrics), f"sweep {i}"
