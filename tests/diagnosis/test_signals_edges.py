"""The signals at their edges: each rule's threshold fed exactly (the straggler's and the starved rank's constants,
named), windows whose growth is under one unit, keys a sweep may lack (a rank with no steps, no loop or no data wait
part yet; a machine with no GPU; a host whose CPU count is unknown), frames that stopped growing or whose text starts
with a space, the evidence's rounding and the families that alone say CUDA ran or the threads waited for a CPU.
Sweeps are built as the exporter writes them (the catalog's labels, `Family`), windows as two snapshots' scalars."""

from __future__ import annotations

from outrider.diagnosis.signals import (
    SEP,
    STARVED_FED,
    STARVED_WAIT,
    STARVED_WAITED,
    STRAGGLER_RATIO,
    STRAGGLER_SHARE,
    STRAGGLER_WAITED,
    RankSignals,
    Signals,
    signals,
    snapshot,
)
from outrider.hook.profiler import frame_label
from outrider.metrics.family import Family, HistogramValue

DT = 10.0
NO_THROTTLE = {"throttle_thermal": 0.0, "throttle_power": 0.0}  # what every snapshot says of the GPUs' clocks


def rank_keys(job: str, rank: str, steps: float, step: float, wait: float, wall: float, data: float = 0.0) \
        -> dict[str, float]:
    return {f"rank{SEP}{job}{SEP}{rank}{SEP}{k}": v for k, v in
            (("steps", steps), ("step", step), ("collective_wait", wait), ("wall", wall), ("data_wait", data))}


# --- the starved rank: data wait at least STARVED_WAIT, the fed under STARVED_FED of it, waiting STARVED_WAITED ---

def starved(hungry_data: float, fed_data: float, fed_wait: float) -> Signals:
    """Three ranks of 10 steps and 10 s of loop each: rank 1 waits `hungry_data` s for data, ranks 0 and 2
    `fed_data` s, and they wait `fed_wait` s in collectives (rank 1 0.2 s)."""
    new = {**rank_keys("job", "0", 10, 4.0, fed_wait, 10.0, fed_data),
           **rank_keys("job", "1", 10, 1.0, 0.2, 10.0, hungry_data),
           **rank_keys("job", "2", 10, 4.0, fed_wait, 10.0, fed_data)}
    return signals({}, new, DT)


def test_a_rank_waiting_for_data_exactly_starved_wait_of_its_loop_is_starved() -> None:
    assert STARVED_WAIT == 0.3
    s = starved(3.0, 0.5, 3.0)  # 3 s of 10: exactly STARVED_WAIT (inclusive)
    assert s.starved is not None and s.starved.rank == "1" and s.starved_rank == 1.0
    assert s.starved_data_wait_fraction == STARVED_WAIT and s.others_wait_fraction == 3 / 10


def test_fed_ranks_waiting_for_data_exactly_starved_fed_of_its_share_leave_no_starved_rank() -> None:
    assert STARVED_FED == 0.5
    at_edge = starved(4.0, 2.0, 3.0)  # the fed wait 0.2 of their loop, exactly STARVED_FED * 0.4 (exclusive)
    assert at_edge.starved is None and at_edge.starved_rank is None and at_edge.starved_data_wait_fraction is None
    under = starved(4.0, 1.9, 3.0)  # just under it: they are fed, rank 1 is starved
    assert under.starved_rank == 1.0 and under.starved_data_wait_fraction == 4 / 10


def test_fed_ranks_waiting_in_collectives_exactly_starved_waited_of_its_share_wait_for_it() -> None:
    assert STARVED_WAITED == 0.5
    s = starved(4.0, 0.5, 2.0)  # collectives 0.2 of their loop: exactly STARVED_WAITED * 0.4 (inclusive)
    assert s.starved_rank == 1.0 and s.others_wait_fraction == 2 / 10
    assert starved(4.0, 0.5, 1.9).starved is None


# --- the straggler: compute at least STRAGGLER_RATIO times the others', by at least STRAGGLER_SHARE of its step,
# and the others wait at least STRAGGLER_WAITED of that difference more than it does ---

def straggling(other_step: float, other_wait: float, slow_step: float, slow_wall: float) -> Signals:
    """One step each: ranks 0 and 1 take `other_step` s of work, `other_wait` of it in collectives, in 4 s of loop;
    rank 2 takes `slow_step` s, none of it waiting, in `slow_wall` s."""
    new = {**rank_keys("job", "0", 1, other_step, other_wait, 4.0),
           **rank_keys("job", "1", 1, other_step, other_wait, 4.0),
           **rank_keys("job", "2", 1, slow_step, 0.0, slow_wall)}
    return signals({}, new, DT)


