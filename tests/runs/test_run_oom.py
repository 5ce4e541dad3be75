"""`outrider run` says when the command was OOM-killed: SIGKILL (exit 137) while the kernel's OOM-kill counter
went up, the memory cgroup's (v2 memory.events, v1 memory.oom_control with the cgroups below it) before the host's
(/proc/vmstat oom_kill), and the kernel log's lines name the killed processes; a worker killed while the command
lived on is said too. The counters are read from the kernel's files (fixture trees here, laid out as the kernel
writes them), before the command starts and after it ends; tests/runs/test_run_oom_killed.py has a real kill."""

from __future__ import annotations

import shutil
from pathlib import Path

from outrider.commands.runner import OomWatch, RunSummary, _oom_kills_during
from outrider.ground.config import Config
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
    return Config(proc_root=str(proc), sys_root=str(sys), kmsg_path="")


def test_the_counters_are_read_from_the_cgroup_and_the_host(tmp_path: Path) -> None:
    assert OomWatch(roots(tmp_path, 1, 5)).counts() == (1, 5)


def test_v1s_counters_of_the_runs_cgroup_and_those_below_it_are_added(tmp_path: Path) -> None:
    """v1 counts each cgroup's own kills: a command that put itself in a child cgroup of the run's is counted."""
    proc, memory = tmp_path / "proc", tmp_path / "sys" / "fs" / "cgroup" / "memory"
    shutil.copytree(FIXTURES / "proc", proc)
    (proc / "self" / "cgroup").write_text("4:memory:/run\n0::/\n")
    (proc / "vmstat").write_text("pgfault 10\noom_kill 7\n")
    for rel, kills in (("", 0), ("run", 1), ("run/leak", 2), ("run/leak/deeper", 1), ("other", 5)):
        (memory / rel).mkdir(parents=True, exist_ok=True)
        (memory / rel / "memory.usage_in_bytes").write_text("4096\n")
        (memory / rel / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n")
    watch = OomWatch(Config(proc_root=str(proc), sys_root=str(tmp_path / "sys"), kmsg_path=""))
    assert watch.counts() == (4, 7)


def test_the_narrowest_counter_that_moved_says_how_many() -> None:
    assert _oom_kills_during((1, 5), (2, 6)) == (1, "cgroup")
    assert _oom_kills_during((1, 5), (1, 7)) == (2, "host"), "another cgroup's kill is only seen host-wide"
    assert _oom_kills_during((None, 5), (None, 6)) == (1, "host"), "no memory controller: the host's counter"
    assert _oom_kills_during((1, 5), (1, 5)) == (0, "")
    assert _oom_kills_during((None, None), (None, None)) == (0, "")


def summary(signal: str | None, code: int, kills: int, scope: str, counter: str = "memory.events",
            victims: tuple[str, ...] = ()) -> RunSummary:
    return RunSummary(command=["python", "train.py"], pid=42, exit_code=code, signal=signal, wall_s=129.0,
                      cpu_user_s=1.0, cpu_system_s=0.1, peak_tree_rss_bytes=1 << 30, peak_process_rss_bytes=1 << 30,
                      read_bytes=0, written_bytes=0, max_processes=1, signals_forwarded=[], metrics_url="",
                      oom_kills=kills, oom_scope=scope, oom_counter=counter, oom_victims=list(victims))


def test_the_summary_says_the_command_was_oom_killed() -> None:
    text = summary("SIGKILL", 137, 1, "cgroup").text()
    first = text.splitlines()[0]
    assert first.startswith("outrider: python train.py ended by signal SIGKILL (exit code 137): OOM-killed")
    assert "oom_kill +1 in this cgroup's memory.events" in first
    assert text.split("verdict: ")[1].startswith("OOM-killed by the kernel"), "the verdict says it first"
    assert "until then" in text.split("verdict: ")[1], "how the run went until the kill, after it"


def test_the_summary_names_the_counter_and_the_kernel_logs_victims() -> None:
    text = summary("SIGKILL", 137, 1, "cgroup", "memory.oom_control", ("python3 (pid 42) in memory cgroup /run",)
                   ).text()
    assert ("OOM-killed (oom_kill +1 in this cgroup's memory.oom_control; the kernel log: python3 (pid 42) in memory "
            "cgroup /run)") in text.splitlines()[0]


def test_a_sigkill_without_an_oom_kill_is_not_called_one() -> None:
    text = summary("SIGKILL", 137, 0, "").text()
    assert "OOM" not in text


def test_a_worker_oom_killed_while_the_command_lived_on_is_said() -> None:
    text = summary(None, 1, 2, "host").text()
    assert "OOM-killed (" not in text.splitlines()[0]
    assert "oom_kill +2 in the host's /proc/vmstat: a process of the run (a worker?) was OOM-killed" in text


def test_the_kernel_log_names_the_runs_victims_and_no_one_elses(tmp_path: Path) -> None:
    """The host's hierarchy (v1, release_agent at its root): a kill charged to the run's cgroup or one below it, or of
    CMD's pid, is the run's; a kill in another cgroup is not."""
    proc, memory = tmp_path / "proc", tmp_path / "sys" / "fs" / "cgroup" / "memory"
    shutil.copytree(FIXTURES / "proc", proc)
    (proc / "self" / "cgroup").write_text("4:memory:/run\n0::/\n")
    (proc / "vmstat").write_text("oom_kill 0\n")
    for rel in ("", "run", "run/leak", "other"):
        (memory / rel).mkdir(parents=True, exist_ok=True)
        (memory / rel / "memory.usage_in_bytes").write_text("4096\n")
        (memory / rel / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (memory / "release_agent").write_text("\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,1,-;oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/run/leak,task=old,pid=1,uid=0\n")
    watch = OomWatch(Config(proc_root=str(proc), sys_root=str(tmp_path / "sys"), kmsg_path=str(kmsg)))
    lines = []
    for n, (memcg, task, pid) in enumerate((("/run/leak", "python3", 300), ("/other", "java", 301),
                                            ("/", "cmd", 299), ("/runner", "near", 302)), 2):
        lines.append(f"6,{n},{n},-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
                     f"oom_memcg={memcg},task_memcg={memcg},task={task},pid={pid},uid=0")
        lines.append(f"3,{n},{n},-;Memory cgroup out of memory: Killed process {pid} ({task}) total-vm:1kB")
    with kmsg.open("a") as fh:
        fh.write("\n".join(lines) + "\n")
    (proc / "vmstat").write_text("oom_kill 4\n")
    (memory / "run" / "leak" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    kills, scope, counter, victims = watch.finish(child=299)
    assert (kills, scope, counter) == (1, "cgroup", "memory.oom_control")
    assert victims == ["python3 (pid 300) in memory cgroup /run/leak", "cmd (pid 299) in memory cgroup /"]
