"""Detection figures of the alert rules, from the promtool unit-test scenarios (alerts/tests/*.test.yaml).

For each must-fire case it finds, with promtool, the first evaluation minute at which the alert fires, and reports
the time from the scenario's onset (the minute its series start to misbehave, listed in ONSETS) to firing. It also
counts false alarms: must-not-fire assertions that fail (there should be none; the unit tests enforce it).

    python benchmarks/alert_detection.py
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ALERTS = Path(__file__).resolve().parent.parent / "alerts"

# alert -> onset (minutes) in its first must-fire scenario: when the bad behaviour starts in the input series. For
# DiskFillingUp the onset is when the disk comes within 4 hours of full (the rule's horizon); for TrainingNoProgress
# it is the last step (the rule waits 30 minutes by design).
ONSETS = {
    "InferenceLatencyP99Regression": 90, "LatencySLOBurnRateFast": 60, "LatencySLOBurnRateSlow": 60,
    "ThroughputDrop": 100, "RequestThroughputDrop": 100, "StepTimeRegression": 100, "TrainingStalled": 9,
    "TrainingNoProgress": 0, "InputPipelineBound": 0, "StragglerRank": 0, "ErrorRateSpike": 10,
    "GPUMemoryNearlyFull": 4, "GPUOOMPredicted": 0, "GPUAllocatorRetries": 10, "GPUOutOfMemoryErrors": 10,
    "HostMemoryNearlyFull": 4, "HostOOMKills": 15, "DiskFillingUp": 360, "DiskNearlyFull": 0, "CPUSaturated": 0,
    "HostPressureStall": 0,
}


def quiet_at(promtool: str, case: dict, alert: str, minute: int, workdir: Path) -> bool:  # type: ignore[type-arg]
    """True if promtool agrees the alert is not firing at `minute` in this scenario."""
    probe = copy.deepcopy(case)
    probe["alert_rule_test"] = [{"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": []}]
    test = workdir / "probe.test.yaml"
    test.write_text(yaml.safe_dump({"rule_files": [str(ALERTS / "outrider.rules.yaml")],
                                    "evaluation_interval": "1m", "tests": [probe]}))
    return subprocess.run([promtool, "test", "rules", str(test)], capture_output=True).returncode == 0


def first_firing(promtool: str, case: dict, alert: str, fired_at: int, workdir: Path) -> int:  # type: ignore[type-arg]
    lo, hi = 0, fired_at  # quiet at lo (or lo == 0), firing at hi
    if not quiet_at(promtool, case, alert, 0, workdir):
        return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if quiet_at(promtool, case, alert, mid, workdir):
            lo = mid
        else:
            hi = mid
    return hi


def minutes(text: str) -> int:
    units = {"m": 1, "h": 60}
    return int(text[:-1]) * units[text[-1]]


def main() -> int:
    promtool = shutil.which("promtool")
    if not promtool:
        raise SystemExit("promtool not found: apt-get install prometheus")
    seen: set[str] = set()
    rows = []
    quiet_checks = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for path in sorted((ALERTS / "tests").glob("*.test.yaml")):
            for case in yaml.safe_load(path.read_text())["tests"]:
                for t in case.get("alert_rule_test", []):
                    if not t.get("exp_alerts"):
                        quiet_checks += 1
                        continue
                    alert = t["alertname"]
                    if alert in seen or alert not in ONSETS:
                        continue
                    seen.add(alert)
                    fired = first_firing(promtool, case, alert, minutes(t["eval_time"]), work)
                    rows.append((alert, ONSETS[alert], fired))
        failed = subprocess.run([promtool, "test", "rules", *map(str, sorted((ALERTS / "tests").glob("*.yaml")))],
                                capture_output=True).returncode
    print(f"{'alert':34}{'onset':>7}{'fires':>7}{'detection':>11}")
    for alert, onset, fired in rows:
        print(f"{alert:34}{onset:>6}m{fired:>6}m{fired - onset:>10}m")
    print(f"false alarms: {'none' if failed == 0 else 'SOME: promtool test rules fails'} in {quiet_checks} "
          f"must-not-fire assertions (noise, brief spikes, low traffic, data gaps, healthy neighbours)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
