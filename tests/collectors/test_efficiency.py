"""The efficiency collector (MFU, tokens a second per device) on sweeps of known FLOPs, loop time and devices, and
the peak table and its overrides (outrider/ground/peaks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.efficiency import EfficiencyCollector
from outrider.ground import peaks
from outrider.ground.config import Config
from outrider.metrics.family import Family

H100 = "NVIDIA H100 80GB HBM3"


def sweep(flops: dict[str, float], loop_s: float, *, devices: int = 0, threads: float = 0.0, tokens: float = 0.0,
          gpus: tuple[tuple[str, float | None], ...] = (), rank: str = "0") -> list[Family]:
    """One sweep's families: a rank's FLOPs by dtype, loop time, CUDA devices and threads; the node's GPUs."""
    out = [Family("outrider_train_loop_seconds_total").add(loop_s, rank, "job", "step")]
    fl = Family("outrider_train_flops_total")
    for dtype, v in flops.items():
        fl.add(v, rank, "job", dtype)
    out.append(fl)
    memory = Family("outrider_torch_cuda_memory_bytes")
    for d in range(devices):
        memory.add(1 << 30, rank, "job", str(d), "reserved")
        memory.add(0, rank, "job", str(d), "allocated")
    out.append(memory)
    if threads:
        out.append(Family("outrider_torch_intra_op_threads").add(threads, rank, "job"))
    if tokens:
        out.append(Family("outrider_tokens_total").add(tokens, rank, "job"))
    up, clock = Family("outrider_gpu_up"), Family("outrider_gpu_clock_max_hertz")
    for i, (model, hz) in enumerate(gpus):
        up.add(1, str(i), f"GPU-{i}", model)
        if hz is not None:
            clock.add(hz, str(i), f"GPU-{i}", model, "sm")
    return [*out, up, clock]


def collector(**config: object) -> EfficiencyCollector:
    return EfficiencyCollector(CollectorContext(Config(**config)))  # type: ignore[arg-type]


def got(c: EfficiencyCollector, name: str, **labels: str) -> float | None:
    for f in c.collect():
        if f.defn.name != name:
            continue
        for values, v in f.samples:
            named = dict(zip(f.defn.label_names, values))
            if all(named.get(k) == want for k, want in labels.items()):
                return float(v)  # type: ignore[arg-type]
    return None


def test_mfu_on_a_gpu_is_the_flops_time_at_the_tables_peak_over_the_loops_time() -> None:
    c = collector()
    node = ((H100, 1980e6), (H100, 1980e6))
    c._on_sweep(sweep({"bf16": 1e15}, 10.0, devices=1, gpus=node))
    assert got(c, "outrider_train_mfu_ratio") is None, "the first window has no start"
    # 2 s of loop time, in which the bf16 FLOPs would take 0.8 s at 989.4 TFLOP/s
    c._on_sweep(sweep({"bf16": 1e15 + 0.8 * 989.4e12}, 12.0, devices=1, gpus=node))
    assert got(c, "outrider_train_mfu_ratio", rank="0") == pytest.approx(0.4)
    assert got(c, "outrider_train_peak_flops", rank="0", dtype="bf16") == pytest.approx(989.4e12)
    assert got(c, "outrider_train_flops_peak_seconds_total", rank="0") == pytest.approx(0.8)
    assert got(c, "outrider_train_flops_timed_seconds_total", rank="0") == pytest.approx(2.0)


def test_a_rank_on_two_gpus_has_twice_the_peak_and_dtypes_add_their_own_times() -> None:
    c = collector()
    node = ((H100, 1980e6),) * 2
    c._on_sweep(sweep({"bf16": 0.0, "fp32": 0.0}, 1.0, devices=2, gpus=node))
    c._on_sweep(sweep({"bf16": 989.4e12, "fp32": 67e12}, 3.0, devices=2, gpus=node))
    # at 2 x the peaks: 0.5 s of bf16 and 0.5 s of fp32, over 2 s
    assert got(c, "outrider_train_mfu_ratio") == pytest.approx(0.5)


def test_a_sweep_between_two_publications_leaves_the_window_open() -> None:
    c = collector()
    node = ((H100, 1980e6),)
    c._on_sweep(sweep({"bf16": 0.0}, 1.0, devices=1, gpus=node))
    c._on_sweep(sweep({"bf16": 0.0}, 1.0, devices=1, gpus=node))  # the hook did not publish meanwhile
    c._on_sweep(sweep({"bf16": 989.4e12}, 3.0, devices=1, gpus=node))
    assert got(c, "outrider_train_mfu_ratio") == pytest.approx(0.5)


