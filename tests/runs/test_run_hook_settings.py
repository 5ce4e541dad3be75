"""`outrider run` hands the hook the agent's configuration of it: a config file's flush interval (and every other
hook setting the agent's Config holds) reaches the command's processes, which read it as the hook reads it. The
demo's `flush_interval_s=0.25` once stayed in the agent: the hook flushed every second while the agent swept every
half second, and the sweeps alternated between 0 and twice the step rate."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from outrider.ground.config import HANDED_TO_HOOK, Config, hook_environment
from outrider.hook import settings as hook_settings
from tests.helpers import outrider_cmd

# A value away from the hook's default for every setting the agent hands it
AWAY = {"flush_interval_s": 0.25, "hook_max_series_per_metric": 7, "stall_factor": 3.5, "stall_floor_s": 42.0,
        "first_step_timeout_s": 61.0, "phase_timeout_s": 62.0, "standalone": False, "training_job": "job-7",
        "role": "training", "spool_trusted_uids": (1234, 5678), "profile_hz": 20.0, "flops_every_s": 120.0}

READ = ("import json; from outrider.hook import settings; s, problems = settings.read(); "
        "print(json.dumps({'settings': {k: getattr(s, k) for k in settings.KEYS}, 'problems': problems, "
        "'listen': 'OUTRIDER_LISTEN' in __import__('os').environ}))")


def test_every_hook_setting_of_the_config_round_trips_through_the_environment() -> None:
    assert set(AWAY) == set(HANDED_TO_HOOK), "a hook setting the agent holds is not handed to the hook"
    config = dataclasses.replace(Config(), **AWAY)
    env = hook_environment(config, env={})
    read, problems = hook_settings.read(env)
    assert problems == []
    assert {k: getattr(read, k) for k in AWAY} == AWAY
    assert hook_environment(Config(), env={}) == {}, "defaults: nothing to hand over"
    # a variable the environment names is the configuration's value (which the environment fed), default or not
    assert hook_environment(Config(), env={"OUTRIDER_PROFILE_HZ": "50"}) == {"OUTRIDER_PROFILE_HZ": "50.0"}


def test_a_config_files_hook_settings_reach_the_commands_processes(tmp_path: Path) -> None:
    cfg = tmp_path / "outrider.yaml"
    cfg.write_text("flush_interval_s: 0.25\nstall_factor: 3.5\nprofile_hz: 20\nrole: training\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_"))}
    env = {**base, "OUTRIDER_RUNS_DIR": str(tmp_path / "runs"), "OUTRIDER_STATE_DIR": str(tmp_path / "state"),
           "OUTRIDER_FIRST_STEP_TIMEOUT_S": "61"}
    r = subprocess.run(outrider_cmd("run", "--config", str(cfg), "--listen", "127.0.0.1:0", "--interval", "0.5",
                                    "--quiet", "--", sys.executable, "-c", READ),
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["problems"] == []
    s = seen["settings"]
    assert (s["flush_interval_s"], s["stall_factor"], s["profile_hz"], s["role"]) == (0.25, 3.5, 20.0, "training")
    assert s["first_step_timeout_s"] == 61.0, "the environment's own value passes through"
    assert s["spool_dir"] and s["spool_dir"] != str(tmp_path), "the run's own spool"
    assert not seen["listen"], "the agent's listen address is its own, not a hook setting to hand over"
