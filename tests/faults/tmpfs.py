"""A small tmpfs for the full-disk fault tests: mounted by the test, unmounted by it, skipped with the reason where
this machine cannot mount one."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str, instead: str) -> Iterator[Path]:
    """A tmpfs of `size` at `path` (created), unmounted on exit; `instead` says what covers the case if the test
    must skip."""
    path.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                           capture_output=True, text=True)
    except FileNotFoundError:
        r = subprocess.CompletedProcess([], 1, "", "no mount command")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip()}); {instead}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


def fill(volume: Path) -> Path:
    """Fill the volume up with one file; returns it (delete it and the space returns)."""
    filler = volume / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k"], capture_output=True)
    return filler
