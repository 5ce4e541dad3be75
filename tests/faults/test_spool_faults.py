"""The spool under faults, with real processes: a full volume at start and mid-run (the workload once died of
SIGBUS), a shard truncated under a running agent (which once killed the agent, or the job in standalone mode), and a
spool prepared by another user with planted links (nothing outside the spool is written, read or sent)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.ground.config import Config
from outrider.metrics.exposition import render
from outrider.shared import spool
from tests.faults.tmpfs import fill, small_tmpfs
from tests.helpers import (
    REPO,
    AgentProcess,
    free_port,
    http_get,
    release,
    samples,
    standalone_agent,
    stop_standalone_agent,
    value,
    wait_until,
)

WORKLOAD = str(REPO / "tests" / "hook" / "workload.py")
STRANGER = 54321
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing owners and mounting need root (CI runs as root)")


def _env(spool_dir: Path | None, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    if spool_dir is not None:
        base["OUTRIDER_SPOOL_DIR"] = str(spool_dir)
    return {**base, "OUTRIDER_FLUSH_INTERVAL_S": "0.1", "OUTRIDER_STANDALONE": "false", **extra}


def _agent_view(spool_dir: Path) -> dict:  # type: ignore[type-arg]
    c = HookCollector(CollectorContext(Config(spool_dir=str(spool_dir)), hold_spool_lock=False))
    try:
        return samples(render(c.collect()).decode())
    finally:
        c.close()


@needs_root
@pytest.mark.parametrize("when", ["at_start", "mid_run"])
def test_a_full_spool_volume_never_kills_the_workload_and_loses_no_step(tmp_path: Path, when: str) -> None:
    pause, grown, hold = tmp_path / "pause", tmp_path / "grown", tmp_path / "hold"
    with small_tmpfs(tmp_path / "spool", "1m", "the unit tests cover a failing write") as volume:
        filler = fill(volume) if when == "at_start" else None
        p = subprocess.Popen([sys.executable, WORKLOAD, "--steps", "40", "--pause", str(pause), "--grow", "100",
                              "--grown", str(grown), "--hold", str(hold)], env=_env(volume), stderr=subprocess.PIPE)
        try:
            if when == "mid_run":
                wait_until(lambda: list(volume.glob("*.shard")), timeout_s=30, what="the shard")
                filler = fill(volume)  # full now; the workload grows into new series next
            pause.touch()  # 100 new series (new pages of the shard) and 40 steps, on the full volume
            wait_until(lambda: p.poll() is not None or grown.exists(), timeout_s=60, what="the work on a full volume")
            assert p.poll() is None, f"the workload died on a full spool: {p.returncode}"
            assert filler is not None
            filler.unlink()  # space returns
            wait_until(lambda: value(_agent_view(volume), "outrider_train_steps_total") == 80, timeout_s=30,
                       what="all 80 steps published once space returned")
            hold.touch()
            assert p.wait(timeout=30) == 0
        finally:
            p.kill()
            p.wait()
        err = p.stderr.read().decode() if p.stderr else ""
        assert "Traceback" not in err
        if when == "at_start":
            assert "cannot publish to the spool" in err, "said once, clearly"


def test_a_shard_truncated_under_a_running_agent_is_counted_and_the_agent_serves_on(tmp_path: Path) -> None:
    sp, hold = tmp_path / "spool", tmp_path / "hold"
    with AgentProcess(env={"OUTRIDER_SPOOL_DIR": str(sp), "OUTRIDER_FLUSH_INTERVAL_S": "0.1"},
                      interval_s=0.2) as agent:
        victim = subprocess.Popen([sys.executable, WORKLOAD, "--steps", "5", "--hold", str(hold)], env=_env(sp))
        good = subprocess.Popen([sys.executable, WORKLOAD, "--steps", "7", "--hold", str(hold)], env=_env(sp))
        try:
            wait_until(lambda: len(list(sp.glob("*.shard"))) == 2, timeout_s=30, what="two shards")
            wait_until(lambda: value(samples(agent.metrics()), "outrider_hook_processes", state="running") == 2,
                       timeout_s=30, what="both read")
            victim.send_signal(19)  # SIGSTOP: it stops rewriting its shard, which someone now cuts short
            path = next(p for p in sp.glob("*.shard") if f"-{victim.pid}-" in p.name)
            os.truncate(path, 100)
            wait_until(lambda: (value(samples(agent.metrics()), "outrider_hook_shard_errors_total",
                                      reason="truncated") or 0) >= 1, timeout_s=30, what="the truncation counted")
            assert agent.proc.poll() is None, "the agent survived"
            assert http_get(f"{agent.url}/healthz")[0] == 200
            # The good shard is read; the cut one's last good values are kept as retired (a merged counter never
            # dips because a shard became unreadable), and counted once.
            assert value(samples(agent.metrics()), "outrider_train_steps_total") == 7 + 5
        finally:
            victim.send_signal(18)
            hold.touch()
            for p in (victim, good):
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def test_a_standalone_workload_survives_a_truncated_neighbour(tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    sp.mkdir(mode=0o700)
    planted = sp / f"outrider-{os.getpid()}-1.shard"  # a live pid (this test), a shard cut short
    planted.write_bytes(spool.MAGIC + b"\x01")
    port = free_port()
    p = subprocess.run([sys.executable, WORKLOAD, "--steps", "30", "--step-sleep", "0.02"],
                       env=_env(sp, OUTRIDER_STANDALONE="true", OUTRIDER_LISTEN=f"127.0.0.1:{port}",
                                OUTRIDER_INTERVAL_S="0.2"),
                       capture_output=True, text=True, timeout=120)
    agent = standalone_agent(p.stderr)
    assert agent is not None, p.stderr
    # The agent it started read the bad shard (once, in the workload's own process, that was a SIGBUS), and
    # ends by itself after the workload.
    assert stop_standalone_agent(agent[0])
    assert p.returncode == 0, p.stderr


@needs_root
def test_a_spool_prepared_by_another_user_is_refused_and_nothing_outside_it_is_touched(tmp_path: Path) -> None:
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    victim_dir = tmp_path / "victims"
    victim_dir.mkdir()
    precious = victim_dir / "precious"
    precious.write_text("root-only contents\n")
    # Another local user got there first: the default spool (in the runtime directory here, so the test never
    # touches the machine's /tmp) is theirs, open to all, with links planted where the workload and agent write.
    hostile = runtime / "outrider-spool"
    hostile.mkdir()
    hostile.chmod(0o777)
    os.chown(hostile, STRANGER, STRANGER)
    (hostile / spool.LOCK_NAME).symlink_to(victim_dir / "created-lock")
    (hostile / "outrider-1-1.stacks.txt").symlink_to(precious)
    env = _env(None, XDG_RUNTIME_DIR=str(runtime), OUTRIDER_STANDALONE="true",
               OUTRIDER_LISTEN=f"127.0.0.1:{free_port()}")
    r = subprocess.run([sys.executable, WORKLOAD, "--steps", "20"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert "belongs to uid 54321" in r.stderr and "refused" in r.stderr, "one clear message"
    assert sorted(os.listdir(victim_dir)) == ["precious"] and precious.read_text() == "root-only contents\n"
    assert not list(hostile.glob("*.shard")), "nothing published into someone else's directory"


@needs_root
def test_planted_shards_and_stack_links_in_a_shared_spool_are_never_read_or_sent(tmp_path: Path) -> None:
    shared = tmp_path / "emptydir"  # a pod's shared volume: root's, open to every container
    shared.mkdir()
    shared.chmod(0o777)
    precious = tmp_path / "precious"
    precious.write_text("SECRET-CONTENTS")
    # A stranger plants a shard claiming a stalled training process and huge counts, and a stack dump that links
    # to a root-only file: the agent must neither count the one nor send the other in a stall page.
    fake = spool.ShardWriter(str(shared), os.getpid(), 5)
    fake.write(b'{"meta":{"rank":"0"},"series":[["outrider_train_steps_total","counter",{},0,[]]]}', [1e9],
               flags=spool.FLAG_STALLED, pid=os.getpid(), stalls=1, start_ns=5, heartbeat_ns=5, last_step_ns=0,
               steps=1, stalled_since_ns=5)
    os.chown(fake.path, STRANGER, STRANGER)
    Path(spool.stacks_path(fake.path)).symlink_to(precious)
    os.lchown(spool.stacks_path(fake.path), STRANGER, STRANGER)
    ctx = CollectorContext(Config(spool_dir=str(shared)), roots=(os.getpid(),), hold_spool_lock=False)
    c = HookCollector(ctx)
    try:
        parsed = samples(render(c.collect()).decode())
    finally:
        c.close()
    assert value(parsed, "outrider_train_steps_total", rank="0") is None, "a stranger's shard is not counted"
    assert value(parsed, "outrider_hook_shard_errors_total", reason="untrusted") == 1
    assert ctx.stalled_stacks == [], "nothing to put in a page"
    assert stat.S_ISLNK(os.lstat(spool.stacks_path(fake.path)).st_mode) and precious.read_text() == "SECRET-CONTENTS"


# 40 steps; at `pause`, 400 new histograms in four metrics (more than the shard's first file holds) and 40 more
# steps; then `grown`, and it waits for `hold`.
GROWING = """
import pathlib, sys, time
import outrider
pause, grown, hold = map(pathlib.Path, sys.argv[1:4])
outrider.instrument()
def steps():
    for _ in range(40):
        with outrider.step():
            time.sleep(0.001)