def test_steps_before_the_first_count_never_read_as_idle() -> None:
    """The FLOPs appear after a few steps: the window that holds steps without them gives no MFU."""
    c = collector()
    node = ((H100, 1980e6),)
    c._on_sweep(sweep({}, 1.0, devices=1, gpus=node, tokens=10.0))
    c._on_sweep(sweep({"bf16": 100e12}, 2.0, devices=1, gpus=node, tokens=20.0))
    assert got(c, "outrider_train_mfu_ratio") is None
    c._on_sweep(sweep({"bf16": 100e12 + 989.4e12}, 4.0, devices=1, gpus=node, tokens=30.0))
    assert got(c, "outrider_train_mfu_ratio") == pytest.approx(0.5)


def test_a_node_of_mixed_or_unknown_gpus_has_no_peak_unless_configured() -> None:
    mixed = ((H100, 1980e6), ("NVIDIA A100-SXM4-80GB", 1410e6))
    c = collector()
    c._on_sweep(sweep({"bf16": 0.0}, 1.0, devices=1, gpus=mixed))
    c._on_sweep(sweep({"bf16": 1e14}, 2.0, devices=1, gpus=mixed))
    assert got(c, "outrider_train_mfu_ratio") is None and got(c, "outrider_train_peak_flops") is None
    c = collector(peak_flops="bf16=200e12")
    c._on_sweep(sweep({"bf16": 0.0}, 1.0, devices=1, gpus=(("NVIDIA Mystery", None),)))
    c._on_sweep(sweep({"bf16": 1e14}, 2.0, devices=1, gpus=(("NVIDIA Mystery", None),)))
    assert got(c, "outrider_train_mfu_ratio") == pytest.approx(0.5)


def test_a_cpu_rank_gets_the_measured_peak_scaled_to_its_threads() -> None:
    c = collector(cpu_peak_gflops=100.0, cpu_peak_threads=4)
    c._on_sweep(sweep({"fp32": 0.0}, 1.0, threads=2))
    c._on_sweep(sweep({"fp32": 25e9}, 2.0, threads=2))  # 25 GFLOP in 1 s on half the CPU (50 GFLOP/s)
    assert got(c, "outrider_train_peak_flops", dtype="fp32") == pytest.approx(50e9)
    assert got(c, "outrider_train_mfu_ratio") == pytest.approx(0.5)


def test_a_rank_whose_process_exited_keeps_the_peak_it_had() -> None:
    """An exited process's gauges (threads, CUDA memory) are retired and its counters kept: its peak must not turn
    into the whole CPU's, nor a GPU rank's into the CPU's."""
    c = collector(cpu_peak_gflops=100.0, cpu_peak_threads=4)
    c._on_sweep(sweep({"fp32": 0.0}, 1.0, threads=2))
    c._on_sweep(sweep({"fp32": 25e9}, 2.0, threads=2))
    c._on_sweep(sweep({"fp32": 25e9}, 2.0))
    assert got(c, "outrider_train_peak_flops", dtype="fp32") == pytest.approx(50e9)
    g = collector()
    node = ((H100, 1980e6),)
    g._on_sweep(sweep({"bf16": 0.0}, 1.0, devices=1, gpus=node))
    g._on_sweep(sweep({"bf16": 989.4e12}, 3.0, gpus=node))
    assert got(g, "outrider_train_peak_flops", dtype="bf16") == pytest.approx(989.4e12)
    assert got(g, "outrider_train_mfu_ratio") == pytest.approx(0.5)


def test_declared_flops_are_judged_at_the_devices_usual_dtype() -> None:
    c = collector()
    node = (("NVIDIA A100-SXM4-80GB", 1410e6),)
    c._on_sweep(sweep({"declared": 0.0}, 1.0, devices=1, gpus=node))
    c._on_sweep(sweep({"declared": 312e12}, 5.0, devices=1, gpus=node))
    assert got(c, "outrider_train_mfu_ratio") == pytest.approx(0.25)


def test_tokens_a_second_per_device() -> None:
    c = collector()
    node = ((H100, 1980e6),) * 4
    c._on_sweep(sweep({}, 1.0, devices=4, gpus=node, tokens=1000.0))
    c._on_sweep(sweep({}, 3.0, devices=4, gpus=node, tokens=9000.0))
    assert got(c, "outrider_train_device_tokens_per_second") == pytest.approx(1000.0)


