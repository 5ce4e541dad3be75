"""The spool heals, with real processes: a spool deleted or remounted under a running job is re-created at the next
flush and the job seen again, nothing counted twice; a dead rank's pid reused by another process is not taken for
it; spawned DataLoader workers are not ranks and never page. And the issue's "nothing lost": every step of every
process counted once across a spool deletion, a remount and an agent restart.

Once a deleted spool was never re-created (the job vanished from the agent), a reused pid kept a dead rank "stalled"
forever, and spawned DataLoader workers became rank-0 "training" processes that never stepped (a false stall)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.ground.config import Config
from outrider.kernel.procfs import start_ticks
from outrider.metrics.exposition import render
from outrider.shared import spool
from tests.helpers import AgentProcess, reap, release, samples, value, wait_until

FLUSH_S = 0.1

# Steps until `stop` exists, then says how many it made (outrider's count is exact) and exits normally.
STEPPER = textwrap.dedent("""
    import pathlib, sys, time
    import outrider
    stop, report = map(pathlib.Path, sys.argv[1:3])
    outrider.instrument()
    n = 0
    while not stop.exists():
        with outrider.step(samples=2):
            time.sleep(0.004)
        n += 1
    report.write_text(str(n))
""")


def _env(spool_dir: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    return {**base, "OUTRIDER_SPOOL_DIR": str(spool_dir), "OUTRIDER_FLUSH_INTERVAL_S": str(FLUSH_S),
            "OUTRIDER_STANDALONE": "false", **extra}


def _collector(spool_dir: Path, lock: bool = False) -> HookCollector:
    return HookCollector(CollectorContext(Config(spool_dir=str(spool_dir), flush_interval_s=FLUSH_S),
                                          hold_spool_lock=lock))


def _steps(c: HookCollector) -> float:
    return value(samples(render(c.collect()).decode()), "outrider_train_steps_total") or 0.0


@contextlib.contextmanager
def _steppers(tmp_path: Path, spool_dir: Path,
              n: int) -> Iterator[tuple[list[subprocess.Popen[bytes]], Path, list[Path]]]:
    stop = tmp_path / "stop"
    reports = [tmp_path / f"steps-{i}" for i in range(n)]
    procs = [subprocess.Popen([sys.executable, "-c", STEPPER, str(stop), str(r)], env=_env(spool_dir),
                              stderr=subprocess.PIPE) for r in reports]
    try:
        yield procs, stop, reports
    finally:
        stop.touch()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _finish(procs: list[subprocess.Popen[bytes]], stop: Path, reports: list[Path]) -> int:
    stop.touch()
    for p in procs:
        assert p.wait(timeout=60) == 0
        err = p.stderr.read().decode() if p.stderr else ""
        assert "Traceback" not in err, err
    return sum(int(r.read_text()) for r in reports)


class Monotonic:
    """Reads the merged step counter through a collector, failing if it ever goes backwards (a reset seen by
    Prometheus: what was counted before would be counted again)."""

    def __init__(self, c: HookCollector) -> None:
        self.c = c
        self.last = 0.0

    def read(self) -> float:
        now = _steps(self.c)
        assert now >= self.last, f"the merged step counter went backwards: {self.last} -> {now}"
        self.last = now
        return now

    def grows(self, what: str) -> None:
        before = self.read()
        wait_until(lambda: self.read() > before, timeout_s=30, what=what)


@contextlib.contextmanager
def _tmpfs_over(path: Path) -> Iterator[None]:
    """A tmpfs mounted over an existing directory (the spool), mode 0700; lazily unmounted (open shards in it)."""
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); the deletion tests cover re-creation")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_a_spool_deleted_under_a_running_job_is_recreated_private_and_nothing_is_counted_twice(
        tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    c = _collector(sp, lock=True)  # as an agent: it holds the spool's lock
    m = Monotonic(c)
    try:
        with _steppers(tmp_path, sp, 2) as (procs, stop, reports):
            wait_until(lambda: len(c.collect() and c.processes) == 2, timeout_s=30, what="both processes seen")
            m.grows("steps counted")
            shutil.rmtree(sp)  # `rm -rf` under the job
            m.read()  # the agent sees no shard now: what it had counted stays (retired), nothing goes backwards
            wait_until(lambda: len(list(sp.glob("*.shard"))) == 2, timeout_s=30, what="both shards re-created")
            assert stat.S_IMODE(sp.stat().st_mode) == 0o700, "re-created private, as at first"
            m.grows("steps counted again after the re-creation")
            assert spool.try_lock(str(sp)) is None, "the agent holds the lock of the re-created spool"
            wait_until(lambda: c.collect() and len(c.processes) == 2, timeout_s=30, what="the job seen again")
            total = _finish(procs, stop, reports)
        wait_until(lambda: m.read() == total and not c.processes, timeout_s=30, what="the final counts")
        assert m.read() == total, "every step counted once"
        assert value(samples(render(c.collect()).decode()), "outrider_samples_total") == 2 * total
    finally:
        c.close()


def test_a_tmpfs_mounted_over_the_spool_and_gone_again_is_healed_both_times(tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    sp.mkdir(mode=0o700)
    c = _collector(sp)
    m = Monotonic(c)
    try:
        with _steppers(tmp_path, sp, 1) as (procs, stop, reports):
            m.grows("steps counted")
            with _tmpfs_over(sp):
                wait_until(lambda: list(sp.glob("*.shard")), timeout_s=30, what="the shard re-created on the tmpfs")
                m.grows("steps counted from the remounted spool")
            # The volume gone: the old directory's stale shard shows again, the process re-writes it
            m.grows("steps counted after the volume went")
            total = _finish(procs, stop, reports)
        wait_until(lambda: m.read() == total, timeout_s=30, what="the final count")
    finally:
        c.close()


def _write_shard(spool_dir: Path, pid: int, start_ns: int, meta: dict[str, object], steps: int) -> str:
    w = spool.ShardWriter(str(spool_dir), pid, start_ns)
    directory = json.dumps({"meta": meta, "series": [["outrider_train_steps_total", "counter", {}, 0, []]]}).encode()
    w.write(directory, [float(steps)], flags=spool.FLAG_STALLED, pid=pid, stalls=1, start_ns=start_ns,
            heartbeat_ns=start_ns + 1, last_step_ns=start_ns, steps=steps, stalled_since_ns=start_ns + 1)
    w.close()
    return w.path


def test_a_reused_pid_is_not_taken_for_the_dead_rank(tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    sp.mkdir(mode=0o700)
    # A live process now holds the pid a dead rank had: same pid, another start.
    other = subprocess.Popen(["sleep", "300"])
    try:
        ticks = wait_until(lambda: start_ticks("/proc", other.pid), what="the process's start")
        with open("/proc/stat") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        started_ns = int((boot + ticks / os.sysconf("SC_CLK_TCK")) * 1e9)
        dead = _write_shard(sp, other.pid, 1_000, {"rank": "3", "starttime": ticks - 100}, 11)
        # An older hook's shard (no start ticks), written long before the live process started: also a dead one.
        dead_old = _write_shard(sp, other.pid, started_ns - 3_600 * 10**9, {"rank": "4"}, 13)
        # The live process's own shard (its start ticks), stalled: it stays, and stays stalled.
        alive = _write_shard(sp, other.pid, 2_000, {"rank": "5", "starttime": ticks}, 17)
        c = _collector(sp)
        try:
            wait_until(lambda: c.collect() and not Path(dead).exists() and not Path(dead_old).exists(),
                       timeout_s=30, what="the dead ranks retired")
            parsed = samples(render(c.collect()).decode())
            assert Path(alive).exists() and [p.rank for p in c.processes] == ["5"]
            assert c.processes[0].state == "stalled", "the live one is not taken for dead"
            assert value(parsed, "outrider_hook_stalled", rank="3") is None, "the dead rank no longer pages"
            assert value(parsed, "outrider_hook_stalled", rank="4") is None
            assert value(parsed, "outrider_hook_stalled", rank="5") == 1
            assert value(parsed, "outrider_train_steps_total", rank="3") == 11, "its counts kept (retired)"
            assert value(parsed, "outrider_train_steps_total", rank="4") == 13
        finally:
            c.close()
    finally:
        other.kill()
        other.wait()


# Training with a DataLoader whose workers are spawned. instrument() is at the top of the module, so each worker
# (which imports the main module as __mp_main__) instruments itself too, inheriting RANK and TORCHELASTIC_RUN_ID.
SPAWN_TRAINING = textwrap.dedent("""
    import pathlib, sys, time
    import torch
    import outrider
    outrider.instrument()

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 16
        def __getitem__(self, i):
            time.sleep(0.05)
            return torch.full((4,), float(i))

    if __name__ == "__main__":
        started, hold = map(pathlib.Path, sys.argv[1:3])
        epochs = int(sys.argv[3])
        with outrider.step():  # a first step: the rank itself is never waiting for one
            pass
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = torch.utils.data.DataLoader(Slow(), batch_size=2, num_workers=2, persistent_workers=True,
                                             multiprocessing_context="spawn")
        steps = 1
        for epoch in range(epochs):
            for x in loader:
                started.touch()
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                outrider.step_end()
                steps += 1
        print("steps", steps, file=sys.stderr)
        del loader
        while not hold.exists():
            time.sleep(0.05)
