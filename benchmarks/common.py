"""What several benchmarks share: a CPU hog beside the run, and the figures written as JSON."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any


def with_hog_and_json(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options --hog (beside_hog) and --json (save_json)."""
    ap.add_argument("--hog", action="store_true", help="run with another process keeping a core busy")
    ap.add_argument("--json", help="write the figures here too")
    return ap


def beside_hog(hog: bool, run: Callable[[], int]) -> int:
    """run(), with another process keeping a core busy for all of it when hog (a neighbour sharing the machine,
    as on a node where the data loader's workers or another job run beside the trainer)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if hog else None
    try:
        return run()
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def save_json(path: str | None, figures: Any) -> None:
    """The figures to `path` (--json), when one is given."""
    if path:
        with open(path, "w") as fh:
            json.dump(figures, fh, indent=2)
