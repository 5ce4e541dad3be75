"""NVML calls and CPU time per GPU collector sweep, against the fake libnvidia-ml with 8 H100-like GPUs.

Not a test: it prints figures. The fake answers at once, so this measures Outrider's own cost per sweep (the
bindings, the collector, the families); a real driver adds its own time per call, which `scripts/gpu-check.sh`
reports on a GPU machine.

    python benchmarks/gpu_sweep.py [--gpus 8] [--sweeps 200]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fakes.build import build

GPU = """gpu {i} name NVIDIA H100 80GB HBM3
gpu {i} uuid GPU-{i:08d}
gpu {i} memory_total 85899345920
gpu {i} memory_used 42949672960
gpu {i} memory_free 42413129728
gpu {i} memory_reserved 536543232
gpu {i} util_gpu 87
gpu {i} util_mem 41
gpu {i} enc_util 0
gpu {i} dec_util 0
gpu {i} temp 71
gpu {i} field 82 78
gpu {i} field 138 1000
gpu {i} field 139 2000
gpu {i} power_mw 612345
gpu {i} power_limit_mw 700000
gpu {i} energy_mj 987654321
gpu {i} clock_sm 1755
gpu {i} clock_mem 2619
gpu {i} max_clock_sm 1980
gpu {i} max_clock_mem 2619
gpu {i} pstate 0
gpu {i} clock_reasons 0
gpu {i} violation_power_ns 0
gpu {i} violation_thermal_ns 0
gpu {i} violation_sync_boost_ns 0
gpu {i} violation_board_limit_ns 0
gpu {i} violation_low_util_ns 0
gpu {i} violation_reliability_ns 0
gpu {i} pcie_tx_kbps 1000
gpu {i} pcie_rx_kbps 2000
gpu {i} pcie_replay 0
gpu {i} ecc_corr_volatile 0
gpu {i} ecc_unc_volatile 0
gpu {i} ecc_corr_aggregate 0
gpu {i} ecc_unc_aggregate 0
gpu {i} remap_corr 0
gpu {i} remap_unc 0
gpu {i} remap_pending 0
gpu {i} remap_failure 0
gpu {i} mig_mode 0
gpu {i} gpm_supported 1
gpu {i} gpm 2 62.5
gpu {i} gpm 3 31.0
gpu {i} gpm 5 44.0
gpu {i} gpm 10 20.0
gpu {i} proc {pid} 2147483648 60
"""


def fake_nvml(gpus: int) -> str:
    """Build the fake libnvidia-ml with `gpus` H100-like GPUs, point it at its scenario, return its path."""
    work = Path(tempfile.mkdtemp(prefix="outrider-gpu-bench-"))
    lib = build(work)["full"]
    scenario = work / "scenario.txt"
    scenario.write_text(f"device_count {gpus}\n" + "".join(GPU.format(i=i, pid=1000 + i) for i in range(gpus)))
    os.environ["FAKE_NVML_SCENARIO"] = str(scenario)
    return lib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--sweeps", type=int, default=200)
    args = ap.parse_args()
    lib = fake_nvml(args.gpus)

    from outrider.collectors.base import CollectorContext
    from outrider.collectors.gpu import GpuCollector
    from outrider.config import Config
    from outrider.metrics.exposition import render
    from outrider.sampler import SweepStats

    c = GpuCollector(CollectorContext(Config(nvml_library=lib), SweepStats()))
    count_calls = ctypes.CDLL(lib).fake_nvml_call_count
    count_calls.restype = ctypes.c_ulonglong
    for _ in range(3):
        c.collect()  # static facts cached, GPM primed, unsupported readings learnt
    calls0, cpu0 = count_calls(), time.process_time()
    for _ in range(args.sweeps):
        fams = c.collect()
    cpu = (time.process_time() - cpu0) / args.sweeps
    calls = (count_calls() - calls0) / args.sweeps
    samples = sum(len(f.samples) for f in fams)
    render_t0 = time.process_time()
    for _ in range(args.sweeps):
        render(fams)
    render_cpu = (time.process_time() - render_t0) / args.sweeps
    c.close()
    print(f"{args.gpus} GPUs: {cpu * 1000:.2f} ms CPU per sweep ({cpu * 1000 / args.gpus:.3f} ms per GPU), "
          f"{calls:.0f} NVML calls per sweep ({calls / args.gpus:.1f} per GPU), {samples} samples "
          f"(+{render_cpu * 1000:.2f} ms to render them); target: <= 2 ms per sweep of 8 GPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
