"""`outrider run` says when the command was OOM-killed: SIGKILL (exit 137) while the kernel's OOM-kill counter
went up, the memory cgroup's (memory.events oom_kill) before the host's (/proc/vmstat oom_kill); a worker killed
while the command lived on is said too. The counters are read from the kernel's files (fixture trees here, laid out
as the kernel writes them), before the command starts and after it ends."""

from __future__ import annotations

import shutil
from pathlib import Path

from outrider.config import Config
from outrider.runner import RunSummary, _oom_kill_counts, _oom_kills_during
from tests.helpers import REPO

FIXTURES = REPO / "tests" / "fixtures"


def roots(tmp_path: Path, cgroup_kills: int, host_kills: int) -> Config:
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    if not proc.exists():
        shutil.copytree(FIXTURES / "proc", proc)
        shutil.copytree(FIXTURES / "sys", sys)
    for path, value in ((sys / "fs" / "cgroup" / "memory.events", cgroup_kills), (proc / "vmstat", host_kills)):
        lines = [f"oom_kill {value}" if ln.startswith("oom_kill ") else ln for ln in path.read_text().splitlines()]
        path.write_text("\n".join(lines) + "\n")
    return Config(proc_root=str(proc), sys_root=str(sys))


def test_the_counters_are_read_from_the_cgroup_and_the_host(tmp_path: Path) -> None:
    assert _oom_kill_counts(roots(tmp_path, 1, 5)) == (1, 5)


def test_the_narrowest_counter_that_moved_says_how_many() -> None:
    assert _oom_kills_during((1, 5), (2, 6)) == (1, "cgroup")
    assert _oom_kills_during((1, 5), (1, 7)) == (2, "host"), "another cgroup's kill is only seen host-wide"
    assert _oom_kills_during((None, 5), (None, 6)) == (1, "host"), "no memory controller: the host's counter"
    assert _oom_kills_during((1, 5), (1, 5)) == (0, "")
    assert _oom_kills_during((None, None), (None, None)) == (0, "")


def summary(signal: str | None, code: int, kills: int, scope: str) -> RunSummary:
    return RunSummary(command=["python", "train.py"], pid=42, exit_code=code, signal=signal, wall_s=129.0,
                      cpu_user_s=1.0, cpu_system_s=0.1, peak_tree_rss_bytes=1 << 30, peak_process_rss_bytes=1 << 30,
                      read_bytes=0, written_bytes=0, max_processes=1, signals_forwarded=[], metrics_url="",
                      oom_kills=kills, oom_scope=scope)


def test_the_summary_says_the_command_was_oom_killed() -> None:
    text = summary("SIGKILL", 137, 1, "cgroup").text()
    first = text.splitlines()[0]
    assert first.startswith("outrider: python train.py ended by signal SIGKILL (exit code 137): OOM-killed")
    assert "oom_kill +1 in this cgroup's memory.events" in first
    assert "OOM-killed by the kernel" in text.split("verdict:")[1], "the verdict's part says it too"


def test_a_sigkill_without_an_oom_kill_is_not_called_one() -> None:
    text = summary("SIGKILL", 137, 0, "").text()
    assert "OOM" not in text


def test_a_worker_oom_killed_while_the_command_lived_on_is_said() -> None:
    text = summary(None, 1, 2, "host").text()
    assert "OOM-killed (" not in text.splitlines()[0]
    assert "oom_kill +2 in the host's /proc/vmstat: a process of the run (a worker?) was OOM-killed" in text
