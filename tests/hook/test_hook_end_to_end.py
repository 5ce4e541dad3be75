"""Hooked processes (spawned ranks, forked children, a torch loop) through the real agent to /metrics and the real
Prometheus; and the faults: no agent, agent restarted, process killed mid-run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import (
    REPO,
    AgentProcess,
    free_port,
    http_get,
    samples,
    standalone_agent,
    stop,
    stop_standalone_agent,
    value,
    wait_until,
)
from tests.servers import PrometheusServer

pytestmark = pytest.mark.integration
WORKLOAD = str(REPO / "tests" / "hook" / "workload.py")


def env(spool: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    return {**base, "OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2", **extra}


def start(spool: Path, *args: str, **extra: str) -> subprocess.Popen[bytes]:
    """A workload in a process group of its own: stop() ends it with the children it forked."""
    return subprocess.Popen([sys.executable, WORKLOAD, *args], env=env(spool, **extra), start_new_session=True)


def test_ranks_and_forked_children_through_agent_and_prometheus(tmp_path: Path) -> None:
    spool, hold = tmp_path / "spool", tmp_path / "hold"
    with AgentProcess(env={"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2"},
                      interval_s=0.3) as agent:
        ranks = [start(spool, "--steps", "30", "--forks", "2", "--hold", str(hold), RANK=str(r), WORLD_SIZE="2")
                 for r in range(2)]
        try:
            def all_live() -> bool:
                parsed = samples(agent.metrics())
                return (value(parsed, "outrider_hook_processes", state="running") == 6
                        and value(parsed, "outrider_samples_total", rank="1") == 30 * 4 + 2 * 7)
            wait_until(all_live, timeout_s=30, what="2 ranks and 4 forked children publishing")
            parsed = samples(agent.metrics())
            for r in ("0", "1"):
                assert value(parsed, "outrider_train_steps_total", rank=r) == 30
                assert value(parsed, "outrider_samples_total", rank=r) == 30 * 4 + 14, "children add, not copy"
                assert value(parsed, "outrider_tokens_total", rank=r) == 30 * 64
                assert value(parsed, "outrider_train_step_duration_seconds_count", rank=r) == 30
                assert value(parsed, "outrider_train_data_wait_seconds_count", rank=r) == 30
                assert value(parsed, "workload_phase_seconds_count", phase="main", rank=r) == 1
            with PrometheusServer(tmp_path / "prom", [f"127.0.0.1:{agent.port}"]) as prom:
                result = prom.wait_for("sum by (rank) (outrider_train_steps_total)")
                assert {r["metric"]["rank"]: float(r["value"][1]) for r in result} == {"0": 30.0, "1": 30.0}
                p99 = prom.wait_for(
                    "histogram_quantile(0.99, sum by (le) (outrider_train_step_duration_seconds_bucket))")
                assert 0.001 <= float(p99[0]["value"][1]) <= 1.0
            hold.write_text("x")
            for p in ranks:
                assert p.wait(timeout=30) == 0
            def retired() -> bool:
                parsed = samples(agent.metrics())
                return (value(parsed, "outrider_hook_processes", state="running") == 0
                        and value(parsed, "outrider_samples_total", rank="0") == 30 * 4 + 14)
            wait_until(retired, timeout_s=30, what="finished processes retired with their counts kept")
            assert list(spool.glob("*.shard")) == [], "shards of finished processes are cleaned up"
        finally:
            hold.touch()
            for p in ranks:
                stop(p)


def test_without_an_agent_the_process_starts_one_that_serves_its_metrics(tmp_path: Path) -> None:
    spool, hold, err = tmp_path / "spool", tmp_path / "hold", tmp_path / "stderr"
    port = free_port()
    with err.open("wb") as stderr:
        p = subprocess.Popen([sys.executable, WORKLOAD, "--steps", "20", "--hold", str(hold)], stderr=stderr,
                             env=env(spool, OUTRIDER_LISTEN=f"127.0.0.1:{port}", OUTRIDER_INTERVAL_S="0.3"),
                             start_new_session=True)
    agent = None
    try:
        agent = wait_until(lambda: standalone_agent(err.read_text()), timeout_s=30, what="the agent's start line")
        assert agent == (agent[0], f"http://127.0.0.1:{port}") and agent[0] != p.pid

        def served() -> float | None:
            return value(samples(http_get(f"http://127.0.0.1:{port}/metrics")[2].decode()),
                         "outrider_train_steps_total", rank="")
        assert wait_until(served, timeout_s=30, what="the agent's /metrics") == 20
        parsed = samples(http_get(f"http://127.0.0.1:{port}/metrics")[2].decode())
        assert value(parsed, "outrider_watched_processes") == 1, "the workload, not the agent"
        hold.write_text("x")
        assert p.wait(timeout=30) == 0
        assert stop_standalone_agent(agent[0]), "the agent exits by itself once the workload is gone"
    finally:
        stop(p)
        if agent is not None:
            stop_standalone_agent(agent[0], timeout_s=0)


def test_agent_restart_neither_loses_nor_doubles(tmp_path: Path) -> None:
    spool, hold = tmp_path / "spool", tmp_path / "hold"
    agent_env = {"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2"}
    p = start(spool, "--steps", "25", "--hold", str(hold), OUTRIDER_STANDALONE="false")
    try:
        with AgentProcess(env=agent_env, interval_s=0.3) as agent:
            wait_until(lambda: value(samples(agent.metrics()), "outrider_train_steps_total", rank="") == 25,
                       timeout_s=30, what="the first agent's view")
            agent.stop(signal.SIGKILL)
        with AgentProcess(env=agent_env, interval_s=0.3) as agent:
            wait_until(lambda: value(samples(agent.metrics()), "outrider_train_steps_total", rank="") == 25,
                       timeout_s=30, what="the restarted agent's view: the same 25, not 50")
        hold.write_text("x")
        assert p.wait(timeout=30) == 0
    finally:
        stop(p)


def test_a_process_killed_mid_run_is_counted_once_and_cleaned_up(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    agent_env = {"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2"}
    with AgentProcess(env=agent_env, interval_s=0.3) as agent:
        p = start(spool, "--steps", "1000", "--step-sleep", "0.01")
        try:
            wait_until(lambda: (value(samples(agent.metrics()), "outrider_train_steps_total", rank="") or 0) > 20,
                       timeout_s=30, what="steps flowing")
            p.send_signal(signal.SIGKILL)
            p.wait()
        finally:
            stop(p)

        def retired() -> float | None:
            parsed = samples(agent.metrics())
            if value(parsed, "outrider_hook_processes", state="running") == 0 and not list(spool.glob("*.shard")):
                return value(parsed, "outrider_train_steps_total", rank="")
            return None
        steps = wait_until(retired, timeout_s=30, what="the killed process retired")
        assert 20 < steps < 1000
        again = value(samples(agent.metrics()), "outrider_train_steps_total", rank="")
        assert again == steps, "its last published count stays, once"


def test_a_hung_training_loop_is_reported_with_its_stack(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    agent_env = {"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2"}
    with AgentProcess(env=agent_env, interval_s=0.3) as agent:
        p = start(spool, "--steps", "100", "--hang-after", "10", OUTRIDER_STALL_FLOOR_S="1")
        try:
            wait_until(lambda: value(samples(agent.metrics()), "outrider_hook_stalled", rank="") == 1,
                       timeout_s=30, what="the stall")
            stacks = list(spool.glob("*.stacks.txt"))
            assert len(stacks) == 1
            # The hung thread's innermost Python frame is the line it hangs on: workload.main's sleep.
            hang = next(n for n, line in enumerate(Path(WORKLOAD).read_text().splitlines(), 1)
                        if "time.sleep(args.hang_seconds)" in line)
            text = stacks[0].read_text()
            assert re.search(rf'^(Current )?Thread 0x[0-9a-f]+ \(most recent call first\):\n'
                             rf'  File "{re.escape(WORKLOAD)}", line {hang} in main$', text, re.MULTILINE), text
            assert value(samples(agent.metrics()), "outrider_hook_processes", state="stalled") == 1
        finally:
            stop(p)


def test_torch_training_loop_steps_counted_by_the_optimizer_hook(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    with AgentProcess(env={"OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2"},
                      interval_s=0.3) as agent:
        p = start(spool, "--torch", "--steps", "40")
        try:
            assert p.wait(timeout=120) == 0
        finally:
            stop(p)

        def counted() -> bool:
            parsed = samples(agent.metrics())
            return value(parsed, "outrider_train_steps_total", rank="") == 40
        wait_until(counted, timeout_s=30, what="40 optimizer steps")
        parsed = samples(agent.metrics())
        assert value(parsed, "outrider_samples_total", rank="") == 40 * 8
        assert value(parsed, "outrider_train_step_duration_seconds_count", rank="") == 39, "between step ends"
        assert value(parsed, "outrider_train_data_wait_seconds_count", rank="") == 40


def test_outrider_run_collects_its_commands_hook_metrics(tmp_path: Path) -> None:
    port = free_port()
    hold = tmp_path / "hold"
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    run = subprocess.Popen([sys.executable, "-m", "outrider", "run", "--listen", f"127.0.0.1:{port}", "--interval",
                            "0.3", "--quiet", "--", sys.executable, WORKLOAD, "--steps", "15", "--hold", str(hold)],
                           env={**base, "OUTRIDER_FLUSH_INTERVAL_S": "0.2"}, start_new_session=True)
    try:
        wait_until(lambda: value(samples(http_get(f"http://127.0.0.1:{port}/metrics")[2].decode()),
                                 "outrider_train_steps_total", rank="") == 15, timeout_s=30,
                   what="the wrapped command's steps on run's /metrics")
        hold.write_text("x")
        assert run.wait(timeout=30) == 0
    finally:
        hold.touch()  # the wrapped workload ends too, wherever `outrider run` put it
        stop(run)
