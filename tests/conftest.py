"""Shared fixtures, and the rule that tests own their world.

- Their own directories: for the whole session HOME, the XDG directories and the runtime directory point into one
  temporary directory (and `outrider run` measures no CPU peak into its new cache, unless a test asks). Every process
  a test starts inherits them, and one started with an environment of its own that leaves one out gets the session's
  (`_Popen` below): no test process can fall back to the real home's Outrider directories or to the machine-wide spool
  (/tmp/outrider-spool-UID, used when there is no runtime directory) unless its test names that place on purpose. That
  is checked where it is caused, when a process starts, not by comparing those shared places before and after: other
  processes on the machine (other sessions, a person's own `outrider run`) write there too, and a diff cannot tell
  whose write it was.
- Every process a test starts is stopped by its pid whatever fails: each carries the session's mark and the test's
  (environment variables PYTEST_OUTRIDER_SESSION and PYTEST_OUTRIDER_TEST, which Outrider never reads); when a test
  ends, any process still running with its mark (a forked child of a killed workload, an agent a workload started)
  is killed, and a warning names the test; when the session ends, any process with the session's mark is.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SESSION_VAR, TEST_VAR = "PYTEST_OUTRIDER_SESSION", "PYTEST_OUTRIDER_TEST"
# what a child keeps of the session's world when its test hands it an environment of its own
WORLD_VARS = ("HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR",
              SESSION_VAR, TEST_VAR, "OUTRIDER_CPU_PEAK_MEASURE")
_session_dir: tempfile.TemporaryDirectory[str] | None = None
_SESSION = ""  # made in pytest_configure: a process that forks pytest sessions (mutmut) gives each its own
_OriginalPopen = subprocess.Popen


class _Popen(_OriginalPopen):  # type: ignore[type-arg,misc]
    """subprocess.Popen whose explicit `env` keeps the session's world variables that it leaves out."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        env = kwargs.get("env")
        if env is not None:
            kwargs["env"] = {**{k: os.environ[k] for k in WORLD_VARS if k in os.environ}, **env}
        super().__init__(*args, **kwargs)


def pytest_configure(config: pytest.Config) -> None:
    global _session_dir, _SESSION
    _SESSION = uuid.uuid4().hex
    _session_dir = tempfile.TemporaryDirectory(prefix="outrider-tests-")
    root = Path(_session_dir.name)
    for var, sub in (("HOME", "home"), ("XDG_DATA_HOME", "data"), ("XDG_STATE_HOME", "state"),
                     ("XDG_CONFIG_HOME", "config"), ("XDG_CACHE_HOME", "cache"), ("XDG_RUNTIME_DIR", "run")):
        (root / sub).mkdir(mode=0o700)
        os.environ[var] = str(root / sub)
    os.environ[SESSION_VAR] = _SESSION
    # The session's cache is new: the first `outrider run` of every session would measure the CPU's peak (seconds of
    # torch in a child, before its command starts). Only the tests of that measurement ask for it.
    os.environ["OUTRIDER_CPU_PEAK_MEASURE"] = "false"
    subprocess.Popen = _Popen  # type: ignore[misc]


def marked(var: str, mark: str) -> list[int]:
    """Processes (other than this one) whose environment carries var=mark."""
    needle = f"{var}={mark}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue  # gone, or not ours to read
        if needle in env.split(b"\0") and stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


def kill_marked(var: str, mark: str) -> list[str]:
    """SIGKILL, by pid, every live process carrying the mark; their command lines."""
    killed = []
    for pid in marked(var, mark):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        killed.append(f"{pid} ({cmd[:120]})")
    return killed


@pytest.fixture(autouse=True)
def _reap_what_the_test_started(request: pytest.FixtureRequest) -> Iterator[None]:
    """Processes started by the test (and by its function-scoped fixtures, set up after this one) carry its mark;
    any still running when it ends is killed. (Module- and session-scoped fixtures are set up before this and
    keep their servers running between tests.)"""
    mark = uuid.uuid4().hex
    os.environ[TEST_VAR] = mark
    try:
        yield
    finally:
        del os.environ[TEST_VAR]
        leaked = kill_marked(TEST_VAR, mark)
        if leaked:
            warnings.warn(f"{request.node.nodeid} left processes running; killed: {'; '.join(leaked)}",
                          stacklevel=1)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leaked = kill_marked(SESSION_VAR, _SESSION) if _SESSION else []
    if leaked:
        print(f"\nprocesses of this session still running at its end, killed: {'; '.join(leaked)}")
    subprocess.Popen = _OriginalPopen  # type: ignore[misc]
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
