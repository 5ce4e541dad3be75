"""scripts/mutation.py as CI runs it (`--changed --budget 300`), in a repository of its own laid out like this one:
which modules a change selects (on a branch, on main after a merge, in a shallow clone that cannot tell), and that
a module that completes below its floor fails the run while one the budget cuts short does not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

CONFIG = """
[modules."calc"]
tests = ["tests/test_calc.py"]
floor = {floor}

[modules."slow"]
tests = ["tests/test_slow.py"]

[modules."bounds"]
tests = ["tests/test_bounds.py"]
floor = 0.5
"""

CALC = '''
def add(a, b):
    return a + b


def clamp(x, low, high):
    return max(low, min(x, high))
'''

CALC_TEST = '''
from outrider.calc import add


def test_add():
    assert add(2, 3) == 5
'''

CLAMP_TEST = '''
from outrider.calc import clamp


def test_clamp():
    assert [clamp(x, 1, 3) for x in (0, 1, 2, 3, 4)] == [1, 1, 2, 3, 3]
'''

BOUNDS_TEST = '''
import os
import subprocess
import sys


def test_clamp_in_a_workload():
    code = "from outrider.bounds import clamp; print([clamp(x, 1, 3) for x in (0, 1, 2, 3, 4)])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert out.stdout.strip() == "[1, 1, 2, 3, 3]"


def test_halve_in_a_fork():
    from outrider.bounds import halve

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, str(halve(8)).encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 100)
    os.waitpid(pid, 0)
    assert out == b"4"
'''

SLOW_TEST = '''
import time

from outrider.slow import twice


def test_twice():
    time.sleep(600)  # longer than any budget here: the run is always cut short
    assert twice(2) == 4
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout


def make_repo(root: Path, floor: float = 1.0) -> Path:
    repo = root / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "mutation.py", repo / "scripts" / "mutation.py")
    shutil.copytree(REPO / "scripts" / "mutation_hits", repo / "scripts" / "mutation_hits",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "scripts" / "mutation.toml").write_text(CONFIG.format(floor=floor))
    (repo / "agent" / "outrider").mkdir(parents=True)
    (repo / "agent" / "outrider" / "__init__.py").write_text("")
    (repo / "agent" / "outrider" / "calc.py").write_text(CALC)
    (repo / "agent" / "outrider" / "slow.py").write_text("def twice(x):\n    return 2 * x\n")
    (repo / "agent" / "outrider" / "bounds.py").write_text(CALC + "\n\ndef halve(x):\n    return x // 2\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_calc.py").write_text(CALC_TEST)
    (repo / "tests" / "test_slow.py").write_text(SLOW_TEST)
    (repo / "tests" / "test_bounds.py").write_text(BOUNDS_TEST)
    (repo / "alerts").mkdir()
    (repo / "alerts" / "README").write_text("rules\n")
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\nmarkers = []\n')
    (repo / ".gitignore").write_text("/.mutation/\n__pycache__/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    return repo


def mutation(repo: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    return subprocess.run([sys.executable, "scripts/mutation.py", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=timeout_s)


def test_changed_selects_what_the_branch_or_the_last_merge_touched_and_says_when_it_cannot_tell(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    git(repo, "checkout", "-q", "-b", "feature")
    with open(repo / "agent" / "outrider" / "calc.py", "a") as fh:
        fh.write("\n\ndef sub(a, b):\n    return a - b\n")
    git(repo, "commit", "-q", "-am", "sub")
    (repo / "tests" / "test_calc.py").write_text(CALC_TEST + "\n# a test changed: no module source\n")
    git(repo, "commit", "-q", "-am", "tests only")
    out = mutation(repo, "--changed", "--budget", "300", "--list")
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "calc", out.stdout + out.stderr
    (repo / "agent" / "outrider" / "slow.py").write_text("def twice(x):\n    return x + x\n")  # not committed yet
    assert mutation(repo, "--changed", "--list").stdout.splitlines()[-2:] == ["calc", "slow"]
    git(repo, "checkout", "-q", "agent/outrider/slow.py")

    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge branch 'feature'", "feature")
    out = mutation(repo, "--changed", "--budget", "300", "--list")
    assert out.stdout.splitlines()[-1] == "calc", "on main after the merge: what the merge brought in"
    (repo / "agent" / "outrider" / "slow.py").write_text("def twice(x):\n    return x * 2\n")
    git(repo, "commit", "-q", "-am", "slow, straight on main")
    assert mutation(repo, "--changed", "--list").stdout.splitlines()[-1] == "slow", "then the last commit's"

    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True)
    out = mutation(shallow, "--changed", "--budget", "300", "--list")
    assert out.returncode == 0
    assert out.stdout.startswith("cannot tell which module sources changed") and out.stdout.endswith("none run\n\n")


def test_a_module_completed_below_its_floor_fails_the_run(tmp_path: Path) -> None:
    pytest.importorskip("mutmut")
    repo = make_repo(tmp_path, floor=1.0)  # clamp has no test: its mutants survive
    out = mutation(repo, "calc", "--budget", "300", "--jobs", "1")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "(INCOMPLETE" not in out.stdout and "survived x_clamp__mutmut_" in out.stdout
    assert out.stdout.splitlines()[-1] == "below the floor: calc"
    # a test file written for the survivors and added to the module's list: a rerun takes it and kills them
    (repo / "tests" / "test_clamp.py").write_text(CLAMP_TEST)
    config = repo / "scripts" / "mutation.toml"
    config.write_text(config.read_text().replace('tests = ["tests/test_calc.py"]',
                                                 'tests = ["tests/test_calc.py", "tests/test_clamp.py"]'))
    rerun = mutation(repo, "--rerun", "calc", "--budget", "300", "--jobs", "1")
    assert rerun.returncode == 0 and "survived" not in rerun.stdout, rerun.stdout + rerun.stderr
    repo_ok = make_repo(tmp_path / "ok", floor=0.1)
    assert mutation(repo_ok, "calc", "--budget", "300", "--jobs", "1").returncode == 0, "at or above it: passes"


def test_a_function_a_test_reaches_only_in_a_subprocess_has_its_mutants_run(tmp_path: Path) -> None:
    """mutmut sees the functions a test calls in its own process only; the module's mutants are live in the
    processes the test starts and the forks it makes too, and their hits there count (scripts/mutation_hits)."""
    pytest.importorskip("mutmut")
    repo = make_repo(tmp_path)
    out = mutation(repo, "bounds", "--budget", "300", "--jobs", "1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("bounds: 10 killed + 0 timed out of 11"), \
        "clamp's 8 in a subprocess, halve's 2 in a fork"
    assert "survived x_add" in out.stdout, "add is called by no test, in process or not"


def test_a_module_the_budget_cuts_short_is_reported_incomplete_and_does_not_fail_the_run(tmp_path: Path) -> None:
    pytest.importorskip("mutmut")
    repo = make_repo(tmp_path)
    out = mutation(repo, "slow", "calc", "--budget", "10", "--jobs", "1")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("slow: ") and "(INCOMPLETE" in line for line in lines), out.stdout
    assert lines[-1] == "calc: not run (budget of 10 s spent)", "and what it left out is said"
    assert working_in(repo) == [], "mutmut's fork server and workers were stopped with it"


def working_in(directory: Path) -> list[int]:
    """Processes whose working directory is in `directory`."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd == str(directory) or cwd.startswith(f"{directory}/"):
                pids.append(int(entry))
    return pids
