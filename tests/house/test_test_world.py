"""The suite's own rules (tests/conftest.py): its processes live in the session's directories, whatever
environment a test hands them, and none outlives its test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import SESSION_VAR, TEST_VAR, kill_marked, marked
from tests.helpers import REPO, process_gone, wait_until


def test_a_process_started_with_an_environment_of_its_own_still_lives_in_the_sessions_directories() -> None:
    code = ("import json, os\nfrom outrider.shared import spool\n"
            "print(json.dumps({'home': os.path.expanduser('~'), 'spool': spool.default_dir(),"
            " 'state': os.environ.get('XDG_STATE_HOME')}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "agent")})
    assert r.returncode == 0, r.stderr
    import json

    seen = json.loads(r.stdout)
    session = Path(os.environ["HOME"]).parent
    assert Path(seen["home"]).parent == session, "not the real home"
    assert Path(seen["spool"]).parent == Path(os.environ["XDG_RUNTIME_DIR"]), "not /tmp/outrider-spool-UID"
    assert not seen["spool"].startswith("/tmp/outrider-spool-")
    assert Path(seen["state"]).parent == session


def test_a_test_can_still_point_a_process_elsewhere_on_purpose(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", "import os; print(os.environ['HOME'])"], capture_output=True,
                       text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.stdout.strip() == str(tmp_path)


def test_an_orphaned_grandchild_carries_the_tests_mark_and_is_killed_by_it() -> None:
    # The leak the marks exist for: a workload's forked child outliving the workload, reparented away from the
    # test, polling for ever. The shell starts a sleeper in the background and exits at once.
    r = subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                       timeout=30)
    orphan = int(r.stdout)
    try:
        assert not process_gone(orphan)
        assert orphan in marked(TEST_VAR, os.environ[TEST_VAR])
        assert orphan in marked(SESSION_VAR, os.environ[SESSION_VAR])
        killed = kill_marked(TEST_VAR, os.environ[TEST_VAR])
        assert any(k.startswith(f"{orphan} (sleep 300") for k in killed), killed
        wait_until(lambda: process_gone(orphan), timeout_s=10, what="the orphan gone")
    finally:
        if not process_gone(orphan):
            os.kill(orphan, 9)


def test_a_process_of_another_test_or_session_is_not_ours_to_kill() -> None:
    env = {**os.environ, TEST_VAR: "another-test", SESSION_VAR: "another-session"}
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)
    try:
        deadline = time.monotonic() + 10
        while p.pid not in marked(TEST_VAR, "another-test") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.pid in marked(TEST_VAR, "another-test")
        assert p.pid not in marked(TEST_VAR, os.environ[TEST_VAR])
        assert f"{p.pid} " not in " ".join(kill_marked(TEST_VAR, os.environ[TEST_VAR]))
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_no_test_patches_the_clock_into_the_time_module() -> None:
    """A clock is passed in (outrider/ground/clock.py): patching time.monotonic or time.time moves it for every module
    and thread of the test process, the agent's own included."""
    import re

    patched = re.compile(r"setattr\([^\n]*\btime\b[\"']?\s*,\s*[\"'](monotonic|time|time_ns|perf_counter|strftime)"
                         r"[\"']|setattr\([\"'][\w.]*\.time\.(monotonic|time|time_ns|perf_counter|strftime)[\"']")
    offenders = [f"{path.relative_to(REPO)}:{n}" for path in sorted((REPO / "tests").rglob("test_*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1) if patched.search(line)]
    assert not offenders, offenders
