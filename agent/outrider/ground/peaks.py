"""The peak FLOP rate of a device, per dtype: what model FLOPs utilisation (MFU) divides by.

GPUs: a table of NVIDIA's datasheet figures, dense (without 2:4 sparsity, which the datasheets' headline figures
double), per dtype, looked up by the name NVML gives the device. A device whose maximum SM clock (NVML) is below
the clock the datasheet's figures assume gets them scaled down by that ratio (a power- or clock-limited variant);
never up. A name the table does not know has no peak (no MFU) until `peak_flops` gives one. docs/efficiency.md
shows the table (generated from this one).

CPUs: no table could say what torch reaches on a given CPU (its vector units, its cores, its memory, torch's own
kernels), so the peak is measured: one calibrated float32 matrix product in torch, in a child process of its own
(`python -m outrider.ground.peaks`), never in the agent (which does not import torch) nor on the workload's threads;
`outrider run` runs it before it starts the command, once per machine and torch (then it reads the cache); the
agent's efficiency collector reads that cache, or `cpu_peak_gflops` set by hand. The measured figure is the best
of a few products of a size that fills the caches and cores (CPU_MATMUL_N), with torch's default threads: an
achievable peak, which a workload of large float32 products approaches (its MFU near 1), not the vector units'
theoretical one. Other dtypes on a CPU are judged against it too.

Dtypes are the hook's labels (hook/torch_flops.py): fp64, fp32, tf32 (fp32 products on tensor cores), bf16, fp16,
fp8; FLOPs of a dtype the device has no figure for are judged against the nearest it has (NEAREST: tf32 on fp32,
fp64 on fp32), else, as FLOPs a step declared without a dtype, against the device's usual training dtype
(`usual()`: bf16 where it has it, else fp16, else fp32).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass

DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
T = 1e12


@dataclass(frozen=True)
class GpuPeak:
    model: str  # as the table shows it
    pattern: str  # a regular expression searched in the NVML name (case-insensitive); the first row that matches
    boost_mhz: float | None  # the SM clock the figures assume (None: not scaled)
    flops: Mapping[str, float]  # dtype -> dense FLOP/s
    source: str

    def at_clock(self, max_sm_clock_hz: float | None) -> dict[str, float]:
        scale = 1.0
        if self.boost_mhz and max_sm_clock_hz and max_sm_clock_hz > 0:
            scale = min(1.0, max_sm_clock_hz / (self.boost_mhz * 1e6))
        return {dtype: value * scale for dtype, value in self.flops.items()}


def _tf(**per_dtype: float) -> dict[str, float]:
    return {dtype: value * T for dtype, value in per_dtype.items()}


_HOPPER_SXM = _tf(fp64=67.0, fp32=67.0, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9)
_HOPPER_NVL = _tf(fp64=60.0, fp32=60.0, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5)
_AMPERE_A100 = _tf(fp64=19.5, fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0)
# First match wins: the more specific names first (H100 NVL and PCIe before H100, L40S before L40, H200 before H20)
GPU_PEAKS: tuple[GpuPeak, ...] = (
    GpuPeak("H100 NVL", r"\bH100\s*NVL", 1785, _HOPPER_NVL, "NVIDIA H100 datasheet (NVL, per GPU)"),
    GpuPeak("H100 PCIe", r"\bH100.*PCIe", 1755, _tf(fp64=51.0, fp32=51.0, tf32=378.0, bf16=756.0, fp16=756.0,
                                                     fp8=1513.0), "NVIDIA H100 datasheet (PCIe)"),
    GpuPeak("H100 SXM", r"\bH100|\bH800|\bGH200", 1980, _HOPPER_SXM, "NVIDIA H100 datasheet (SXM)"),
    GpuPeak("H200 NVL", r"\bH200\s*NVL", 1785, _HOPPER_NVL, "NVIDIA H200 datasheet (NVL)"),
    GpuPeak("H200 SXM", r"\bH200", 1980, _HOPPER_SXM, "NVIDIA H200 datasheet (SXM)"),
    GpuPeak("GB200", r"\bGB200", None, _tf(fp64=40.0, fp32=80.0, tf32=1250.0, bf16=2500.0, fp16=2500.0, fp8=5000.0),
            "NVIDIA GB200 NVL72 specifications (per GPU)"),
    GpuPeak("B200", r"\bB200", None, _tf(fp64=37.0, fp32=75.0, tf32=1100.0, bf16=2250.0, fp16=2250.0, fp8=4500.0),
            "NVIDIA HGX B200 specifications (per GPU)"),
    GpuPeak("A100", r"\bA100|\bA800", 1410, _AMPERE_A100, "NVIDIA A100 datasheet (SXM and PCIe)"),
    GpuPeak("L40S", r"\bL40S", 2520, _tf(fp32=91.6, tf32=183.0, bf16=362.05, fp16=362.05, fp8=733.0),
            "NVIDIA L40S datasheet"),
    GpuPeak("L40", r"\bL40\b", 2490, _tf(fp32=90.5, tf32=90.5, bf16=181.05, fp16=181.05, fp8=362.0),
            "NVIDIA L40 datasheet"),
    GpuPeak("L4", r"\bL4\b", 2040, _tf(fp32=30.3, tf32=60.0, bf16=121.0, fp16=121.0, fp8=242.5),
            "NVIDIA L4 datasheet"),
    GpuPeak("A10", r"\bA10\b", 1695, _tf(fp32=31.2, tf32=62.5, bf16=125.0, fp16=125.0), "NVIDIA A10 datasheet"),
    GpuPeak("V100 SXM2", r"\bV100-SXM", 1530, _tf(fp64=7.8, fp32=15.7, fp16=125.0), "NVIDIA V100 datasheet (SXM2)"),
    GpuPeak("V100 PCIe", r"\bV100", 1380, _tf(fp64=7.0, fp32=14.0, fp16=112.0), "NVIDIA V100 datasheet (PCIe)"),
    GpuPeak("T4", r"\bT4\b", 1590, _tf(fp32=8.1, fp16=65.0), "NVIDIA T4 datasheet"),
)
_COMPILED = tuple((re.compile(row.pattern, re.IGNORECASE), row) for row in GPU_PEAKS)


def gpu_row(name: str) -> GpuPeak | None:
    """The table's row for an NVML device name (None: not in the table)."""
    for pattern, row in _COMPILED:
        if pattern.search(name):
            return row
    return None


