"""`outrider run` stops what it started on every path out of run(), not only when CMD ends normally: the agent's
port, its threads, its hold on the spool, and CMD itself when the runner fails while CMD still runs.

Each case drives runner.run in a process of its own (run() makes its caller a child subreaper and reaps every
child, which a test process must not become), fails it the way the case says, and reports what is left once run()
has returned or raised.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import free_port

pytestmark = pytest.mark.integration

DRIVER = textwrap.dedent("""
    import json, os, socket, sys, threading, time
    from outrider.shared import spool
    from outrider.ground.config import Config
    from outrider.commands.runner import run

    case, tmp, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    spool_dir = os.path.join(tmp, "spool")
    config = Config(listen=f"127.0.0.1:{port}", interval_s=0.2, spool_dir=spool_dir, runs_dir=os.path.join(tmp, "runs"),
                    state_dir=os.path.join(tmp, "state"), kmsg_path="", shutdown_timeout_s=2.0)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    quick = [sys.executable, "-c", "pass"]
    on_exit = None
    if case == "not-found":
        cmd = [os.path.join(tmp, "no-such-program")]
    elif case == "not-a-directory":
        plain = os.path.join(tmp, "plain")
        open(plain, "w").close()
        cmd = [os.path.join(plain, "x")]  # a path through a regular file: ENOTDIR
    elif case == "stderr-broken":
        # the runner's first line on stderr meets a reader that went away while CMD runs
        r, w = os.pipe()
        os.close(r)
        sys.stderr = os.fdopen(w, "w", buffering=1)
        cmd = [sys.executable, "-c", "import time; time.sleep(1); raise SystemExit(3)"]
    elif case == "runner-fails":
        import outrider.commands.runner as runner

        def failing_wait(self):
            raise RuntimeError("injected")
        runner.Command.wait = failing_wait  # the runner fails while CMD runs
        cmd = sleeper
    elif case == "exits":
        cmd = quick
    elif case == "on-exit-raises":
        def on_exit(families):
            raise RuntimeError("injected")
        cmd = quick
    out = {"returned": None, "raised": None}
    try:
        out["returned"] = run(cmd, config, on_exit=on_exit, quiet=case not in ("stderr-broken", "runner-fails"))[0]
    except Exception as e:
        out["raised"] = type(e).__name__
    sys.stderr = sys.__stderr__

    def ours():
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("outrider-") and t.is_alive())

    deadline = time.monotonic() + 10  # a thread told to stop may take a moment to return
    while ours() and time.monotonic() < deadline:
        time.sleep(0.05)
    out["threads"] = ours()
    with socket.socket() as s:
        out["port_open"] = s.connect_ex(("127.0.0.1", port)) == 0
    fd = spool.try_lock(spool_dir) if os.path.isdir(spool_dir) else None
    out["spool_locked"] = os.path.isdir(spool_dir) and fd is None
    out["children"] = []  # this process's children, running or unreaped
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid():
            out["children"].append(int(pid))
            os.kill(int(pid), 9)
    print(json.dumps(out))
""")


def drive(tmp_path: Path, case: str) -> dict:  # type: ignore[type-arg]
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    r = subprocess.run([sys.executable, str(driver), case, str(tmp_path), str(free_port())], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def assert_nothing_left(out: dict) -> None:  # type: ignore[type-arg]
    assert out["threads"] == [], "the agent's threads outlive run()"
    assert not out["port_open"], "the agent still serves /metrics after run()"
    assert not out["spool_locked"], "the agent still holds the spool's lock after run()"
    assert out["children"] == [], "a child of run() was left running (or unreaped)"


@pytest.mark.parametrize(("case", "code"), [("not-found", 127), ("not-a-directory", 126)])
def test_a_command_that_cannot_start_leaves_nothing_running(tmp_path: Path, case: str, code: int) -> None:
    out = drive(tmp_path, case)
    assert (out["raised"], out["returned"]) == (None, code), "a shell's exit code, not a traceback"
    assert_nothing_left(out)


def test_a_runner_that_fails_while_the_command_runs_ends_the_command_and_the_agent(tmp_path: Path) -> None:
    out = drive(tmp_path, "runner-fails")
    assert out["raised"] == "RuntimeError"
    assert out["children"] == [], "CMD was left running (or unreaped) when the runner failed"
    assert_nothing_left(out)


def test_a_stderr_that_went_away_costs_the_lines_not_the_run(tmp_path: Path) -> None:
    """The job never pays for its monitor: a closed terminal or a pipe whose reader left loses outrider's lines,
    while CMD runs to its end and its exit code is the run's."""
    out = drive(tmp_path, "stderr-broken")
    assert (out["raised"], out["returned"]) == (None, 3), "CMD ran to its end: its own exit code"
    assert_nothing_left(out)


def test_a_command_that_exits_leaves_nothing_running(tmp_path: Path) -> None:
    """The agent's last sweep (its rules' and exporters' final values) comes before its collectors close: the hook
    collector, swept after closing, would take the spool's lock again and keep it."""
    out = drive(tmp_path, "exits")
    assert (out["raised"], out["returned"]) == (None, 0)
    assert_nothing_left(out)


def test_an_exception_after_the_command_ended_still_stops_the_agent(tmp_path: Path) -> None:
    out = drive(tmp_path, "on-exit-raises")
    assert out["raised"] == "RuntimeError"
    assert_nothing_left(out)
