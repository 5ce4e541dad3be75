"""Two real agents on one spool (a node agent and a sidecar, `outrider run` beside an agent) with real hooked
processes that finish: each agent reports every process, live or finished, and only the agent owning the spool
(agent.lock) deletes a finished process's shard, once every other agent has swept since it finished.

Once the first agent to see a finished shard retired and deleted it: the two agents reported 300 and 100 steps
where 400 were done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from outrider.shared import spool
from tests.helpers import REPO, AgentProcess, after_more, samples, value, wait_until
from tests.servers import PrometheusServer

pytestmark = pytest.mark.integration
WORKLOAD = str(REPO / "tests" / "hook" / "workload.py")
STEPS = 100


def _finish(spool_dir: Path, n: int = 1) -> None:
    """n hooked processes of STEPS steps each, run to their end."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    env = {**base, "OUTRIDER_SPOOL_DIR": str(spool_dir), "OUTRIDER_FLUSH_INTERVAL_S": "0.2",
           "OUTRIDER_STANDALONE": "false"}
    procs = [subprocess.Popen([sys.executable, WORKLOAD, "--steps", str(STEPS)], env=env) for _ in range(n)]
    try:
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _steps(agent: AgentProcess) -> float:
    return value(samples(agent.metrics()), "outrider_train_steps_total", rank="") or 0.0


def _shards(spool_dir: Path) -> list[str]:
    return sorted(p.name for p in spool_dir.iterdir() if spool.SHARD_NAME_RE.fullmatch(p.name))


def _reports(agent: AgentProcess, steps: float) -> bool:
    parsed = samples(agent.metrics())
    return (value(parsed, "outrider_train_steps_total", rank="") == steps
            and value(parsed, "outrider_hook_processes", state="running") == 0)


def _one_more_finishes(spool_dir: Path, agent: AgentProcess, total: float) -> int:
    """One more process runs to its end; once `agent` reports `total` steps and has swept 5 more times, how many
    shards are left in the spool."""
    _finish(spool_dir)
    wait_until(lambda: _reports(agent, total), timeout_s=30, what=f"{total} steps")
    after_more(agent, "outrider_agent_sweeps_total", 5)
    return len(_shards(spool_dir))


def test_two_agents_on_one_spool_both_report_every_finished_process_and_only_the_owner_deletes(
        tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    env = {"OUTRIDER_SPOOL_DIR": str(sp), "OUTRIDER_FLUSH_INTERVAL_S": "0.2"}
    with AgentProcess(env=env, interval_s=0.3) as owner, AgentProcess(env=env, interval_s=0.3) as reader:
        stopped: list[AgentProcess] = []

        def pause(agent: AgentProcess) -> None:
            agent.proc.send_signal(signal.SIGSTOP)
            stopped.append(agent)

        def resume(agent: AgentProcess) -> None:
            agent.proc.send_signal(signal.SIGCONT)
            stopped.remove(agent)

        try:
            assert value(samples(owner.metrics()), "outrider_hook_spool_owner") == 1
            assert value(samples(reader.metrics()), "outrider_hook_spool_owner") == 0
            _finish(sp, 4)
            for agent in (owner, reader):
                wait_until(lambda a=agent: _reports(a, 4 * STEPS), timeout_s=30,  # type: ignore[misc]
                           what="400 steps of 4 finished processes on both agents")
            wait_until(lambda: not _shards(sp), timeout_s=30, what="the finished shards deleted by the owner")
            for agent in (owner, reader):
                assert value(samples(after_more(agent, "outrider_agent_sweeps_total", 3)),
                             "outrider_train_steps_total", rank="") == 4 * STEPS, "counted once, not again"
            with PrometheusServer(tmp_path / "prom", [f"127.0.0.1:{owner.port}", f"127.0.0.1:{reader.port}"]) as prom:
                # Both endpoints carry the full totals: summed over both, the spool's steps count twice; selecting
                # the owner (or either agent) counts them once.
                doubled = prom.wait_for("sum(outrider_train_steps_total) == 800")
                assert float(doubled[0]["value"][1]) == 2 * 4 * STEPS
                once = prom.wait_for("sum(outrider_train_steps_total and on (job, instance) "
                                     "(outrider_hook_spool_owner == 1))")
                assert float(once[0]["value"][1]) == 4 * STEPS

            # The reader never deletes: with the owner stopped, a finished shard stays (the reader reports it).
            pause(owner)
            assert _one_more_finishes(sp, reader, 5 * STEPS) == 1, "the reader left the finished shard for the owner"

            # The owner waits for every reader: with the reader stopped, the owner (back) reports a process that
            # finishes now, and keeps its shard until the reader has swept.
            pause(reader)
            resume(owner)
            assert _one_more_finishes(sp, owner, 6 * STEPS) == 2, "kept while a reader has not seen it"
            resume(reader)
            wait_until(lambda: _reports(reader, 6 * STEPS), timeout_s=30, what="the reader's 600")
            wait_until(lambda: not _shards(sp), timeout_s=30, what="both deleted once the reader swept")
            assert _steps(owner) == _steps(reader) == 6 * STEPS

            # The owner leaves: the reader takes the spool over and cleans up after itself.
            owner.stop()
            wait_until(lambda: value(samples(reader.metrics()), "outrider_hook_spool_owner") == 1, timeout_s=30,
                       what="the reader owning the spool")
            _finish(sp)
            wait_until(lambda: _reports(reader, 7 * STEPS) and not _shards(sp), timeout_s=30,
                       what="the new owner's 700, its shard deleted")
            assert not [p for p in sp.iterdir() if spool.READER_NAME_RE.fullmatch(p.name)], "no reader mark left"
        finally:
            for agent in stopped:
                agent.proc.send_signal(signal.SIGCONT)


def test_reader_marks_of_agents_gone_and_planted_links_do_not_hold_cleanup_back(tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    sp.mkdir(mode=0o700)
    # A reader killed without closing leaves its mark, unlocked; a file merely named like one is no reader.
    left = sp / "reader-00000000000000aa.lock"
    left.write_text("")
    os.utime(left, ns=(0, 0))
    planted = sp / "reader-00000000000000bb.lock"
    planted.symlink_to(tmp_path / "nowhere")
    live = spool.ReaderMark(str(sp))
    try:
        assert spool.live_readers(str(sp)) == [0], "only the live reader, which has not swept yet"
        assert not left.exists(), "the dead reader's mark is removed"
        live.swept(123)
        assert spool.live_readers(str(sp)) == [123]
    finally:
        live.close()
    assert spool.live_readers(str(sp)) == []
    assert planted.is_symlink(), "a link is neither followed nor removed"
