"""Builds the fake libnvidia-ml.so.1 (tests/fakes/fake_nvml.c) against the real nvml.h from nvidia-nvml-dev.

The fake stands in for the NVIDIA driver: the collector goes through the real nvidia-ml-py bindings into it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.gpu import GpuCollector
from outrider.ground.config import Config
from outrider.metrics.exposition import render
from outrider.wiring.sampler import SweepStats
from tests.fakes.build import build
from tests.helpers import samples


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """{"full": path, "old": path}: a current driver, and one without the newer symbols."""
    try:
        return build(tmp_path_factory.mktemp("fake-nvml"))
    except FileNotFoundError as e:
        pytest.fail(str(e))


class Scenario:
    """The fake's scenario file; every write changes size or mtime, so the fake re-reads it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.version = 0

    def write(self, text: str) -> None:
        """Atomically (rename), so the fake never reads a half-written scenario."""
        self.version += 1
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text + f"\n# version {self.version}\n")
        os.replace(tmp, self.path)


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    s = Scenario(tmp_path / "scenario.txt")
    s.write("device_count 0")
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(s.path))
    return s


_open: list[GpuCollector] = []


def make_collector(lib: str, proc_root: str = "/proc") -> GpuCollector:
    c = GpuCollector(CollectorContext(Config(nvml_library=lib, proc_root=proc_root), SweepStats()))
    _open.append(c)
    return c


@pytest.fixture(autouse=True)
def _close_collectors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test's XID watcher threads end with it (close() joins them), so none steals the next test's events."""
    from outrider.adapters.nvml import XidWatcher

    monkeypatch.setattr(XidWatcher, "WAIT_MS", 50)
    yield
    while _open:
        _open.pop().close()


def sweep(c: GpuCollector) -> dict:  # type: ignore[type-arg]
    return samples(render(c.collect()).decode())


# What one sweep asks NVML once the first sweep has found what the driver offers: the device count, then every
# reading of every GPU once (34: utilisation x3, memory, temperature, field values, power, energy, clocks x2,
# performance state, fan, clock event reasons, violations x6, PCIe x3, ECC x4, remapped rows, MIG mode, GPM x4,
# processes x2), each NVLink's four error counters and its state, and with MIG on, the slot count and four readings per
# slot. A reading the driver does not offer is not asked again, so a real GPU asks at most this.
NVML_CALLS_PER_SWEEP = 1
NVML_CALLS_PER_GPU = 34
NVML_CALLS_PER_NVLINK = 5
NVML_CALLS_PER_MIG_SLOT = 4


def nvml_call_bound(gpus: int, nvlinks: int = 0, mig_slots: int = 0, mig_gpus: int = 0) -> int:
    return (NVML_CALLS_PER_SWEEP + gpus * NVML_CALLS_PER_GPU + nvlinks * NVML_CALLS_PER_NVLINK
            + mig_gpus + mig_slots * NVML_CALLS_PER_MIG_SLOT)