def test_a_rank_computing_exactly_straggler_ratio_times_the_others_is_the_straggler() -> None:
    assert STRAGGLER_RATIO == 1.5
    s = straggling(2.0, 1.0, 1.5, 4.0)  # compute 1.5 s against 1.0 (inclusive)
    assert s.straggler_compute_ratio == STRAGGLER_RATIO
    assert s.straggler is not None and s.straggler.rank == "2" and s.straggler_rank == 2.0
    under = straggling(2.0, 1.0, 1.4, 4.0)
    assert under.straggler_compute_ratio == 1.4 / 1.0 and under.straggler is None and under.straggler_rank is None


def test_a_difference_of_exactly_straggler_share_of_the_slow_ranks_step_is_a_straggler() -> None:
    assert STRAGGLER_SHARE == 0.1
    s = straggling(2.0, 1.0, 2.0, 10.0)  # 1 s more compute in a 10 s step: exactly STRAGGLER_SHARE (inclusive)
    assert s.straggler_compute_ratio == 2.0 and s.straggler_rank == 2.0
    under = straggling(2.0, 1.0, 2.0, 10.5)
    assert under.straggler_compute_ratio == 2.0 and under.straggler is None


def test_others_waiting_exactly_straggler_waited_of_the_difference_wait_for_the_straggler() -> None:
    assert STRAGGLER_WAITED == 0.5
    s = straggling(1.5, 0.5, 2.0, 4.0)  # compute 1 s against 2 s; the others wait 0.5 s a step more (inclusive)
    assert s.straggler_compute_ratio == 2.0 and s.straggler_rank == 2.0 and s.others_wait_fraction == 0.5 / 4
    under = straggling(1.375, 0.375, 2.0, 4.0)  # still 1.0 s against 2.0, the others waiting only 0.375 s more
    assert under.straggler_compute_ratio == 2.0 and under.straggler is None


# A process that nothing names a training job publishes training_job "" (hook/settings.py derive_training_job).
# The ranks are sorted, so "" is the first job put in the set of jobs, and its hash is 0 whatever PYTHONHASHSEED:
# that job is the first the straggler search looks at, the named one comes after it.

def test_a_lone_unnamed_process_leaves_the_straggler_of_the_job_after_it() -> None:
    new = {**rank_keys("", "0", 1, 2.0, 1.0, 3.0),
           **rank_keys("b", "0", 1, 2.0, 1.0, 3.0), **rank_keys("b", "1", 1, 2.0, 0.0, 3.0)}
    s = signals({}, new, DT)
    assert [(r.training_job, r.rank) for r in s.ranks] == [("", "0"), ("b", "0"), ("b", "1")]
    assert s.straggler == RankSignals("b", "1", 1.0, 2.0, 0.0, 3.0, 0.0, 0.0) and s.straggler_rank == 1.0
    assert s.straggler_compute_ratio == 2.0 / 1.0 and s.others_wait_fraction == 1 / 3


def test_a_job_whose_ranks_do_no_compute_leaves_the_straggler_of_the_job_after_it() -> None:
    new = {**rank_keys("", "0", 1, 1.0, 1.0, 3.0), **rank_keys("", "1", 1, 0.5, 0.5, 3.0),  # all waiting
           **rank_keys("b", "0", 1, 2.0, 1.0, 3.0), **rank_keys("b", "1", 1, 2.0, 0.0, 3.0)}
    s = signals({}, new, DT)
    assert s.straggler_rank == 1.0 and s.straggler is not None and s.straggler.training_job == "b"
    assert s.straggler_compute_ratio == 2.0 and s.others_wait_fraction == 1 / 3


def test_at_equal_ratios_the_evidence_stays_with_the_job_that_set_it() -> None:
    # both jobs: one rank computes twice what the other does; the unnamed job comes first and keeps the evidence
    new = {**rank_keys("", "0", 1, 2.0, 1.0, 4.0), **rank_keys("", "1", 1, 2.0, 0.0, 4.0),
           **rank_keys("b", "0", 1, 2.0, 1.0, 5.0), **rank_keys("b", "1", 1, 2.0, 0.0, 5.0)}
    s = signals({}, new, DT)
    assert s.straggler_compute_ratio == 2.0 and s.others_wait_fraction == 1 / 4
    assert s.straggler == RankSignals("", "1", 1.0, 2.0, 0.0, 4.0, 0.0, 0.0)


