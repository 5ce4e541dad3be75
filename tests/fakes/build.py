"""Builds the fake libnvidia-ml.so.1 (fake_nvml.c) with gcc against the real nvml.h from nvidia-nvml-dev."""

from __future__ import annotations

import glob
import os
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")


def nvml_include_dir() -> str:
    import nvidia  # the namespace package nvidia-nvml-dev installs into

    for base in nvidia.__path__:
        for header in glob.glob(os.path.join(base, "*", "include", "nvml.h")):
            return os.path.dirname(header)
    raise FileNotFoundError("nvml.h not found: pip install nvidia-nvml-dev (a dev dependency; .ci/run installs it)")


def build(out_dir: Path) -> dict[str, str]:
    """{"full": path, "old": path}: a current driver, and one without the newer symbols (-DOLD_DRIVER)."""
    libs = {}
    for variant, flags in (("full", []), ("old", ["-DOLD_DRIVER"])):
        (out_dir / variant).mkdir(parents=True, exist_ok=True)
        lib = out_dir / variant / "libnvidia-ml.so.1"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Wno-deprecated-declarations",
                        "-Wno-format-truncation", "-fvisibility=hidden", *flags, "-I", nvml_include_dir(),
                        "-o", str(lib), str(SOURCE), "-lpthread"], check=True, capture_output=True, text=True)
        libs[variant] = str(lib)
    return libs
