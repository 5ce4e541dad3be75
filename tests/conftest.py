from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def proc_fixture(tmp_path: Path) -> Path:
    """A writable copy of the fixture procfs tree (tests change files in it between sweeps)."""
    root = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", root)
    return root


def need_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: .ci/run installs it (Debian package); install it to run this test")
    return path
