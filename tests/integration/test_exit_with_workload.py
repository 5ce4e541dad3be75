"""`outrider agent` with exit_when_workload_exits, as a process beside a real instrumented workload: it exports the
workload's steps while it runs, and once the workload is gone it stops by itself, exit 0, after a final sweep and
OTLP flush that carry the last values. This is the sidecar's end on a cluster without native sidecars."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, AgentProcess, samples, sleeper, value, wait_until
from tests.servers import OtlpHttpReceiver, otlp_points

pytestmark = pytest.mark.integration
WORKLOAD = REPO / "tests" / "hook" / "workload.py"


def _steps_exported(receiver: OtlpHttpReceiver) -> float:
    points = otlp_points(receiver.requests).get("outrider.train.steps", [])
    return max((p.as_double or p.as_int for _, p in points), default=0.0)


def test_agent_exits_zero_after_the_workload_with_its_last_values_flushed(tmp_path: Path) -> None:
    spool, hold = tmp_path / "spool", tmp_path / "go"
    env = {"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_EXIT_WHEN_WORKLOAD_EXITS": "true",
           "OUTRIDER_RULE_FILES": "", "OUTRIDER_COLLECTORS": "hook,self"}
    with OtlpHttpReceiver() as receiver, AgentProcess(
            env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_METRIC_EXPORT_INTERVAL": "60000"},
            interval_s=0.5) as agent:
        workload_env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
        workload_env.update({"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_STANDALONE": "false",
                             "OUTRIDER_FLUSH_INTERVAL_S": "0.2", "PYTHONPATH": str(REPO / "agent")})
        work = subprocess.Popen([sys.executable, str(WORKLOAD), "--steps", "40", "--hold", str(hold)],
                                env=workload_env)
        try:
            steps = wait_until(lambda: value(samples(agent.metrics()), "outrider_train_steps_total", rank=""),
                               timeout_s=60, what="the workload's steps on /metrics")
            assert steps == 40
            assert agent.proc.poll() is None, "the agent stays while the workload runs"
            hold.touch()
            assert work.wait(timeout=60) == 0
            code = agent.proc.wait(timeout=60)  # a bound, generous: the grace period is 5 s
        finally:
            if work.poll() is None:
                work.kill()
                work.wait()
        assert code == 0, agent.output
        assert "the workload is gone" in agent.output
        # The periodic export is once a minute: only the final flush on the way out can have carried the steps.
        assert _steps_exported(receiver) == 40
        assert list(spool.glob("*.shard")) == [], "the closed shard was read and cleaned up"


def test_agent_exits_when_the_watched_pid_tree_is_gone(tmp_path: Path) -> None:
    work = sleeper(600)
    try:
        with AgentProcess("--pid", str(work.pid), env={
                "OUTRIDER_EXIT_WHEN_WORKLOAD_EXITS": "1", "OUTRIDER_SPOOL_DIR": str(tmp_path / "spool"),
                "OUTRIDER_RULE_FILES": ""}, interval_s=0.5) as agent:
            wait_until(lambda: "watching the workload" in agent.output, timeout_s=30, what="the agent to see the pid")
            work.send_signal(signal.SIGTERM)
            work.wait(timeout=30)
            assert agent.proc.wait(timeout=60) == 0, agent.output
    finally:
        if work.poll() is None:
            work.kill()
            work.wait()


def test_without_the_setting_the_agent_outlives_the_workload(tmp_path: Path) -> None:
    work = sleeper(600)
    try:
        with AgentProcess("--pid", str(work.pid), env={"OUTRIDER_SPOOL_DIR": str(tmp_path / "spool"),
                                                       "OUTRIDER_RULE_FILES": ""}, interval_s=0.2) as agent:
            work.kill()
            work.wait()
            # 40 sweeps (8 s) after the tree is gone: longer than the 5 s the setting would have waited
            first = value(samples(agent.metrics()), "outrider_agent_sweeps_total") or 0
            wait_until(lambda: (value(samples(agent.metrics()), "outrider_agent_sweeps_total") or 0) >= first + 40,
                       timeout_s=60, what="40 more sweeps")
            assert agent.proc.poll() is None
    finally:
        if work.poll() is None:
            work.kill()
            work.wait()


def test_agent_exits_after_a_workload_shorter_than_one_sweep(tmp_path: Path) -> None:
    """A crash at start or a 1-3 s job: never alive at a sweep, but its closed shard is read; the agent used to wait
    for it forever (the Job stayed Running)."""
    spool = tmp_path / "spool"
    env = {"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_EXIT_WHEN_WORKLOAD_EXITS": "true",
           "OUTRIDER_RULE_FILES": "", "OUTRIDER_COLLECTORS": "hook,self", "OUTRIDER_STARTUP_GRACE_S": "0"}
    # Ready means its first sweep is done and saw nothing; the next is 10 s later, long after the workload's end.
    with AgentProcess(env=env, interval_s=10.0) as agent:
        workload_env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
        workload_env.update({"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_STANDALONE": "false",
                             "OUTRIDER_FLUSH_INTERVAL_S": "0.2", "PYTHONPATH": str(REPO / "agent")})
        assert subprocess.run([sys.executable, str(WORKLOAD), "--steps", "5"], env=workload_env,
                              timeout=60).returncode == 0
        code = agent.proc.wait(timeout=180)  # a bound, generous: a sweep reads the shard, then 3 sweeps of grace
        assert code == 0, agent.output
        assert "ran and exited between two sweeps" in agent.output
        assert "the workload is gone" in agent.output


def test_agent_exits_when_no_workload_appears_within_the_startup_grace(tmp_path: Path) -> None:
    """The trainer failed before instrument(): nothing ever publishes."""
    env = {"OUTRIDER_SPOOL_DIR": str(tmp_path / "spool"), "OUTRIDER_EXIT_WHEN_WORKLOAD_EXITS": "true",
           "OUTRIDER_RULE_FILES": "", "OUTRIDER_COLLECTORS": "hook,self", "OUTRIDER_STARTUP_GRACE_S": "2"}
    with AgentProcess(env=env, interval_s=0.5) as agent:
        code = agent.proc.wait(timeout=60)
        assert code == 0, agent.output
        assert "no workload appeared within startup_grace_s" in agent.output