def gpu_peaks(name: str, max_sm_clock_hz: float | None = None) -> dict[str, float] | None:
    """The dense peak FLOP/s per dtype of an NVML device name at its maximum SM clock; None where unknown."""
    row = gpu_row(name)
    return row.at_clock(max_sm_clock_hz) if row is not None else None


def usual_dtype(peaks: Mapping[str, float]) -> str | None:
    """The device's usual training dtype: bf16 where it has a figure, else fp16, else fp32."""
    return next((dtype for dtype in ("bf16", "fp16", "fp32") if peaks.get(dtype)), None)


def usual(peaks: Mapping[str, float]) -> float | None:
    """The peak of the device's usual training dtype (what declared FLOPs, and FLOPs of a dtype without a figure,
    are judged against)."""
    dtype = usual_dtype(peaks)
    return peaks[dtype] if dtype is not None else None


# A dtype the device has no figure for runs on the units of this one where it has them (TF32 products on a GPU
# without TF32 cores run in fp32; fp64 on one without fp64 units, in fp32 at best); else at the usual dtype.
NEAREST = {"tf32": "fp32", "fp64": "fp32"}


def seconds_at_peak(flops: Mapping[str, float], peaks: Mapping[str, float]) -> float | None:
    """How long the FLOPs (by dtype) would take at the peaks: the numerator of MFU over a wall time. None where the
    device has no figure at all."""
    fallback = usual(peaks)
    if fallback is None:
        return None
    return sum(value / (peaks.get(dtype) or peaks.get(NEAREST.get(dtype, "")) or fallback)
               for dtype, value in flops.items() if value > 0)


def parse_peaks(text: str) -> dict[str, float]:
    """`peak_flops`'s form: `bf16=989e12,fp32=67e12` (FLOP/s per dtype); one number alone is every dtype's.
    ValueError saying what was expected."""
    what = "a peak in FLOP/s (989e12), or dtype=FLOP/s pairs separated by commas (bf16=989e12,fp32=67e12)"
    text = text.strip()
    if not text:
        return {}
    out: dict[str, float] = {}
    for item in text.split(","):
        key, sep, raw = item.partition("=")
        dtype = key.strip().lower() if sep else ""
        if sep and dtype not in DTYPES:
            raise ValueError(f"{what}; dtypes: {', '.join(DTYPES)}")
        try:
            value = float(raw if sep else key)
        except ValueError:
            raise ValueError(what) from None
        if not math.isfinite(value) or value <= 0:
            raise ValueError(what)
        if not sep:
            if len(text.split(",")) > 1:
                raise ValueError(what)
            return dict.fromkeys(DTYPES, value)
        out[dtype] = value
    return out