steps()
while not pause.exists():
    time.sleep(0.05)
for i in range(400):
    outrider.histogram(f"workload_grown_{i // 100}_seconds", {"series": f"{i:03d}"}).observe(0.01)
steps()
time.sleep(0.5)
grown.touch()
while not hold.exists():
    time.sleep(0.05)
"""


@needs_root
def test_a_shard_that_cannot_grow_on_a_full_volume_keeps_publishing_its_steps_then_grows(tmp_path: Path) -> None:
    pause, grown, hold = tmp_path / "pause", tmp_path / "grown", tmp_path / "hold"
    with small_tmpfs(tmp_path / "spool", "1m", "tests/spool/test_shard_growth.py covers leaving series out") as volume:
        p = subprocess.Popen([sys.executable, "-c", GROWING, str(pause), str(grown), str(hold)], env=_env(volume),
                             stderr=subprocess.PIPE)
        c = HookCollector(CollectorContext(Config(spool_dir=str(volume), flush_interval_s=0.1),
                                           hold_spool_lock=False))
        try:
            wait_until(lambda: list(volume.glob("*.shard")), timeout_s=30, what="the shard")
            filler = fill(volume)  # no room for a larger shard now
            pause.touch()  # 400 new histograms (more than the first file holds) and 40 more steps
            wait_until(lambda: p.poll() is not None or grown.exists(), timeout_s=60, what="the work on a full volume")
            assert p.poll() is None, f"the workload died: {p.returncode}"

            def full_view() -> tuple[float, int] | None:
                parsed = samples(render(c.collect()).decode())
                # A series left out is counted at the flush that leaves it out, published at the next one.
                left_out = value(parsed, "outrider_hook_dropped_total", reason="shard_full") or 0
                shown = sum(1 for (n, _l) in parsed if n.startswith("workload_grown_") and n.endswith("_count"))
                steps = value(parsed, "outrider_train_steps_total")
                return (left_out, shown) if steps == 80 and shown + left_out == 400 else None
            left_out, shown = wait_until(full_view, timeout_s=30,
                                         what="every step published, and what did not fit counted series by series")
            assert left_out > 0 and shown > 0, (left_out, shown)
            assert [q.state for q in c.processes] == ["running"], "no false stall: the heartbeat kept coming"
            filler.unlink()  # space returns: the shard grows, every series is published
            wait_until(lambda: sum(1 for (n, _l) in samples(render(c.collect()).decode())
                                   if n.startswith("workload_grown_") and n.endswith("_count")) == 400, timeout_s=60,
                       what="all 400 series once the shard could grow")
            hold.touch()
            assert p.wait(timeout=30) == 0
        finally:
            release(p, hold, c)
        err = p.stderr.read().decode() if p.stderr else ""
        assert "Traceback" not in err and "cannot grow the shard" in err, "said once"
        assert err.count("cannot grow the shard") == 1
