from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
XDG_DIRS = ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")


@pytest.fixture(scope="session", autouse=True)
def _xdg_dirs_of_the_test_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Whatever a test or a process it starts keeps under the XDG base directories (`outrider run`'s runs.db, the
    agent's alert state and outbox, a browser's profile) goes to this test run's temporary directory, never ~.
    Session-wide, so module-scoped fixtures get it too; tests that look at those files set their own."""
    base = tmp_path_factory.mktemp("xdg")
    with pytest.MonkeyPatch.context() as mp:
        for name in XDG_DIRS:
            mp.setenv(name, str(base / name.lower()))
        yield base


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