""")


def test_spawned_dataloader_workers_are_not_ranks_and_never_page(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    sp, started, hold = tmp_path / "spool", tmp_path / "started", tmp_path / "hold"
    script = tmp_path / "train.py"
    script.write_text(SPAWN_TRAINING)
    # The workers live several seconds; a process waiting for a first step would page after 1 s.
    env = _env(sp, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", TORCHELASTIC_RUN_ID="job-spawn",
               OUTRIDER_FIRST_STEP_TIMEOUT_S="1", OUTRIDER_STALL_FLOOR_S="120")
    p = subprocess.Popen([sys.executable, str(script), str(started), str(hold), "6"], env=env,
                         stderr=subprocess.PIPE, cwd=tmp_path)
    c = _collector(sp)
    pages: list[str] = []
    roles: dict[int, str] = {}
    try:
        def trained() -> bool:
            parsed = samples(render(c.collect()).decode())
            for proc in c.processes:
                roles[proc.header.pid] = str(proc.meta.get("role", ""))
                if proc.header.flags & spool.FLAG_STALLED:
                    pages.append(f"pid {proc.header.pid} ({proc.meta.get('role')}) flagged itself stalled")
            if value(parsed, "outrider_hook_stalled", rank="0", training_job="job-spawn"):
                pages.append("rank 0 paged as stalled")
            return p.poll() is not None or (started.exists() and
                                             value(parsed, "outrider_train_steps_total", rank="0",
                                                   training_job="job-spawn") == 1 + 6 * 8)
        wait_until(trained, timeout_s=240, interval_s=0.2, what="the training done")
        assert p.poll() is None, p.stderr.read().decode() if p.stderr else ""
        workers = [pid for pid, role in roles.items() if pid != p.pid]
        assert len(workers) >= 2, f"the spawned workers instrumented themselves (else this shows nothing): {roles}"
        assert pages == []
        assert all(roles[pid] == "worker" for pid in workers), roles
        assert roles[p.pid] == "", "the training process is the rank"
        hold.touch()
        assert p.wait(timeout=60) == 0
    finally:
        release(p, hold, c)


def test_nothing_lost_every_step_counted_once_across_a_deletion_a_remount_and_an_agent_restart(
        tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    sp.mkdir(mode=0o700)
    agent_env = {"OUTRIDER_SPOOL_DIR": str(sp), "OUTRIDER_FLUSH_INTERVAL_S": str(FLUSH_S)}

    def agent_steps(agent: AgentProcess) -> float:
        return value(samples(agent.metrics()), "outrider_train_steps_total") or 0.0

    with _steppers(tmp_path, sp, 3) as (procs, stop, reports), _tmpfs_guard(sp) as remount:
        agent = AgentProcess(env=agent_env, interval_s=0.2)
        try:
            seen = [0.0]

            def grows(what: str) -> None:
                before = seen[-1]
                wait_until(lambda: seen.append(agent_steps(agent)) or seen[-1] > before, timeout_s=30, what=what)
                assert seen == sorted(seen), f"the agent's step counter went backwards: {seen[-5:]}"

            grows("steps counted")
            shutil.rmtree(sp)
            grows("steps counted after the spool was deleted")
            remount()
            grows("steps counted after a tmpfs was mounted over the spool")
        finally:
            agent.stop()
        # A new agent: it reads what the shards say (cumulative), from zero for itself.
        agent = AgentProcess(env=agent_env, interval_s=0.2)
        try:
            seen[:] = [0.0]
            grows("steps counted by the new agent")
            total = _finish(procs, stop, reports)
            wait_until(lambda: agent_steps(agent) == total and
                       value(samples(agent.metrics()), "outrider_hook_processes", state="running") == 0,
                       timeout_s=30, what=f"all {total} steps of the three processes, each once")
            assert agent_steps(agent) == total
        finally:
            agent.stop()


@contextlib.contextmanager
def _tmpfs_guard(path: Path) -> Iterator[Callable[[], None]]:
    """A function that mounts a tmpfs over `path` when called; unmounted at the end (skips where mounting is not
    allowed)."""
    mounted: list[Path] = []

    def remount() -> None:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(path)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()})")
        mounted.append(path)

    try:
        yield remount
    finally:
        for m in mounted:
            subprocess.run(["umount", "-l", str(m)], capture_output=True)


# A rank that starts a helper with subprocess (it inherits RANK and TORCHELASTIC_RUN_ID) and steps until `stop`.
RANK_WITH_HELPER = textwrap.dedent("""
    import pathlib, subprocess, sys, time
    import outrider
    stop = pathlib.Path(sys.argv[1])
    outrider.instrument()
    helper = subprocess.Popen([sys.executable, "-c", "import pathlib, sys, time, outrider; outrider.instrument(); "
                               "[time.sleep(0.05) for _ in iter(lambda: pathlib.Path(sys.argv[1]).exists(), True)]",
                               str(stop)])
    while not stop.exists():
        with outrider.step():
            time.sleep(0.01)
    helper.wait()
