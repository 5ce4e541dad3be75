"""The run verdict's arithmetic and text, value by value: the tie between classes, zero-length and sub-second
windows, the rounding of the evidence, the counted shares' edges, the record's round trip, and each headline and
timeline form written out whole (a report prints these; a user reads them)."""

from __future__ import annotations

from outrider.diagnosis.bottleneck import CLASSES, NOT_JUDGED
from outrider.runs.verdict import RunVerdict, Segment, VerdictTally, from_timeline, timeline_text

NOT_A_RULE = {"cpus": 4.0}  # evidence no rule classifies: the window's own reason is kept


def test_equal_time_goes_to_the_class_listed_first_whatever_the_order_they_came_in() -> None:
    later, earlier = CLASSES.index("host_bound"), CLASSES.index("input_bound")
    assert earlier < later
    tally = VerdictTally()
    tally.add("host_bound", "h", NOT_A_RULE, 0.0, 10.0)
    tally.add("input_bound", "i", NOT_A_RULE, 10.0, 20.0)
    assert tally.result().cls == "input_bound"
    tally = VerdictTally()
    tally.add("input_bound", "i", NOT_A_RULE, 0.0, 10.0)
    tally.add("host_bound", "h", NOT_A_RULE, 10.0, 20.0)
    assert tally.result().cls == "input_bound"


def test_a_class_no_rule_lists_still_ties_and_loses_to_a_listed_one() -> None:
    """A record written by a newer agent may hold a class this one does not know: it ranks after all of them."""
    tally = VerdictTally()
    tally.add("a_class_from_a_newer_agent", "new", NOT_A_RULE, 0.0, 10.0)
    tally.add("balanced", "b", NOT_A_RULE, 10.0, 20.0)
    assert tally.result().cls == "balanced"
    tally = VerdictTally()
    tally.add("a_class_from_a_newer_agent", "new", NOT_A_RULE, 0.0, 10.0)
    assert tally.result().cls == "a_class_from_a_newer_agent"


def test_idle_and_unjudged_time_never_win_however_long() -> None:
    tally = VerdictTally()
    tally.add("idle", "", {}, 0.0, 500.0)
    tally.add(NOT_JUDGED, "", {}, 500.0, 900.0)
    tally.add("balanced", "b", NOT_A_RULE, 900.0, 901.0)
    assert tally.result().cls == "balanced"


def test_a_run_with_windows_not_judged_beside_idle_ones_is_not_idle() -> None:
    """A window is not judged only once the job has worked (its first steps, a window without the measurements its
    rule needs) or while it uses CPU: idle would say otherwise."""
    tally = VerdictTally()
    tally.add("idle", "", {}, 0.0, 500.0)
    tally.add(NOT_JUDGED, "the first steps", {}, 500.0, 501.0)
    assert tally.result() == RunVerdict("", "", {}, {"idle": 500.0, NOT_JUDGED: 1.0})
    assert tally.result().headline().startswith("none: not judged (1 s without")


def test_a_zero_length_window_does_not_make_its_class_active() -> None:
    tally = VerdictTally()
    tally.add("idle", "", {}, 0.0, 10.0)
    tally.add("input_bound", "i", NOT_A_RULE, 10.0, 10.0)
    v = tally.result()
    assert v.cls == "idle" and v.seconds == {"idle": 10.0, "input_bound": 0.0}


def test_windows_shorter_than_a_second_count_their_own_time() -> None:
    tally = VerdictTally()
    for i in range(4):
        tally.add("balanced", "b", NOT_A_RULE, i * 0.25, (i + 1) * 0.25)
    tally.add("host_bound", "h", NOT_A_RULE, 1.0, 1.5)
    v = tally.result()
    assert v.seconds == {"balanced": 1.0, "host_bound": 0.5}
    assert v.cls == "balanced" and v.share == 1.0 / 1.5
    assert [(s.start, s.end, s.cls) for s in tally.segments] == [(0.0, 1.0, "balanced"), (1.0, 1.5, "host_bound")]


def test_a_run_without_a_verdict_is_empty_but_keeps_its_seconds() -> None:
    assert VerdictTally().result() == RunVerdict("", "", {}, {})
    tally = VerdictTally()
    tally.add(NOT_JUDGED, "no threads", {"cpus": 1.0}, 0.0, 7.0)
    assert tally.result() == RunVerdict("", "", {}, {NOT_JUDGED: 7.0})


def test_evidence_is_rounded_to_four_places_and_a_key_seen_only_in_a_zero_length_window_stays() -> None:
    tally = VerdictTally()
    tally.add("balanced", "b", {"cpus": 1.0, "only_at_an_instant": 5.0}, 0.0, 0.0)
    tally.add("balanced", "b", {"cpus": 2.0}, 0.0, 1.0)
    tally.add("balanced", "b", {"cpus": 1.0}, 1.0, 3.0)
    assert tally.result().evidence == {"cpus": round(4 / 3, 4), "only_at_an_instant": 0.0}
    assert tally.result().evidence["cpus"] == 1.3333


