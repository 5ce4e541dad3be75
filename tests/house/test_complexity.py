"""The modules whose long, branching functions were broken up (issue #40: HookCollector.collect,
ProcessCollector.collect, ThreadCpuAccounting._own, RunRecorder._sweep, bottleneck._classify, whose verdict rules
are now the table RULES) keep every function's McCabe complexity under a bound, so none grows back unnoticed.
Measured by ruff's C901, the linter CI runs, on the files as they are."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

MODULES = ("agent/outrider/collectors/hook.py", "agent/outrider/collectors/process.py",
           "agent/outrider/hook/threads.py", "agent/outrider/runs/recorder.py",
           "agent/outrider/diagnosis/bottleneck.py")
# The largest after the split: ThreadCpuAccounting._own (12), whose per-thread loop stays in one function because
# it runs in the user's process for every thread at every flush, where a call per thread costs.
BOUND = 12


def complexities(*paths: Path) -> dict[str, int]:
    """`file:function` -> McCabe complexity of every function in `paths` (ruff reports those above the maximum
    it is given: 0 reports them all)."""
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "C901", "--config",
                          "lint.mccabe.max-complexity=0", "--output-format", "json", "--exit-zero",
                          *map(str, paths)], cwd=REPO, capture_output=True, text=True, check=True)
    out = {}
    for finding in json.loads(run.stdout):
        said = re.fullmatch(r"`(.+)` is too complex \((\d+) > 0\)", finding["message"])
        assert said, finding["message"]
        out[f"{Path(finding['filename']).name}:{said[1]}"] = int(said[2])
    return out


def test_the_broken_up_modules_keep_every_function_under_the_bound() -> None:
    measured = complexities(*(REPO / m for m in MODULES))
    assert any(name.endswith(":_own") for name in measured)  # measured at all: the functions are there
    over = {name: c for name, c in measured.items() if c > BOUND}
    assert not over, f"complexity over {BOUND}: {over}; break the function up by what its pieces do"


def test_a_function_grown_past_the_bound_is_over_it(tmp_path: Path) -> None:
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(BOUND))
    grown = tmp_path / "grown.py"
    grown.write_text(f"def grown(x: int) -> int:\n{branches}    return -1\n", encoding="utf-8")
    assert complexities(grown) == {"grown.py:grown": BOUND + 1}
