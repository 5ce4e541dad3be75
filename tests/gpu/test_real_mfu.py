"""MFU of a known model on a real NVIDIA GPU, against the peak table (outrider/ground/peaks.py). Marked `gpu`: skipped
where no GPU is present; `bash scripts/gpu-check.sh` runs it and prints the MFU.

A bf16 stack of large Linear layers on one GPU under `outrider run`: its FLOPs per step are known analytically
(2BD^2 per layer forward, as much again for the weights' and for the inputs' gradients but the first's), and it
times its own steps with the device synchronised at each end. The run's MFU must agree with its own (analytic
FLOPs over its own step time, against the peak the run judged it by) within 10%: the device finishes its queued
work at its own pace, so the hook's step ends (host time) and the workload's (synchronised) differ a little."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from outrider.ground import peaks
from tests.helpers import outrider_cmd

pytestmark = pytest.mark.gpu

WORKLOAD = r"""
import json, sys, time
import torch
import outrider

out, steps, b, d, layers = sys.argv[1], 120, 8192, 8192, 4
outrider.instrument()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(layers)]).cuda().to(torch.bfloat16)
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
x = torch.randn(b, d, device="cuda", dtype=torch.bfloat16)
ends = []
for i in range(steps):
    opt.zero_grad(set_to_none=True)
    model(x).float().sum().backward()
    opt.step()
    torch.cuda.synchronize()
    ends.append(time.perf_counter())
name = torch.cuda.get_device_name(0)
json.dump({"ends": ends, "flops": 2 * b * d * d * (3 * layers - 1), "device": name}, open(out, "w"))
"""


def test_mfu_of_a_known_model_against_the_tables_peak(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    name = torch.cuda.get_device_name(0)
    if peaks.gpu_row(name) is None:
        pytest.skip(f"{name} is not in the peak table")
    script, own, summary = tmp_path / "w.py", tmp_path / "own.json", tmp_path / "summary.json"
    script.write_text(textwrap.dedent(WORKLOAD))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0"))
    r = subprocess.run(outrider_cmd("run", "--listen", "127.0.0.1:0", "--interval", "1", "--quiet",
                                    "--summary-json", str(summary), "--", sys.executable, str(script), str(own)),
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    measured = json.loads(summary.read_text())["measured"]["training"]
    mine = json.loads(own.read_text())
    ends = mine["ends"]
    own_flops_s = mine["flops"] * (len(ends) - 1) / (ends[-1] - ends[0])
    peak = measured["peak_flops"]
    print(f"\n{mine['device']}: MFU {measured['mfu']:.1%} against {peak / 1e12:.1f} TFLOP/s "
          f"{measured['peak_dtype']} (the table's); the workload's own {own_flops_s / peak:.1%} "
          f"({own_flops_s / 1e12:.1f} TFLOP/s)")
    assert measured["peak_dtype"] == "bf16"
    assert peak == pytest.approx(peaks.gpu_peaks(name)["bf16"], rel=0.25)  # type: ignore[index]
    assert measured["mfu"] == pytest.approx(own_flops_s / peak, rel=0.10)