def test_the_counted_data_wait_from_any_loop_time_above_zero_and_zero_without_its_part() -> None:
    tally = VerdictTally()
    tally.add("balanced", "b", {"data_wait_fraction": 0.9}, 0.0, 1.0,
              counted={"data_wait_seconds_total": 0.1, "loop_seconds_total": 0.3})
    assert tally.result().evidence["data_wait_fraction"] == 0.3333
    tally = VerdictTally()
    tally.add("balanced", "b", {"data_wait_fraction": 0.9}, 0.0, 1.0, counted={"loop_seconds_total": 0.5})
    assert tally.result().evidence["data_wait_fraction"] == 0.0
    tally = VerdictTally()
    tally.add("balanced", "b", {"data_wait_fraction": 0.9}, 0.0, 1.0, counted={"loop_seconds_total": 0.0})
    assert tally.result().evidence["data_wait_fraction"] == 0.9  # no loop time counted: the windows' mean


def test_a_timeline_keeps_each_changes_reason() -> None:
    tally = from_timeline([(0.0, "balanced", "balanced, as said then", NOT_A_RULE)], 10.0)
    assert tally.result().reason == "balanced, as said then"


def test_a_verdict_read_back_from_its_record_is_the_same_and_a_bare_one_is_empty() -> None:
    v = RunVerdict("input_bound", "waits", {"data_wait_fraction": 0.5}, {"input_bound": 30.0, "idle": 2.0})
    assert RunVerdict.from_json(v.to_json()) == v
    assert RunVerdict.from_json({}) == RunVerdict("", "", {}, {})
    assert RunVerdict.from_json({"cls": "idle", "seconds": {"idle": 3}}) == RunVerdict("idle", "", {}, {"idle": 3.0})


def test_each_headline_written_out() -> None:
    assert RunVerdict("", "", {}, {}).headline() == "none: the run ended before the agent had two sweeps to compare"
    assert RunVerdict("", "", {}, {NOT_JUDGED: 12.0}).headline() == (
        "none: not judged (12 s without the measurements the rules need: per-thread CPU, operations or steps)")
    assert RunVerdict("idle", "", {}, {}).headline() == "idle: no steps, requests or CPU use in 0 s"
    assert RunVerdict("", "the job worked unseen", {}, {"idle": 9.0}).headline() == "none: the job worked unseen"
    assert RunVerdict("idle", "", {}, {"idle": 9.0}).headline().startswith("idle: no steps, requests or CPU use in 9 s")
    # the others largest first, one that never held left out, one under a second kept; idle and unjudged aside
    assert RunVerdict("input_bound", "r", {}, {"input_bound": 30.0, "balanced": 0.5, "host_bound": 2.0,
                                               "compute_bound": 0.0, "idle": 3.0, NOT_JUDGED: 4.0}).headline() == (
        "input_bound, 92% of the 32.5 s the job was active (host_bound 6.2%, balanced 1.5%; idle 3 s; not judged 4 s)")
    assert RunVerdict("input_bound", "r", {}, {"input_bound": 30.0, "compute_bound": 0.0}).headline() == (
        "input_bound, 100% of the 30 s the job was active")
    assert RunVerdict("input_bound", "r", {}, {"input_bound": 30.0, NOT_JUDGED: 4.0}).headline() == (
        "input_bound, 100% of the 30 s the job was active (not judged 4 s)")


def test_where_the_loop_thread_is_reads_largest_first_in_one_row() -> None:
    v = RunVerdict("input_bound", "r", {"in_step_fraction": 0.3, "in_data_fraction": 0.6, "in_other_fraction": 0.0},
                   {"input_bound": 30.0})
    assert v.evidence_rows() == [("where the loop thread is (samples)", "data 60%, step 30%")]


def _segments(lengths: list[float]) -> list[Segment]:
    out, t = [], 100.0
    for i, n in enumerate(lengths):
        out.append(Segment(t, t + n, CLASSES[i % len(CLASSES)]))
        t += n
    return out


def test_a_timeline_of_six_is_shown_whole_and_one_of_more_by_its_six_longest_in_time_order() -> None:
    six = _segments([5, 1, 2, 3, 4, 6])
    assert timeline_text(six, 100.0) == ("0:00-0:05 idle · 0:05-0:06 throttled · 0:06-0:08 memory_pressure · "
                                         "0:08-0:11 checkpoint_bound · 0:11-0:15 input_bound · "
                                         "0:15-0:21 memory_bandwidth_bound")
    eight = _segments([5, 1, 2, 30, 4, 6, 7, 8])  # the 1 s and the 2 s segments are the shortest
    assert timeline_text(eight, 100.0) == ("0:00-0:05 idle · 0:08-0:38 checkpoint_bound · 0:38-0:42 input_bound · "
                                           "0:42-0:48 memory_bandwidth_bound · 0:48-0:55 compute_bound · "
                                           "0:55-1:03 host_bound (and 2 shorter)")
    seven = _segments([5, 1, 2, 3, 4, 6, 7])
    assert timeline_text(seven, 100.0).endswith(" (and 1 shorter)")
    assert timeline_text(seven, 100.0, most=7).count(" · ") == 6