# --- each rank's numbers where a key is missing or did not grow ---

def test_a_key_of_too_few_fields_before_the_ranks_leaves_them_read() -> None:
    new = {f"rank{SEP}bad": 1.0, **rank_keys("job", "0", 2, 1.0, 0.5, 2.0)}
    assert signals({}, new, DT).ranks == [RankSignals("job", "0", 2.0, 0.25, 0.25, 1.0, 0.25, 0.0)]


def test_a_rank_whose_loop_did_not_grow_in_the_window_is_left_out() -> None:
    old = {**rank_keys("job", "0", 0, 0.0, 0.0, 5.0), **rank_keys("job", "1", 0, 0.0, 0.0, 0.0)}
    new = {**rank_keys("job", "0", 2, 1.0, 0.5, 5.0), **rank_keys("job", "1", 2, 1.0, 0.5, 2.0)}
    assert signals(old, new, DT).ranks == [RankSignals("job", "1", 2.0, 0.25, 0.25, 1.0, 0.25, 0.0)]


def test_ranks_read_from_a_sweep_missing_their_steps_their_loop_or_its_data_wait_part() -> None:
    """Rank 0 reports no data wait part yet (its loop never waited), rank 1 no step histogram, rank 2 no loop: only
    rank 0 is a rank of the window, with no data wait."""
    def hist(count: int, total: float) -> HistogramValue:
        return HistogramValue((1.0,), (count, 0), total)

    families = [
        Family("outrider_train_step_duration_seconds").add(hist(4, 2.0), "0", "j").add(hist(4, 2.0), "2", "j"),
        Family("outrider_train_loop_seconds_total").add(2.0, "0", "j", "step").add(0.5, "0", "j", "other")
        .add(1.0, "1", "j", "data_wait").add(2.0, "1", "j", "step"),
        Family("outrider_train_collective_wait_seconds_total").add(0.5, "0", "j").add(0.5, "1", "j")
        .add(0.5, "2", "j"),
    ]
    s = signals({}, snapshot(families), DT)
    assert s.ranks == [RankSignals("j", "0", 4.0, (2.0 - 0.5) / 4, 0.5 / 4, 2.5 / 4, 0.5 / 2.5, 0.0)]


# --- windows whose growth is under one unit, keys a window may lack ---

def test_a_loop_shorter_than_a_second_in_the_window_is_still_decomposed() -> None:
    old = {"loop_wall": 0.0, "loop_data_wait": 0.0, "loop_step": 0.0, "step_sum": 0.0, "wait_sum": 0.0}
    new = {"loop_wall": 0.5, "loop_data_wait": 0.125, "loop_step": 0.375, "step_sum": 0.375, "wait_sum": 0.25}
    s = signals(old, new, DT)
    assert (s.data_wait_fraction, s.step_fraction, s.other_fraction) == (0.125 / 0.5, 0.375 / 0.5, 0.0)


def test_without_a_loop_steps_shorter_than_a_second_in_all_still_give_the_data_wait() -> None:
    s = signals({"step_sum": 0.0, "wait_sum": 0.0}, {"step_sum": 0.5, "wait_sum": 0.25}, DT)
    assert s.data_wait_fraction == 0.25 / (0.5 + 0.25) and s.step_fraction is None


def test_a_gpu_observed_for_under_a_second_has_its_busy_share() -> None:
    s = signals({"gpu_busy": 0.0, "gpu_observed": 0.0}, {"gpu_busy": 0.125, "gpu_observed": 0.5}, DT)
    assert s.gpu_busy_ratio == 0.125 / 0.5


def test_storage_reads_need_the_counter_at_both_ends_of_the_window() -> None:
    assert signals({}, {"tree_io_read": 5.0}, DT).storage_read_bytes_per_s is None
    assert signals({"tree_io_read": 5.0}, {}, DT).storage_read_bytes_per_s is None
    assert signals({"tree_io_read": 5.0}, {"tree_io_read": 25.0}, DT).storage_read_bytes_per_s == 20.0 / DT


def test_a_window_without_host_cpus_or_gpus_reads_one_cpu_and_no_gpu() -> None:
    s = signals({}, {}, DT)
    assert (s.cpus, s.gpus) == (1.0, 0) and type(s.gpus) is int
    assert s == Signals(window_s=DT)


