"""A run's verdict: the class that held longest over the run's active windows (idle windows do not vote), its
evidence averaged over the time it held, and the record that keeps it, its timeline and its alerts."""

from __future__ import annotations

from pathlib import Path

from outrider.rules.notification import Notification
from outrider.runs.recorder import RunRecorder
from outrider.runs.report import dominant_verdict
from outrider.runs.store import RunStore
from outrider.runs.verdict import VerdictTally, from_timeline, timeline_text


def windows(tally: VerdictTally, cls: str, start: float, count: int, each_s: float, wait: float = 0.0) -> float:
    """`count` consecutive window verdicts of `cls`, `each_s` apart, from `start`; returns where they end."""
    for i in range(count):
        tally.add(cls, f"{cls} window", {"data_wait_fraction": wait, "cpus": 4.0}, start + i * each_s,
                  start + (i + 1) * each_s)
    return start + count * each_s


def test_the_class_that_held_longest_wins_not_the_last_nor_the_most_frequent() -> None:
    tally = VerdictTally()
    t = windows(tally, "idle", 0.0, 30, 1.0)  # a long start-up: idle does not vote
    t = windows(tally, "input_bound", t, 4, 10.0, wait=0.6)  # 40 s in 4 windows
    t = windows(tally, "balanced", t, 20, 1.0)  # 20 s in 20 windows
    windows(tally, "host_bound", t, 5, 1.0)  # the last windows
    v = tally.result()
    assert v.cls == "input_bound"
    assert v.seconds == {"idle": 30.0, "input_bound": 40.0, "balanced": 20.0, "host_bound": 5.0}
    assert v.active_s == 65.0 and abs(v.share - 40 / 65) < 1e-9
    assert v.headline() == "input_bound, 62% of the 1 min 5 s the job was active (balanced 31%, host_bound 7.7%; " \
                           "idle 30 s)"
    assert [s.cls for s in tally.segments] == ["idle", "input_bound", "balanced", "host_bound"]
    assert timeline_text(tally.segments, 0.0) == ("0:00-0:30 idle · 0:30-1:10 input_bound · 1:10-1:30 balanced · "
                                                  "1:30-1:35 host_bound")


def test_evidence_is_the_time_weighted_mean_over_the_verdicts_windows() -> None:
    tally = VerdictTally()
    tally.add("input_bound", "first", {"data_wait_fraction": 0.4}, 0.0, 30.0)
    tally.add("balanced", "between", {"data_wait_fraction": 0.0}, 30.0, 31.0)
    tally.add("input_bound", "latest", {"data_wait_fraction": 0.8}, 31.0, 41.0)
    v = tally.result()
    assert v.evidence["data_wait_fraction"] == round((0.4 * 30 + 0.8 * 10) / 40, 4)
    assert v.reason == "latest"
    assert v.evidence_rows() == [("data wait", "50%")]


def test_an_idle_run_is_idle_and_a_run_without_windows_has_no_verdict() -> None:
    tally = VerdictTally()
    assert tally.result().cls == "" and "ended before" in tally.result().headline()
    windows(tally, "idle", 0.0, 5, 2.0)
    v = tally.result()
    assert v.cls == "idle" and v.share == 1.0 and v.headline().startswith("idle: no steps, requests or CPU use in 10 s")


def test_zero_counts_and_flags_are_left_out_of_the_evidence_but_zero_measurements_stay() -> None:
    tally = VerdictTally()
    tally.add("host_bound", "r", {"gpus": 0.0, "alloc_retries": 0.0, "data_wait_fraction": 0.0, "cpus": 2.0}, 0, 1)
    assert tally.result().evidence_rows() == [("data wait", "0%"), ("logical CPUs", "2")]


