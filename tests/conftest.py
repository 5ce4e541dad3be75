"""Shared fixtures, and the rule that tests own their world: for the whole session HOME, the XDG directories and
the runtime directory point into one temporary directory (every agent, `outrider run` and hooked process a test
starts inherits them), and the session fails if it wrote into the real home's Outrider directories or the
machine-wide default spool anyway."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
_REAL_HOME = Path.home()
GUARDED = (_REAL_HOME / ".local" / "share" / "outrider", _REAL_HOME / ".local" / "state" / "outrider",
           Path(f"/tmp/outrider-spool-{os.geteuid()}"))
_session_dir: tempfile.TemporaryDirectory[str] | None = None
_before: dict[Path, float | None] = {}


def _stamp(path: Path) -> float | None:
    try:
        return max([path.stat().st_mtime] + [p.stat().st_mtime for p in path.rglob("*")])
    except OSError:
        return None


def pytest_configure(config: pytest.Config) -> None:
    global _session_dir
    _before.update({p: _stamp(p) for p in GUARDED})
    _session_dir = tempfile.TemporaryDirectory(prefix="outrider-tests-")
    root = Path(_session_dir.name)
    for var, sub in (("HOME", "home"), ("XDG_DATA_HOME", "data"), ("XDG_STATE_HOME", "state"),
                     ("XDG_CONFIG_HOME", "config"), ("XDG_CACHE_HOME", "cache"), ("XDG_RUNTIME_DIR", "run")):
        (root / sub).mkdir(mode=0o700)
        os.environ[var] = str(root / sub)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    touched = [str(p) for p in GUARDED if _stamp(p) != _before.get(p)]
    if touched:
        print(f"\ntests wrote outside their own directories: {', '.join(touched)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if _session_dir is not None:
        _session_dir.cleanup()


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
