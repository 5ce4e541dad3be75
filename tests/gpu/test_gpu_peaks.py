"""A GPU rank's peak and MFU from what NVML says of the node's GPUs (the fake libnvidia-ml.so.1 through the real
bindings and the GPU collector), into the efficiency collector beside a rank's published FLOPs."""

from __future__ import annotations

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.efficiency import EfficiencyCollector
from outrider.ground.config import Config
from outrider.metrics.family import Family
from tests.gpu.conftest import Scenario, make_collector


def node(name: str, max_clock_mhz: int, gpus: int = 2) -> str:
    lines = [f"device_count {gpus}"]
    for i in range(gpus):
        lines += [f"gpu {i} name {name}", f"gpu {i} uuid GPU-{i}", f"gpu {i} memory_total 85899345920",
                  f"gpu {i} max_clock_sm {max_clock_mhz}"]
    return "\n".join(lines)


def rank_on_one_gpu(bf16_flops: float, loop_s: float) -> list[Family]:
    return [Family("outrider_train_flops_total").add(bf16_flops, "0", "job", "bf16"),
            Family("outrider_train_loop_seconds_total").add(loop_s, "0", "job", "step"),
            Family("outrider_torch_cuda_memory_bytes").add(1 << 30, "0", "job", "0", "reserved")]


def peak_and_mfu(c: EfficiencyCollector) -> tuple[float | None, float | None]:
    fams = {f.defn.name: f for f in c.collect()}
    peak = next((float(v) for labels, v in fams["outrider_train_peak_flops"].samples  # type: ignore[arg-type]
                 if labels[2] == "bf16"), None)
    mfu = next((float(v) for _, v in fams["outrider_train_mfu_ratio"].samples), None)  # type: ignore[arg-type]
    return peak, mfu


@pytest.mark.parametrize(("name", "clock_mhz", "bf16_peak"), [
    ("NVIDIA H100 PCIe", 1755, 756e12),  # the datasheet's clock: its figure
    ("NVIDIA H100 80GB HBM3", 1485, 989.4e12 * 1485 / 1980),  # a clock-limited variant: scaled down
])
def test_the_peak_comes_from_nvmls_name_and_clock(fake_nvml: dict[str, str], scenario: Scenario, name: str,
                                                  clock_mhz: int, bf16_peak: float) -> None:
    scenario.write(node(name, clock_mhz))
    gpu = make_collector(fake_nvml["full"])
    c = EfficiencyCollector(CollectorContext(Config()))
    c._on_sweep([*gpu.collect(), *rank_on_one_gpu(0.0, 10.0)])
    c._on_sweep([*gpu.collect(), *rank_on_one_gpu(bf16_peak * 0.5, 11.0)])  # half a second at the peak in 1 s
    peak, mfu = peak_and_mfu(c)
    assert peak == pytest.approx(bf16_peak)
    assert mfu == pytest.approx(0.5)


def test_a_gpu_the_table_does_not_know_gives_no_mfu(fake_nvml: dict[str, str], scenario: Scenario) -> None:
    scenario.write(node("NVIDIA Mystery 9000", 2000))
    gpu = make_collector(fake_nvml["full"])
    c = EfficiencyCollector(CollectorContext(Config()))
    c._on_sweep([*gpu.collect(), *rank_on_one_gpu(0.0, 10.0)])
    c._on_sweep([*gpu.collect(), *rank_on_one_gpu(1e14, 11.0)])
    assert peak_and_mfu(c) == (None, None)