def test_the_record_keeps_the_verdict_its_timeline_and_the_alerts(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    run_id = store.start_run(["train.py"])
    t0 = store.load(run_id).started
    tally = VerdictTally()
    windows(tally, "input_bound", t0, 3, 10.0, wait=0.5)
    windows(tally, "balanced", t0 + 30, 1, 5.0)
    store.add_verdict(run_id, t0, "input_bound", "r", {"data_wait_fraction": 0.5})
    store.add_verdict(run_id, t0 + 30, "balanced", "r", {})
    store.set_run_verdict(run_id, tally.result())
    store.alert_fired(run_id, "fp1", {"alertname": "StepTimeRegression", "severity": "warning"}, "slow", t0 + 5)
    store.alert_resolved(run_id, "fp1", {"alertname": "StepTimeRegression", "severity": "warning"}, "later", t0 + 5,
                         t0 + 12)
    # fired before this run (the agent's saved state), resolved during it: a row of its own
    store.alert_resolved(run_id, "fp2", {"alertname": "HostMemoryLow"}, "old", t0 - 100, t0 + 20)
    store.alert_fired(run_id, "fp3", {"alertname": "Stalled", "severity": "critical"}, "stuck", t0 + 25)
    store.finish_run(run_id, 0, {})
    rec = RunStore(tmp_path).load(run_id)
    assert rec.verdict is not None and rec.run_verdict().cls == "input_bound" == dominant_verdict(rec)
    assert rec.run_verdict().evidence == {"data_wait_fraction": 0.5, "cpus": 4.0}
    first = rec.timeline()[0]
    assert (first.cls, round(first.end - first.start)) == ("input_bound", 30)
    texts = [a.text(rec.started) for a in rec.alerts]
    assert texts == ["HostMemoryLow fired before the run, resolved at 0:20 after 2 min: old",
                     "StepTimeRegression (warning) fired at 0:05, resolved at 0:12 after 7 s: slow",
                     "Stalled (critical) fired at 0:25, still firing at the end: stuck"]


def test_an_older_record_without_a_kept_verdict_gets_one_from_its_timeline(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    run_id = store.start_run(["train.py"])
    t0 = store.load(run_id).started
    for t, cls in ((t0, "idle"), (t0 + 10, "compute_bound"), (t0 + 40, "host_bound"), (t0 + 45, "idle")):
        store.add_verdict(run_id, t, cls, "r", {})
    store.finish_run(run_id, 0, {})
    rec = store.load(run_id)
    assert rec.verdict is None
    v = rec.run_verdict()
    assert v.cls == "compute_bound" and round(v.seconds["compute_bound"]) == 30
    assert from_timeline(rec.verdicts, rec.end).result().cls == "compute_bound"


def notification(event: str, fp: str, starts: float, ends: float = 0.0, summary: str = "") -> Notification:
    return Notification(f"{fp}-{event}", event, {"alertname": f"Alert{fp}", "severity": "warning"},
                        {"summary": summary}, starts, ends, fp)


def test_the_recorder_keeps_every_time_an_alert_fired(tmp_path: Path) -> None:
    """An alert that fires, resolves and fires again is two entries; one restored from the agent's state that
    resolves during the run is kept too; a store that fails never raises into the rule engine."""
    store = RunStore(tmp_path)
    run_id = store.start_run(["serve.py"])
    t0 = store.load(run_id).started
    recorder = RunRecorder(store, run_id)
    recorder.on_alert(notification("firing", "1", t0 + 1, summary="slow at first"))
    recorder.on_alert(notification("resolved", "1", t0 + 1, t0 + 4, summary="recovering"))
    recorder.on_alert(notification("firing", "1", t0 + 6, summary="slow again"))
    recorder.on_alert(notification("resolved", "2", t0 - 50, t0 + 2, summary="carried over"))
    recorder.on_alert(notification("resolved", "1", t0 + 6, t0 + 9))
    expected = [("Alert1", t0 + 1, t0 + 4, "slow at first"), ("Alert2", t0 - 50, t0 + 2, "carried over"),
                ("Alert1", t0 + 6, t0 + 9, "slow again")]
    assert sorted((a.name, a.fired, a.resolved, a.summary) for a in recorder.alerts) == sorted(expected)
    assert sorted((a.name, a.fired, a.resolved, a.summary) for a in store.load(run_id).alerts) == sorted(expected)
    store.close()
    recorder.on_alert(notification("firing", "3", t0 + 10))  # the store is closed: logged, not raised
    assert recorder.alerts[-1].name == "Alert3"


def test_every_piece_of_evidence_has_a_human_name_and_unit() -> None:
    """What a window's evidence can hold (every signal of diagnosis/signals.Signals, the loop's places) is named
    for a person (runs/verdict.LABELS, runs/kpis.py) or is bookkeeping never shown: never an internal key such as
    "ops counted 0, torch cpu only 1"."""
    from dataclasses import fields

    from outrider.diagnosis.signals import WHERE, Signals
    from outrider.runs.kpis import EVIDENCE, KPIS
    from outrider.runs.verdict import HIDDEN, LABELS

    s = Signals(window_s=10.0)
    for f in fields(Signals):
        if f.name not in ("window_s", "ranks", "straggler", "starved", "profile", "top_frames", "extra"):
            setattr(s, f.name, True if str(f.type) == "bool" else 1.0)
    s.profile = dict.fromkeys(WHERE, 0.1)
    evidence = s.evidence()
    unnamed = [k for k in evidence if not (k in LABELS or k in KPIS or k in EVIDENCE or k in HIDDEN
                                            or (k.startswith("in_") and k.endswith("_fraction")))]
    assert unnamed == []
    assert VerdictTally().result().evidence_rows() == [], "an empty run: no rows"
    tally = VerdictTally()
    tally.add("host_bound", "r", evidence, 0.0, 1.0)
    shown = tally.result().evidence_rows()
    labels = [label for label, _ in shown]
    assert not any("_" in label for label in labels), labels
    assert "ops counted" not in labels and "torch cpu only" not in labels and "loop samples" not in labels
    assert dict(shown)["where the loop thread is (samples)"].startswith("python 10%")


def test_zero_rates_are_left_out_of_the_evidence() -> None:
    """A training job's evidence says nothing of requests (0 req/s), a service's nothing of steps."""
    tally = VerdictTally()
    tally.add("compute_bound", "r", {"steps_per_s": 5.0, "requests_per_s": 0.0, "samples_per_s": 0.0}, 0, 1)
    assert tally.result().evidence_rows() == [("step rate", "5 steps/s")]


def test_the_runs_data_wait_is_its_counters_over_the_time_the_verdict_held_and_the_reason_says_the_same() -> None:
    """Two input-bound windows: one with 8 s of its 10 s loop waiting for data (window share 80%), one with 1 s of
    5 s (20%, the window's share averaged in no sense). Their counters say 9 s of 15 s: 60%, which the evidence and
    the reason both show, as the summary does over the whole run; the reason's 'on its own time' figure is not a
    second data wait in the evidence."""
    tally = VerdictTally()
    for start, wait, wall in ((0.0, 8.0, 10.0), (10.0, 1.0, 5.0)):
        tally.add("input_bound", "from the window", {"data_wait_fraction": wait / wall, "steps_per_s": 3.0,
                                                     "data_wait_alone_fraction": 0.9}, start, start + 10.0,
                  counted={"data_wait_seconds_total": wait, "loop_seconds_total": wall})
    v = tally.result()
    assert v.evidence["data_wait_fraction"] == 0.6
    assert v.reason.startswith("60% of the loop waiting for data (90% of its own time"), v.reason
    assert ("data wait", "60%") in v.evidence_rows()
    assert not any("own time" in label for label, _ in v.evidence_rows())


def test_the_runs_reason_names_the_hottest_line_over_its_time_and_the_rank_it_named_last() -> None:
    """The reason of a python_bound run names its hottest line with its share over the time the class held (not the
    last window's); a straggler rank is the one its windows named, never a mean of rank numbers."""
    tally = VerdictTally()
    ev = {"steps_per_s": 5.0, "main_thread_busy": 0.9, "intra_op_busy": 0.05, "loop_samples": 500.0,
          "in_python_fraction": 0.7, "in_native_fraction": 0.3}
    tally.add("python_bound", "w1", ev, 0.0, 10.0, frames=[("python", "train.py:12 tokenize", 0.6)])
    tally.add("python_bound", "w2", ev, 10.0, 20.0, frames=[("python", "train.py:12 tokenize", 0.4),
                                                              ("python", "train.py:30 log", 0.5)])
    v = tally.result()
    assert v.reason == ("70% of the loop thread's samples in the user's Python code; the hottest line: train.py:12 "
                        "tokenize (50% of the samples)"), v.reason
    ranks = VerdictTally()
    for start, rank in ((0.0, 2.0), (10.0, 3.0)):
        ranks.add("communication_bound", "w", {"steps_per_s": 5.0, "straggler_rank": rank,
                                               "straggler_compute_ratio": 2.0, "others_wait_fraction": 0.4},
                  start, start + 10.0)
    r = ranks.result()
    assert r.evidence["straggler_rank"] == 3.0 and r.reason.startswith("rank 3 is a straggler"), r.reason
