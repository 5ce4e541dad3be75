#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU and driver: the gpu-marked tests (the NVML collector against the
# real driver, the hook's CUDA event timing and allocator sampling, the MFU of a known bf16 model against the peak
# table, printed), then one `outrider metrics --once` of the GPU collector. A few minutes; changes no GPU setting.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e '.[dev]' >/dev/null
nvidia-smi -L || true
python3 -m pytest -q -m gpu -s tests/gpu/test_real_gpu.py tests/gpu/test_real_mfu.py
python3 -m outrider metrics --once --no-collector.host --no-collector.process --no-collector.hook \
  --no-collector.self | grep -v '^#' | head -60
