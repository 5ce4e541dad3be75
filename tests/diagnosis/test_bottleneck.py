"""Bottleneck classes from signals; the GPU-side classes from the real GPU collector against fake-NVML scenarios
(standing in for a GPU) combined with hook and process families."""

from __future__ import annotations

import pytest

from outrider.diagnosis.bottleneck import CLASSES, RECOMMENDATIONS, classify
from outrider.diagnosis.signals import signals, snapshot
from outrider.metrics.family import Family, HistogramValue
from tests.gpu.conftest import Scenario, make_collector

BOUNDS = (0.01, 0.1, 1.0)


def workload(step_s: float, wait_s: float, cpu_s: float, steps: int = 100) -> list[Family]:
    """Cumulative hook and process families after `steps` steps of the given shape."""
    return [
        Family("outrider_train_step_duration_seconds").add(HistogramValue(BOUNDS, (0, steps, 0, 0), step_s * steps),
                                                            "", ""),
        Family("outrider_train_data_wait_seconds").add(HistogramValue(BOUNDS, (0, steps, 0, 0), wait_s * steps), "",
                                                       ""),
        Family("outrider_samples_total").add(32 * steps, "", ""),
        Family("outrider_watched_cpu_seconds_total").add(cpu_s, "user"),
        Family("outrider_host_logical_cpus").add(8),
    ]


def verdict(old: list[Family], new: list[Family], dt: float = 10.0) -> str:
    return classify(signals(snapshot(old), snapshot(new), dt)).cls


GPU = """device_count 1
gpu 0 name NVIDIA H100 80GB HBM3
gpu 0 uuid GPU-0
gpu 0 memory_total 100
gpu 0 memory_free 0
"""


@pytest.mark.parametrize(("scenario_text", "wait_s", "cpu_cores", "expected"), [
    ("gpu 0 util_gpu 95\ngpu 0 memory_used 50\n", 0.0, 1.0, "compute_bound"),
    ("gpu 0 util_gpu 90\ngpu 0 memory_used 50\ngpu 0 clock_reasons 0x40\n", 0.0, 1.0, "throttled"),
    ("gpu 0 util_gpu 90\ngpu 0 memory_used 50\ngpu 0 clock_reasons 0x80\n", 0.0, 1.0, "throttled"),
    ("gpu 0 util_gpu 70\ngpu 0 memory_used 97\n", 0.0, 1.0, "memory_pressure"),
    ("gpu 0 util_gpu 20\ngpu 0 memory_used 50\n", 0.08, 0.3, "input_bound"),
    ("gpu 0 util_gpu 25\ngpu 0 memory_used 50\n", 0.0, 1.0, "host_bound"),
    ("gpu 0 util_gpu 70\ngpu 0 memory_used 50\ngpu 0 gpm_supported 1\ngpu 0 gpm 10 85\ngpu 0 gpm 2 30\n", 0.0, 1.0,
     "memory_bandwidth_bound"),
])
def test_gpu_side_classes_from_fake_nvml(fake_nvml: dict[str, str], scenario: Scenario, scenario_text: str,
                                        wait_s: float, cpu_cores: float, expected: str) -> None:
    scenario.write(GPU + scenario_text)
    gpu = make_collector(fake_nvml["full"])
    first = gpu.collect()
    second = gpu.collect()  # GPM needs two samples
    old = workload(0.02, wait_s, 0.0, steps=100) + first
    new = workload(0.02, wait_s, cpu_cores * 10.0, steps=300) + second
    assert verdict(old, new) == expected


def test_idle() -> None:
    same = workload(0.02, 0.0, 5.0)
    assert verdict(same, same) == "idle"


def test_cpu_only_compute_and_host() -> None:
    assert verdict(workload(0.05, 0.0, 0.0), workload(0.05, 0.0, 70.0, steps=300)) == "compute_bound"
    assert verdict(workload(0.01, 0.0, 0.0), workload(0.01, 0.0, 10.0, steps=1000)) == "host_bound"
    assert verdict(workload(0.01, 0.03, 0.0), workload(0.01, 0.03, 2.0, steps=300)) == "input_bound"


def test_every_verdict_carries_evidence_and_advice() -> None:
    v = classify(signals(snapshot(workload(0.01, 0.03, 0.0)), snapshot(workload(0.01, 0.03, 2.0, steps=300)), 10))
    assert v.evidence["data_wait_fraction"] == pytest.approx(0.75)
    assert v.evidence["steps_per_s"] == pytest.approx(20)
    assert "num_workers" in v.recommendation or "workers" in v.recommendation
    assert set(RECOMMENDATIONS) == set(CLASSES)