""")


def test_a_helper_process_of_a_rank_that_never_steps_never_pages_the_rank(tmp_path: Path) -> None:
    sp, stop = tmp_path / "spool", tmp_path / "stop"
    env = _env(sp, RANK="0", TORCHELASTIC_RUN_ID="job-helper", OUTRIDER_FIRST_STEP_TIMEOUT_S="1")
    p = subprocess.Popen([sys.executable, "-c", RANK_WITH_HELPER, str(stop)], env=env)
    c = _collector(sp)
    try:
        pages: list[float] = []

        def helper_waited() -> bool:
            parsed = samples(render(c.collect()).decode())
            pages.append(value(parsed, "outrider_hook_stalled", rank="0", training_job="job-helper") or 0.0)
            # The rank is not "waiting for its first step" either (TrainingNoFirstStep reads this gauge).
            pages.append(value(parsed, "outrider_train_first_step_pending", rank="0", training_job="job-helper") or 0.0)
            # The helper waits for a first step that never comes (it inherits torchrun's environment) and flags
            # itself stalled: the scenario, else this test shows nothing.
            return any(q.header.pid != p.pid and q.state == "stalled" for q in c.processes)
        wait_until(helper_waited, timeout_s=60, what="the helper flagged stalled")
        for _ in range(5):
            helper_waited()
        assert pages and max(pages) == 0.0, "the rank, which steps, is never paged for its helper"
    finally:
        stop.touch()
        reap([p], timeout_s=30)
        c.close()