def test_a_rank_gone_keeps_its_counters_and_loses_its_gauges() -> None:
    c = collector()
    node = ((H100, 1980e6),)
    c._on_sweep(sweep({"bf16": 0.0}, 1.0, devices=1, gpus=node))
    c._on_sweep(sweep({"bf16": 989.4e12}, 3.0, devices=1, gpus=node))
    c._on_sweep(sweep({"bf16": 0.0}, 1.0, devices=1, gpus=node, rank="1"))
    assert got(c, "outrider_train_mfu_ratio", rank="0") is None
    assert got(c, "outrider_train_flops_timed_seconds_total", rank="0") == 2.0


@pytest.mark.parametrize(("name", "model", "bf16_tflops"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4), ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5), ("NVIDIA H200", "H200 SXM", 989.4), ("NVIDIA H200 NVL", "H200 NVL", 835.5),
    ("NVIDIA A100-SXM4-40GB", "A100", 312.0), ("NVIDIA A100 80GB PCIe", "A100", 312.0), ("NVIDIA L40S", "L40S", 362.05),
    ("NVIDIA L40", "L40", 181.05), ("NVIDIA L4", "L4", 121.0), ("NVIDIA B200", "B200", 2250.0),
    ("NVIDIA GH200 480GB", "H100 SXM", 989.4),
])
def test_the_table_knows_each_devices_nvml_name(name: str, model: str, bf16_tflops: float) -> None:
    row = peaks.gpu_row(name)
    assert row is not None and row.model == model
    assert row.flops["bf16"] == pytest.approx(bf16_tflops * 1e12)


def test_a_slower_variant_is_scaled_by_its_maximum_clock_and_never_up() -> None:
    assert peaks.gpu_peaks(H100, 990e6)["bf16"] == pytest.approx(989.4e12 / 2)  # type: ignore[index]
    assert peaks.gpu_peaks(H100, 2500e6)["bf16"] == pytest.approx(989.4e12)  # type: ignore[index]
    assert peaks.gpu_peaks("NVIDIA A10G") is None and peaks.gpu_peaks("NVIDIA H20") is None


@pytest.mark.parametrize(("text", "expected"), [
    ("989e12", dict.fromkeys(peaks.DTYPES, 989e12)), ("bf16=1e15, fp32=6e13", {"bf16": 1e15, "fp32": 6e13}),
    ("", {}),
])
def test_peak_flops_is_one_figure_or_one_per_dtype(text: str, expected: dict[str, float]) -> None:
    assert peaks.parse_peaks(text) == expected


@pytest.mark.parametrize("text", ["fast", "bf17=1e15", "bf16=-1", "1e15,bf16=1", "bf16=nan"])
def test_a_bad_peak_is_refused_with_what_was_expected(text: str) -> None:
    with pytest.raises(ValueError, match="FLOP/s"):
        peaks.parse_peaks(text)


def test_a_dtype_without_a_figure_is_judged_at_the_nearest_one() -> None:
    v100 = peaks.gpu_peaks("Tesla V100-SXM2-32GB")
    assert v100 is not None
    assert peaks.seconds_at_peak({"tf32": 15.7e12}, v100) == pytest.approx(1.0), "no TF32 cores: fp32's"
    assert peaks.seconds_at_peak({"bf16": 125e12}, v100) == pytest.approx(1.0), "no bf16: the usual dtype, fp16"


def test_the_cpu_peak_is_cached_per_machine_key(tmp_path: Path) -> None:
    a, b = peaks.CpuPeak(40e9, 2, 3.0), peaks.CpuPeak(80e9, 4, 2.5)
    peaks.cache_cpu_peak("cpu-a|2", a, str(tmp_path))
    peaks.cache_cpu_peak("cpu-b|4", b, str(tmp_path))
    assert peaks.cached_cpu_peak("cpu-a|2", str(tmp_path)) == a, "another machine's figure is kept beside it"
    assert peaks.cached_cpu_peak("cpu-b|4", str(tmp_path)) == b
    assert peaks.cached_cpu_peak("cpu-a|8", str(tmp_path)) is None, "another CPU count is another machine"
    (tmp_path / peaks.CACHE_NAME).write_text("{not json")
    assert peaks.cached_cpu_peak("cpu-a|2", str(tmp_path)) is None
    peaks.cache_cpu_peak("cpu-a|2", a, str(tmp_path))  # a broken cache is written over whole
    assert peaks.cached_cpu_peak("cpu-a|2", str(tmp_path)) == a


def test_the_torch_version_in_the_peaks_key_is_the_installed_ones() -> None:
    """Read from the metadata folder's name (importlib.metadata would load the email package into the agent)."""
    from importlib import metadata

    from outrider.ground.peaks import torch_version

    assert torch_version() == metadata.version("torch")
