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

# alert -> onset (minutes) in its first must-fire scenario (files in name order): the first minute its series show the
# fault. Some rules wait by design, and their detection time says so: TrainingNoProgress (30 minutes without a
# step), TrainingFirstStepMissing (30 minutes after start), GPURowRemapPending (30 minutes), the regressions against
# a baseline (an hour of history before a baseline exists; their faults start at 2h, after it), the disk and inode
# predictions (an hour of history, then their `for`). For DiskFillingUp the onset is when the disk comes within 4
# hours of full (the rule's horizon). The alerts of the memory group (the fast memory rules, the OOM kills) are
# tested on 15-second steps in memory.test.yaml, whose comments derive their firing times: this minute-step search
# leaves them out.
ONSETS = {
    # baselines.test.yaml
    "InferenceLatencyP99Regression": 120, "StepTimeRegression": 120, "ThroughputDrop": 120,
    "RequestThroughputDrop": 120, "InferenceTrafficStopped": 120,
    # degradation.test.yaml
    "LatencySLOBurnRateFast": 60, "LatencySLOBurnRateSlow": 60, "TimeToFirstTokenSLOBurnRateFast": 60,
    "TimeToFirstTokenSLOBurnRateSlow": 60, "InterTokenLatencySLOBurnRateFast": 60,
    "InterTokenLatencySLOBurnRateSlow": 60, "ErrorRateSpike": 11, "TrainingStalled": 10, "TrainingNoProgress": 10,
    "TrainingFirstStepMissing": 0, "InputPipelineBound": 0, "StragglerRank": 0,
    # exhaustion.test.yaml
    "GPUMemoryNearlyFull": 5, "GPUOOMPredicted": 41, "GPUAllocatorRetries": 11, "GPUOutOfMemoryErrors": 11,
    "HostMemoryNearlyFull": 5, "ContainerMemoryNearLimit": 5, "DiskFillingUp": 360,
    "DiskFillingUpWithin24h": 0, "DiskNearlyFull": 0, "DiskInodesNearlyExhausted": 0, "DiskInodesFillingUp": 0,
    "DiskRemountedReadOnly": 20, "CPUSaturated": 0, "HostPressureStall": 0,
    # hardware.test.yaml
    "GPUThermalThrottling": 5, "GPUPowerBrakeOrHardwareSlowdown": 5, "GPUXidCritical": 20, "GPUXidApplication": 20,
    "GPUXidUnclassified": 20, "GPUUncorrectableECC": 6, "GPURowRemapFailure": 6, "GPURowRemapPending": 0,
    "GPULost": 6, "GPUCountDropped": 10, "NVMLUnavailable": 20, "GPUCollectorHung": 20, "GPUPCIeReplays": 0,
    "GPUNVLinkErrors": 0, "GPUNVLinkRecovery": 10, "GPUMemoryTemperatureHigh": 5, "GPUIdleWhileJobAlive": 10,
    "NetworkInterfaceErrors": 0, "NetworkInterfaceDrops": 0,
    # meta.test.yaml
    "OutriderAgentDown": 6, "WatchedTargetAbsent": 6, "OutriderCollectorFailing": 0, "Watchdog": 0,
    "OutriderTargetMissing": 21, "OutriderNotificationsDropped": 15, "OutriderNotificationsDelayed": 10,
    "OutriderRuleEvaluationFailures": 15, "OutriderHookDrops": 15, "AlertmanagerNotificationsFailing": 11,
}


def quiet_at(promtool: str, spec: dict, case: dict, alert: str, minute: int, workdir: Path) -> bool:  # type: ignore[type-arg]
    """True if promtool agrees the alert is not firing at `minute` in this scenario (evaluated as its file says)."""
    probe = copy.deepcopy(case)
    probe["alert_rule_test"] = [{"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": []}]
    test = workdir / "probe.test.yaml"
    test.write_text(yaml.safe_dump({"rule_files": [str(ALERTS / "outrider.rules.yaml")],
                                    "evaluation_interval": spec.get("evaluation_interval", "1m"),
                                    "group_eval_order": spec.get("group_eval_order", []), "tests": [probe]}))
    return subprocess.run([promtool, "test", "rules", str(test)], capture_output=True).returncode == 0


def first_firing(promtool: str, spec: dict, case: dict, alert: str, fired_at: int,  # type: ignore[type-arg]
                 workdir: Path) -> int:
    step = minutes(spec.get("evaluation_interval", "1m"))
    lo, hi = 0, fired_at // step  # in evaluation steps: quiet at lo (or lo == 0), firing at hi
    if not quiet_at(promtool, spec, case, alert, 0, workdir):
        return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if quiet_at(promtool, spec, case, alert, mid * step, workdir):
            lo = mid
        else:
            hi = mid
    return hi * step


def minutes(text: str) -> int:
    total, number = 0, ""
    for ch in str(text):
        if ch.isdigit():
            number += ch
        else:
            total += int(number) * {"m": 1, "h": 60}[ch]
            number = ""
    return total


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
            spec = yaml.safe_load(path.read_text())
            for case in spec["tests"]:
                for t in case.get("alert_rule_test", []):
                    if not t.get("exp_alerts"):
                        quiet_checks += 1
                        continue
                    alert = t["alertname"]
                    if alert in seen or alert not in ONSETS:
                        continue
                    seen.add(alert)
                    fired = first_firing(promtool, spec, case, alert, minutes(t["eval_time"]), work)
                    rows.append((alert, ONSETS[alert], fired))
        failed = subprocess.run([promtool, "test", "rules", *map(str, sorted((ALERTS / "tests").glob("*.yaml")))],
                                capture_output=True).returncode
    print(f"{'alert':34}{'onset':>7}{'fires':>7}{'detection':>11}")
    for alert, onset, fired in rows:
        print(f"{alert:34}{onset:>6}m{fired:>6}m{fired - onset:>10}m")
    print(f"false alarms: {'none' if failed == 0 else 'SOME: promtool test rules fails'} in {quiet_checks} "
          f"must-not-fire assertions (noise, brief spikes, low traffic, data gaps, warm-ups, restarts, finished jobs, "
          f"daily patterns, healthy neighbours)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
