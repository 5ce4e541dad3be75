"""The public hook API is typed for the workload's type checker: `outrider.counter()`, `gauge()`, `histogram()` and
`in_flight()` return series with their methods' signatures (outrider.CounterSeries, GaugeSeries, HistogramSeries),
not Any, so mypy in strict mode, reading the package as a user's install does (its py.typed), passes their right
uses and flags each wrong one on its line. So are the hook's own handles, whose wrong use inside the package would
otherwise pass its type check unseen: `Hook.series(kind, ...)` gives the kind asked for (`Counter | NoopSeries` for
"counter", ...) and the built-in series (`S.series`, hook/state.BuiltinSeries) are each of their kind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

RIGHT = """\
import outrider
from outrider.hook.runtime import Hook
from outrider.hook.state import BuiltinSeries

requests = outrider.counter("requests", {"route": "/generate"})
requests.inc()
requests.inc(2)
queue = outrider.gauge("queue_depth")
queue.set(3.5)
queue.add(-1)
outrider.histogram("batch_seconds", bounds=(0.1, 1.0)).observe(0.25)
active = outrider.in_flight("/generate", "POST", "https")
active.add(1)
seen: outrider.CounterSeries = outrider.counter("seen")
hook = Hook()
hook.series("counter", "outrider_steps_total", builtin=True).set_total(3)
hook.series("gauge", "g").add(1)
hook.series("histogram", "h").observe(0.5)
builtin = BuiltinSeries()
builtin.step.observe(0.1)
builtin.samples.inc(8)
builtin.first_step_at.set(1.0)
"""

# each wrong use and what mypy says of it (the line it is on comes from its place in the script)
WRONG = {
    'outrider.counter("x").inc("a")': r'Argument 1 to "inc" of "CounterSeries" has incompatible type "str"',
    'outrider.counter("x").observe(1.0)': r'"CounterSeries" has no attribute "observe"',
    'outrider.gauge("x").inc()': r'"GaugeSeries" has no attribute "inc"',
    'outrider.histogram("x").set(1.0)': r'"HistogramSeries" has no attribute "set"',
    'outrider.in_flight("/").observe(1.0)': r'"GaugeSeries" has no attribute "observe"',
    'total: int = outrider.counter("x")': r'Incompatible types in assignment',
    'hook.series("counter", "c").observe(1.0)': r'"Counter" of "Counter \| NoopSeries" has no attribute "observe"',
    'hook.series("histogram", "h").set(1.0)': r'"Histogram" of "Histogram \| NoopSeries" has no attribute "set"',
    'hook.series("gauge", "g").set("a")': r'Argument 1 to "set" of "Gauge" has incompatible type "str"',
    'builtin.step.inc()': r'"Histogram" of "Histogram \| NoopSeries" has no attribute "inc"',
    'builtin.tokens.set_total("a")': r'Argument 1 to "set_total" of "Counter" has incompatible type "str"',
    'builtin.first_step.observe(1.0)': r'"Gauge" of "Gauge \| NoopSeries" has no attribute "observe"',
}


def mypy(script: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    # The worktree's package through MYPYPATH (never an installed copy: no site-packages), its own errors silent as
    # an installed package's are; the script checked as a user's code under --strict, with no configuration of the
    # project's or the machine's (a config file of its own, empty).
    config = script.parent / "mypy.ini"
    config.write_text("[mypy]\n")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-site-packages", "--follow-imports=silent",
         "--ignore-missing-imports", "--no-error-summary", "--show-error-codes", "--cache-dir", str(cache),
         "--config-file", str(config), str(script)],
        capture_output=True, text=True, timeout=120, cwd=script.parent,
        env={"MYPYPATH": str(REPO / "agent"), "PATH": "/usr/bin:/bin"})


def test_strict_mypy_passes_the_right_uses_and_flags_each_wrong_one_on_its_line(tmp_path: Path) -> None:
    script = tmp_path / "user_script.py"
    lines = RIGHT.splitlines()
    script.write_text("\n".join([*lines, *WRONG]) + "\n")
    r = mypy(script, tmp_path / "mypy_cache")
    reported: dict[int, str] = {}
    for line in r.stdout.splitlines():
        m = re.match(r"user_script\.py:(\d+): error: (.*)", line)
        if m:
            reported[int(m.group(1))] = reported.get(int(m.group(1)), "") + m.group(2)
    assert r.returncode == 1, r.stdout + r.stderr
    wanted = {len(lines) + i + 1: said for i, said in enumerate(WRONG.values())}
    assert set(reported) == set(wanted), r.stdout  # none on the right uses, one on each wrong one
    for number, said in wanted.items():
        assert re.search(said, reported[number]), (number, reported[number])