def test_a_loop_that_did_not_grow_has_no_data_wait_alone_whatever_the_main_thread_spent() -> None:
    old = {"cpu_main": 0.0, "loop_wall": 5.0, "loop_data_wait": 1.0, "delay_main": 0.0}
    new = {"cpu_main": 2.0, "loop_wall": 5.0, "loop_data_wait": 1.0, "delay_main": 0.5, "has_run_delay": 1.0}
    s = signals(old, new, DT)
    assert s.data_wait_alone_fraction is None and s.data_wait_fraction is None
    assert s.main_thread_busy == (2.0 + 0.5) / DT and s.run_delay_fraction == 0.5 / (2.0 + 0.5)


# --- the profile's frames ---

def test_frames_that_did_not_grow_in_the_window_are_not_top_frames() -> None:
    still, gone, grew = (f"frame{SEP}python{SEP}{f}" for f in ("a.py:1 f", "b.py:2 g", "c.py:3 h"))
    old = {"prof_total": 0.0, still: 5.0, gone: 9.0, grew: 1.0}
    new = {"prof_total": 20.0, "prof_python": 20.0, still: 5.0, gone: 3.0, grew: 5.0}
    assert signals(old, new, DT).top_frames == [("python", "c.py:3 h", 4 / 20)]


def test_a_frame_whose_directory_starts_with_a_space_keeps_its_text() -> None:
    frame = frame_label("/data/ my proj/train.py", 3, "step")  # the last two parts of the path, as the hook labels
    assert frame == " my proj/train.py:3 step"
    families = [Family("outrider_train_loop_samples_total").add(40, "0", "j", "python"),
                Family("outrider_train_loop_frame_samples_total").add(30, "0", "j", "python", frame)]
    old = {"prof_total": 0.0}
    s = signals(old, snapshot(families), DT)
    assert s.top_frames == [("python", frame, 30 / 40)] and s.top_frame("python") == (frame, 30 / 40)


def test_the_share_of_a_place_is_none_without_a_profile_and_zero_where_no_sample_fell() -> None:
    assert Signals(window_s=DT).share("python") is None
    s = signals({"prof_total": 0.0}, {"prof_total": 20.0, "prof_python": 15.0, "prof_waiting": 5.0}, DT)
    assert (s.share("python"), s.share("waiting"), s.share("native")) == (15 / 20, 5 / 20, 0.0)


def test_the_evidence_is_rounded_to_four_places() -> None:
    s = Signals(window_s=DT, steps_per_s=1 / 3, data_wait_fraction=2 / 3, profile={"python": 1 / 7})
    ev = s.evidence()
    assert (ev["steps_per_s"], ev["data_wait_fraction"], ev["in_python_fraction"]) == (0.3333, 0.6667, 0.1429)


# --- what the families alone say ---

def test_only_the_run_delay_family_says_the_threads_have_run_delay() -> None:
    cpu = Family("outrider_thread_cpu_seconds_total").add(6, "0", "j", "main")
    assert snapshot([cpu]) == {"cpu_main": 6.0, **NO_THROTTLE}
    delay = Family("outrider_thread_run_delay_seconds_total").add(0.5, "0", "j", "main")
    assert snapshot([cpu, delay]) == {"cpu_main": 6.0, "delay_main": 0.5, "has_run_delay": 1.0, **NO_THROTTLE}
    old, new = snapshot([Family("outrider_thread_cpu_seconds_total").add(0, "0", "j", "main")]), snapshot([cpu])
    assert signals(old, new, DT).run_delay_fraction is None, "no run delay family: no run delay measured"


def test_only_the_gpu_step_histogram_of_the_histograms_says_cuda_was_used() -> None:
    h = HistogramValue((0.1, 1.0), (1, 0, 0), 0.05)
    gpu_steps = Family("outrider_train_gpu_step_duration_seconds").add(h, "0", "j")
    assert snapshot([gpu_steps]) == {"cuda_used": 1.0, **NO_THROTTLE}
    saves = Family("outrider_train_checkpoint_duration_seconds").add(h, "0", "j")
    assert snapshot([saves]) == NO_THROTTLE
    assert signals({}, snapshot([gpu_steps, Family("outrider_torch_intra_op_threads").add(8, "0", "j")]),
                   DT).torch_cpu_only is False
