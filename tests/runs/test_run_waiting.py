"""What a run says of hooked processes that never stepped, and of checkpoints: the recorder keeps the ranks that
waited for a first step and stalled (their gauges leave the final sweep with them), the summary's measured rows say
so instead of "no process called instrument()", the verdict is hung_before_first_step; old records still load."""

from __future__ import annotations

import time

from outrider.metrics.family import Family, HistogramValue
from outrider.runs.measured import Measured, Training, Waiting, measure
from outrider.runs.recorder import RunRecorder
from outrider.runs.verdict import HUNG


def sweep(pending: float, stalled: float, steps: float = 0.0, started: float | None = None) -> list[Family]:
    """One sweep of a hooked rank 0 (label order: the catalog's, rank then training_job)."""
    fams = [Family("outrider_hook_processes").add(1.0, "stalled" if stalled else "running"),
            Family("outrider_train_first_step_pending").add(pending, "0", ""),
            Family("outrider_hook_stalled").add(stalled, "0", ""),
            Family("outrider_train_start_timestamp_seconds").add(started or time.time() - 40.0, "0", "")]
    if steps:
        fams.append(Family("outrider_train_steps_total").add(steps, "0", ""))
    return fams


def test_a_rank_that_stalled_waiting_for_its_first_step_makes_the_run_hung() -> None:
    rec = RunRecorder(None, "run")
    rec(sweep(pending=1.0, stalled=0.0))
    rec(sweep(pending=1.0, stalled=1.0))
    rec([Family("outrider_hook_processes").add(0.0, "running")])  # the final sweep: the process and its gauges gone
    waiting = rec.waiting()
    assert waiting is not None and waiting.ranks == ["0"] and waiting.stalled == ["0"]
    assert waiting.longest_s >= 40.0, "from the rank's start time to the sweep"
    verdict = rec.verdict()
    assert verdict.cls == HUNG and verdict.headline().startswith("hung before its first step: rank 0 completed no")
    assert "stacks" in verdict.reason and verdict.recommendation
    rows = measure([], waiting, rec.hooked).rows()
    assert rows[0][0] == "training" and "rank 0 waited" in rows[0][1] and "hung before its first step" in rows[0][1]
    assert not any("instrument()" in text and "no process" in text for _, text in rows)


def test_a_slow_start_that_then_steps_is_not_hung() -> None:
    rec = RunRecorder(None, "run")
    rec(sweep(pending=1.0, stalled=1.0))
    rec(sweep(pending=0.0, stalled=0.0, steps=5.0))
    assert rec.waiting() is None and rec.verdict().cls != HUNG


def test_a_rank_waiting_without_a_stall_is_said_but_not_called_hung() -> None:
    rec = RunRecorder(None, "run")
    rec(sweep(pending=1.0, stalled=0.0))
    waiting = rec.waiting()
    assert waiting is not None and waiting.stalled == []
    assert rec.verdict().cls != HUNG
    assert "stalled" not in Measured(waiting=waiting).rows()[0][1]


def test_hooked_but_nothing_recorded_is_not_no_process_called_instrument() -> None:
    assert "recorded neither" in Measured(hooked=True).rows()[0][1]
    assert "no process of the command called" in Measured().rows()[0][1]


def test_checkpoints_in_the_measured_rows() -> None:
    bounds = (0.1, 1.0, 10.0, 100.0)
    step = HistogramValue(bounds, (10, 0, 0, 0, 0), 0.5)  # counts per bucket, +Inf last
    saves = HistogramValue(bounds, (0, 0, 2, 1, 0), 24.0)
    fams = [Family("outrider_train_step_duration_seconds").add(step, "0", ""),
            Family("outrider_train_checkpoint_duration_seconds").add(saves, "0", "")]
    training = measure(fams).training
    assert training is not None and training.checkpoints == 3 and training.checkpoint_s == 24.0
    assert any(text.startswith("3 checkpoints, p50 ") and text.endswith(" in all") for _, text in training.rows())


def test_records_written_before_these_fields_still_load() -> None:
    old = {"training": {"processes": 1, "steps": 3.0, "samples": 0.0, "step_p50_s": 0.1, "step_p99_s": 0.2,
                        "samples_per_s": None, "first_step_s": 1.0, "data_wait_p50_s": None,
                        "data_wait_fraction": None}, "inference": None}
    loaded = Measured.from_json(old)
    assert isinstance(loaded.training, Training) and loaded.training.checkpoints == 0.0
    assert loaded.waiting is None and loaded.hooked is False
    new = Measured(waiting=Waiting(["0"], ["0"], 12.0), hooked=True)
    assert Measured.from_json(new.to_json()) == new


def test_a_run_that_stepped_or_served_between_sweeps_is_never_called_idle() -> None:
    """Every window idle (its work fell between two sweeps: its counters never moved inside one) while the summary
    counts steps or requests: no verdict, saying why, never "idle: no steps, requests or CPU use" above them."""
    from outrider.ground.clock import ManualClock
    from outrider.runs.recorder import WORKED_UNSEEN

    def still(name: str, labels: tuple[str, ...]) -> list[Family]:  # a counter already at 12 when watching began
        return [Family(name).add(12.0, *labels), Family("outrider_watched_cpu_seconds_total").add(0.1, "user")]

    for name, labels in (("outrider_train_steps_total", ("0", "")),
                         ("outrider_requests_total", ("/", "GET", "http", "200", "2xx", "0", ""))):
        clock = ManualClock()
        rec = RunRecorder(None, "run", window_s=4.0, clock=clock.clock())
        for _ in range(5):
            rec(still(name, labels))
            clock.now += 1.0
        verdict = rec.verdict()
        assert (verdict.cls, verdict.reason) == ("", WORKED_UNSEEN), verdict
        assert verdict.headline() == f"none: {WORKED_UNSEEN}" and verdict.seconds == {"idle": 4.0}
    clock = ManualClock()
    idle = RunRecorder(None, "run", window_s=4.0, clock=clock.clock())
    idle([Family("outrider_watched_cpu_seconds_total").add(0.1, "user")])
    clock.now += 1.0
    idle([Family("outrider_watched_cpu_seconds_total").add(0.1, "user")])
    assert idle.verdict().cls == "idle", "a run that did neither is idle"