# --- the CPU's measured peak ----------------------------------------------------------------------------------------
CPU_MATMUL_N = 1024  # a product of 2 x 1024^3 FLOPs: long enough to time, short enough to take well under a second
# products timed; the best counts (the first warms the caches and the thread pool). Five read 97-168 GFLOP/s in
# three children on 2 shared cores, twenty-five 187-193: a neighbour's burst spans a few products, rarely 25
CPU_REPEATS = 25
CPU_TIMEOUT_S = 60.0
CACHE_NAME = "cpu_peak.json"


@dataclass(frozen=True)
class CpuPeak:
    flops: float  # FLOP/s of float32 matrix products, all of torch's default threads
    threads: int  # torch's default intra-op threads, which the figure used
    cost_s: float  # what measuring took, torch's import included


def measure_cpu(n: int = CPU_MATMUL_N, repeats: int = CPU_REPEATS) -> CpuPeak:  # pragma: no cover - in the child
    """The child's measurement (imports torch: never call it in the agent's process)."""
    started = time.perf_counter()
    import torch  # the child's own: the agent never imports it

    a, b = torch.randn(n, n), torch.randn(n, n)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return CpuPeak(2.0 * n**3 / best, torch.get_num_threads(), time.perf_counter() - started)


def measure_cpu_in_child(timeout_s: float = CPU_TIMEOUT_S, python: str = sys.executable) -> CpuPeak | None:
    """The CPU's peak measured in a child process of `python` (the workload's interpreter, with its torch); None
    where torch is not installed there, or the child fails or overruns timeout_s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}  # nothing to instrument
    agent = os.path.abspath(__file__)
    for _ in range((__package__ or "outrider").count(".") + 2):  # up from this file and its packages: outrider's parent
        agent = os.path.dirname(agent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (agent, os.environ.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run([python, "-m", "outrider.ground.peaks"], capture_output=True, text=True,
                              timeout=timeout_s, env=env, check=False, stdin=subprocess.DEVNULL)
        data = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout else None
        return CpuPeak(float(data["flops"]), int(data["threads"]), float(data["cost_s"])) if data else None
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError, IndexError):
        return None


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "outrider")


def torch_version() -> str:
    """The installed torch's version, from the name of its metadata folder on the import path (torch is not
    imported, nor importlib.metadata, which loads the email package: a megabyte of the agent's memory); "" where
    none is installed."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith("torch-") and name.endswith(".dist-info"):
                return name[len("torch-"):-len(".dist-info")]
    return ""


def machine_key(cpu_model: str) -> str:
    """What a measured CPU peak holds for: this CPU model (procfs.read_cpu_model) and the CPUs this process may use,
    this interpreter and its torch (a home directory shared across machines keeps one figure per kind of machine)."""
    return f"{cpu_model}|{len(os.sched_getaffinity(0))}|{sys.executable}|{torch_version()}"


def cached_cpu_peak(key: str, directory: str | None = None) -> CpuPeak | None:
    path = os.path.join(directory or cache_dir(), CACHE_NAME)
    try:
        with open(path, encoding="utf-8") as fh:
            entry = json.load(fh).get(key)
        return CpuPeak(float(entry["flops"]), int(entry["threads"]), float(entry["cost_s"])) if entry else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def cache_cpu_peak(key: str, peak: CpuPeak, directory: str | None = None) -> None:
    """Kept beside the others (one per machine key), written whole (a rename): never half a file."""
    directory = directory or cache_dir()
    path = os.path.join(directory, CACHE_NAME)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        try:
            with open(path, encoding="utf-8") as fh:
                entries = json.load(fh)
            entries = entries if isinstance(entries, dict) else {}
        except (OSError, ValueError):
            entries = {}
        entries[key] = {"flops": peak.flops, "threads": peak.threads, "cost_s": peak.cost_s}
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".cpu_peak.")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(entries, fh)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)


if __name__ == "__main__":  # pragma: no cover - the child of measure_cpu_in_child
    peak = measure_cpu()
    print(json.dumps({"flops": peak.flops, "threads": peak.threads, "cost_s": peak.cost_s}))
