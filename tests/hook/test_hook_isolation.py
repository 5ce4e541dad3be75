"""The hook's independence: a training process that uses the hook imports nothing of the agent side and no
third-party package, whatever agent settings its environment carries (a pod sharing one env between containers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from outrider.shared import spool

SCRIPT = """
import json, sys
before = set(sys.modules)
import outrider
from outrider.hook import api
assert outrider.instrument()
for batch in outrider.dataloader(range(5)):
    with outrider.step(samples=1):
        pass
with outrider.phase("checkpoint"):
    pass
outrider.histogram("custom_seconds", {"k": "v"}).observe(0.1)
outrider.record_request(0.01, "/r", 200)
api.S.hook.flush()
outrider.shutdown()
print(json.dumps(sorted(set(sys.modules) - before)))
"""

HOOK_SIDE = ("outrider.hook", "outrider.shared", "outrider.kernel")  # + outrider


def _hook_side(module: str) -> bool:
    return module == "outrider" or any(module == p or module.startswith(p + ".") for p in HOOK_SIDE)


def test_a_hooked_process_with_agent_settings_imports_no_agent_module_and_no_third_party(tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    env.update({
        "OUTRIDER_SPOOL_DIR": str(sp), "OUTRIDER_STANDALONE": "false",
        # agent-only settings, as a pod's shared environment has them: the hook ignores them
        "OUTRIDER_COLLECTORS": "host,gpu", "OUTRIDER_INTERVAL_S": "2", "OUTRIDER_RULE_FILES": "/nonexistent.yaml",
        "OUTRIDER_RECEIVERS_FILE": "/nonexistent-receivers.yaml", "OUTRIDER_OTLP_ENDPOINT": "http://127.0.0.1:1",
        "OUTRIDER_NOT_A_KEY": "x",
    })
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", "no configuration error, no warning: agent keys are the agent's to validate"
    loaded = json.loads(r.stdout)
    ours = [m for m in loaded if m == "outrider" or m.startswith("outrider.")]
    assert ours and all(_hook_side(m) for m in ours), [m for m in ours if not _hook_side(m)]
    foreign = sorted({m.split(".")[0] for m in loaded} - set(sys.stdlib_module_names) - {"outrider"})
    assert foreign == [], f"third-party modules imported by the hook: {foreign}"
    snap = spool.decode(next(sp.glob("*.shard")).read_bytes())
    assert snap.header.steps == 5 and snap.header.flags & spool.FLAG_CLOSED


def test_one_bad_hook_setting_keeps_its_default_and_never_drops_the_others() -> None:
    from outrider.hook.settings import HookSettings, read

    settings, problems = read({"OUTRIDER_FLUSH_INTERVAL_S": "1e308", "OUTRIDER_STALL_FACTOR": "3",
                               "OUTRIDER_STANDALONE": "maybe", "OUTRIDER_COLLECTORS": "gpu",
                               "TORCHELASTIC_RUN_ID": "job-7"})
    assert settings.flush_interval_s == HookSettings.flush_interval_s and settings.stall_factor == 3.0
    assert settings.standalone is True and settings.training_job == "job-7"
    assert len(problems) == 2 and "OUTRIDER_FLUSH_INTERVAL_S" in problems[0] and "from 0.05 to 3600" in problems[0]
