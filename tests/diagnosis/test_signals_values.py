"""The signals' arithmetic, one worked window: every input a snapshot can hold, each a distinct number, and every
signal written out as the ratio it is (the loop's parts over its wall time, a thread role's demand per second per
process, the GPU's busy share of what was observed, each rank's compute per step). A formula changed, a counter
read as a gauge, a key mistyped or a window edge moved fails here by the signal's name."""

from __future__ import annotations

import pytest

from outrider.diagnosis.signals import (
    PROFILE_MIN_SAMPLES,
    SEP,
    TOP_FRAMES,
    RankSignals,
    Signals,
    gpu_share,
    signals,
    snapshot,
)
from outrider.metrics.family import Family, HistogramValue

DT = 10.0
OLD = {
    "step_count": 100.0, "step_sum": 20.0, "loop_wall": 50.0, "loop_data_wait": 5.0, "loop_step": 30.0,
    "loop_other": 10.0, "loop_checkpoint": 5.0, "collective_wait": 2.0, "collective": 3.0, "samples": 1000.0,
    "requests": 7.0, "process_cpu": 40.0, "tree_io_read": 1e6, "io_pressure": 1.0, "alloc_retries": 1.0,
    "gpu_busy": 10.0, "gpu_observed": 20.0, "prof_total": 100.0, "prof_python": 40.0, "prof_native": 60.0,
    "cpu_main": 30.0, "delay_main": 2.0, "cpu_intra_op": 10.0, "delay_intra_op": 1.0, "cpu_data_workers": 8.0,
    "delay_data_workers": 1.0, "cpu_other": 1.0, "delay_other": 0.5, "autograd_ops": 1e5,
    f"frame{SEP}python{SEP}train.py:10 loss": 10.0, f"frame{SEP}native{SEP}linear.py:125 forward": 50.0,
}
NEW = {
    "step_count": 150.0, "step_sum": 28.0, "loop_wall": 60.0, "loop_data_wait": 7.0, "loop_step": 36.0,
    "loop_other": 13.0, "loop_checkpoint": 9.0, "collective_wait": 3.5, "collective": 5.0, "samples": 1800.0,
    "requests": 27.0, "process_cpu": 55.0, "tree_io_read": 3e6, "io_pressure": 3.5, "alloc_retries": 3.0,
    "gpu_busy": 16.0, "gpu_observed": 28.0, "prof_total": 600.0, "prof_python": 340.0, "prof_native": 210.0,
    "prof_waiting": 50.0, "cpu_main": 36.0, "delay_main": 3.0, "cpu_intra_op": 16.0, "delay_intra_op": 3.0,
    "cpu_data_workers": 20.0, "delay_data_workers": 5.0, "cpu_other": 2.0, "delay_other": 1.0,
    "autograd_ops": 1.6e5, "main_threads": 2.0, "worker_threads": 4.0, "intra_op_threads": 8.0,
    "has_run_delay": 1.0, "cuda_used": 1.0, "gpus": 2.0, "gpu_util": 0.55, "sm_activity": 0.4,
    "tensor_activity": 0.2, "dram_activity": 0.3, "gpu_mem_ratio": 0.7, "throttle_thermal": 1.0,
    "throttle_power": 0.0, "cpus": 16.0, "host_cpu_util": 0.35, "host_mem_total": 64e9, "host_mem_avail": 16e9,
    "cgroup_mem_limit": 8e9, "cgroup_mem_working_set": 6e9,
    f"frame{SEP}python{SEP}train.py:10 loss": 310.0, f"frame{SEP}native{SEP}linear.py:125 forward": 60.0,
    f"frame{SEP}waiting{SEP}queue.py:180 get": 50.0,
}


def test_every_signal_of_a_worked_window() -> None:
    s = signals(OLD, NEW, DT)
    wall = 10.0  # the loop's wall time grew 60 - 50
    assert s.window_s == DT
    assert s.steps_per_s == 50 / DT and s.step_time_s == 8 / 50
    assert (s.data_wait_fraction, s.step_fraction, s.other_fraction, s.checkpoint_fraction) == \
        (2 / wall, 6 / wall, 3 / wall, 4 / wall)
    assert (s.collective_wait_fraction, s.collective_fraction) == (1.5 / wall, 2 / wall)
    assert (s.samples_per_s, s.requests_per_s, s.process_cpu_cores) == (800 / DT, 20 / DT, 15 / DT)
    assert s.storage_read_bytes_per_s == 2e6 / DT and s.io_pressure_fraction == 2.5 / DT
    assert (s.cpus, s.host_cpu_util, s.host_mem_available_ratio, s.container_mem_ratio) == (16.0, 0.35, 0.25, 0.75)
    # two processes' main threads: each role's demand is per process
    assert s.main_thread_cpu == 6 / DT / 2 and s.main_thread_busy == (6 + 1) / DT / 2
    assert s.intra_op_busy == (6 + 2) / DT / 2 and s.intra_op_threads == 8.0
    assert s.data_workers_cpu_cores == 12 / DT and s.data_worker_busy == (12 + 4) / DT / 4
    # the workers' run delay, in cores and each worker's share of the time; the other threads' demand per process
    assert s.data_workers_delay_cores == 4 / DT and s.data_worker_delay_fraction == 4 / DT / 4
    assert s.other_threads_busy == (1 + 0.5) / DT / 2
    # the loop's thread: busy 35%, data 20%, collectives 15%, checkpoints 40%, the GPU 75%: nothing left outside
    assert s.loop_waiting_fraction == 0.0
    assert s.ops_counted is True and s.main_cpu_us_per_op == 6 / 6e4 * 1e6 and s.ops_per_step == 6e4 / 50
    # the loop's own time: its wait, and the rest less the main thread's run delay (never under its CPU)
    assert s.data_wait_alone_fraction == 2 / (2 + max(10 - 2 - 1, 6))
    assert s.run_delay_fraction == (1 + 2 + 4 + 0.5) / (6 + 6 + 12 + 1 + 1 + 2 + 4 + 0.5)
    assert (s.torch_cpu_only, s.gpus, s.gpu_util, s.gpu_busy_ratio) == (False, 2, 0.55, 6 / 8)
    assert (s.sm_activity, s.tensor_activity, s.dram_activity, s.gpu_mem_ratio) == (0.4, 0.2, 0.3, 0.7)
    assert (s.alloc_retries, s.throttle_thermal, s.throttle_power) == (2.0, True, False)
    assert s.loop_samples == 500.0
    assert s.profile == {"python": 300 / 500, "native": 150 / 500, "waiting": 50 / 500}
    assert s.top_frames == [("python", "train.py:10 loss", 300 / 500), ("waiting", "queue.py:180 get", 50 / 500),
                            ("native", "linear.py:125 forward", 10 / 500)]
    assert (s.ranks, s.straggler, s.starved) == ([], None, None)


SERVICE_OLD = {"requests": 100.0, "request_count": 100.0, "request_sum": 20.0, "queue_sum": 1.0, "cpu_main": 1.0,
               "cpu_other": 2.0, "delay_other": 0.5, "cpu_outrider": 3.0, "process_cpu": 9.0}
SERVICE_NEW = {"requests": 500.0, "request_count": 500.0, "request_sum": 40.0, "queue_sum": 3.0, "cpu_main": 1.5,
               "cpu_other": 3.5, "delay_other": 1.0, "cpu_outrider": 9.0, "process_cpu": 19.0, "in_flight": 3.0,
               "main_threads": 1.0, "has_run_delay": 1.0}


def test_a_services_requests_split_into_queue_cpu_and_waiting() -> None:
    """400 requests in 10 s, 20 s of latency in all (50 ms each), 2 s of it queued; the job's threads (the hook's
    own left out) used 2 s of CPU and waited 0.5 s for one: 5 ms and 1.25 ms per request. One process busy 0.25
    cores: a request also waits 1/3 of that for the others' CPU, so 6.25 ms / 0.75 of the 45 ms it is handled."""
    s = signals(SERVICE_OLD, SERVICE_NEW, DT)
    assert (s.requests_per_s, s.requests_in_flight, s.request_latency_s) == (40.0, 3.0, 20 / 400)
    assert (s.request_queue_s, s.request_cpu_s, s.request_cpu_wait_s) == (2 / 400, 2 / 400, 0.5 / 400)
    assert s.demand_per_process == 2.5 / DT
    handled = 400 * (20 / 400 - 2 / 400) / DT  # 1.8 requests in their handlers at once
    assert s.request_waiting_fraction == pytest.approx(1 - 2.5 / DT / (1 - 0.25) / handled)
    no_queue = signals({k: v for k, v in SERVICE_OLD.items() if k != "queue_sum"},
                       {k: v for k, v in SERVICE_NEW.items() if k != "queue_sum"}, DT)
    assert no_queue.request_queue_s is None
    assert no_queue.request_waiting_fraction == pytest.approx(1 - 2.5 / DT / 0.75 / (400 * 0.05 / DT))
    # without per-thread CPU, the watched tree's (10 s here: more than the requests' time)
    tree = signals({k: v for k, v in SERVICE_OLD.items() if not k.startswith(("cpu_", "delay_"))},
                   {k: v for k, v in SERVICE_NEW.items() if not k.startswith(("cpu_", "delay_"))}, DT)
    assert (tree.request_cpu_s, tree.request_cpu_wait_s, tree.demand_per_process) == (10 / 400, 0.0, 1.0)
    assert tree.request_waiting_fraction == 0.0, "a process whose threads want a whole CPU: saturated"
    # a GPU's busy share of the time is not a wait outside the process
    gpu = signals({**SERVICE_OLD, "gpu_busy": 0.0, "gpu_observed": 0.0},
                  {**SERVICE_NEW, "gpu_busy": 3.0, "gpu_observed": 10.0}, DT)
    assert gpu.request_waiting_fraction == pytest.approx(s.request_waiting_fraction - 0.3)


def test_requests_in_flight_with_none_finished_are_split_by_the_gauge() -> None:
    old = {k: v for k, v in SERVICE_OLD.items()}
    new = {**old, "cpu_other": 2.5, "in_flight": 4.0, "main_threads": 1.0}
    s = signals(old, new, DT)
    assert (s.requests_per_s, s.request_latency_s, s.request_cpu_s, s.requests_in_flight) == (0.0, None, None, 4.0)
    assert s.demand_per_process == 0.5 / DT
    assert s.request_waiting_fraction == pytest.approx(1 - 0.05 / 0.95 / 4)
    assert signals(old, {**old, "in_flight": 0.0}, DT).request_waiting_fraction is None, "nothing served"
    bare = signals({"requests": 1.0}, {"requests": 2.0, "request_count": 1.0, "request_sum": 0.1}, DT)
    assert bare.requests_in_flight is None and bare.request_waiting_fraction is None, "no CPU measured: no split"


def test_the_service_split_at_its_edges() -> None:
    """One request finished, or one in flight, is a service to split; nothing finished nor in flight (no gauge at
    all) is none; the run delay counts only where the threads are measured with it; demand is per process."""
    old = {"cpu_main": 0.0, "cpu_other": 0.0, "delay_other": 0.0, "request_count": 0.0, "request_sum": 0.0}
    one = {"cpu_main": 0.0, "cpu_other": 0.05, "delay_other": 0.05, "request_count": 1.0, "request_sum": 1.0,
           "has_run_delay": 1.0}
    s = signals(old, one, DT)
    assert (s.request_latency_s, s.request_cpu_s, s.request_cpu_wait_s) == (1.0, 0.05, 0.05)
    assert s.demand_per_process == pytest.approx(0.01)
    handled = 1 * 1.0 / DT  # a tenth of a request in its handler, on average: under one
    assert s.request_waiting_fraction == pytest.approx(1 - 0.01 / 0.99 / handled)
    assert signals(old, {**one, "main_threads": 2.0}, DT).demand_per_process == pytest.approx(0.005)
    unmeasured = signals(old, {k: v for k, v in one.items() if k != "has_run_delay"}, DT)
    assert unmeasured.request_cpu_wait_s == 0.0, "no run delay measured: none counted"
    held = signals(old, {**old, "cpu_other": 0.1, "in_flight": 1.0}, DT)
    assert held.request_waiting_fraction == pytest.approx(1 - 0.01 / 0.99 / 1.0)
    nothing = signals(old, {**old, "cpu_other": 0.1}, DT)
    assert (nothing.requests_in_flight, nothing.request_waiting_fraction, nothing.demand_per_process) == \
        (None, None, None)
    # the threads counted from mid-window hold time from before it: the watched tree's CPU, and no run delay
    tree = signals({"process_cpu": 0.0, "request_count": 0.0, "request_sum": 0.0},
                   {**one, "process_cpu": 0.2, "delay_main": 9.0}, DT)
    assert (tree.request_cpu_s, tree.request_cpu_wait_s) == (0.2, 0.0)
    # every request's time queued: nothing handled, nothing waiting outside
    queued = signals({**old, "queue_sum": 0.0}, {**one, "queue_sum": 1.0}, DT)
    assert (queued.request_queue_s, queued.request_waiting_fraction) == (1.0, 0.0)
    # a process at 95% of a CPU is saturated, just under it is not
    assert serving_at(0.95).request_waiting_fraction == 0.0
    assert serving_at(0.94).request_waiting_fraction == pytest.approx(1 - 0.94 / 0.06 / 100)


def serving_at(demand: float) -> Signals:
    """100 requests of 10 s each finished in 10 s (100 handled at once), one process using `demand` cores."""
    return signals({"cpu_main": 0.0, "cpu_other": 0.0, "request_count": 0.0, "request_sum": 0.0},
                   {"cpu_main": 0.0, "cpu_other": demand * DT, "request_count": 100.0, "request_sum": 1000.0}, DT)


def test_the_gpus_share_is_of_a_gpu_the_job_uses() -> None:
    assert gpu_share(Signals(window_s=DT, gpus=0, gpu_util=0.5)) is None, "no GPU counted"
    assert gpu_share(Signals(window_s=DT, gpus=1, gpu_util=0.5)) == 0.5
    assert gpu_share(Signals(window_s=DT, gpus=1, gpu_util=0.5, torch_cpu_only=True)) is None
    assert gpu_share(Signals(window_s=DT, gpus=1, gpu_util=0.5, gpu_busy_ratio=0.2)) == 0.2


def test_the_loop_waiting_outside_is_what_its_thread_and_the_jobs_waits_leave() -> None:
    old = {"step_count": 0.0, "cpu_main": 0.0, "loop_wall": 0.0, "loop_data_wait": 0.0, "collective_wait": 0.0,
           "loop_checkpoint": 0.0}
    new = {"step_count": 20.0, "cpu_main": 1.0, "delay_main": 0.5, "loop_wall": 10.0, "loop_data_wait": 1.0,
           "collective_wait": 2.0, "loop_checkpoint": 0.5, "has_run_delay": 1.0}
    s = signals(old, new, DT)
    assert s.loop_waiting_fraction == pytest.approx(1 - 0.15 - 0.1 - 0.2 - 0.05)
    cuda = signals({**old, "gpu_busy": 0.0, "gpu_observed": 0.0}, {**new, "gpu_busy": 3.0, "gpu_observed": 10.0}, DT)
    assert cuda.loop_waiting_fraction == pytest.approx(s.loop_waiting_fraction - 0.3), "the GPU's share is the job's"
    nvml = signals(old, {**new, "gpus": 1.0, "gpu_util": 0.2}, DT)
    assert nvml.loop_waiting_fraction == pytest.approx(s.loop_waiting_fraction - 0.2)
    cpu_torch = signals(old, {**new, "gpus": 1.0, "gpu_util": 0.2, "intra_op_threads": 2.0}, DT)
    assert cpu_torch.loop_waiting_fraction == s.loop_waiting_fraction, "a GPU a CPU torch job never used"
    assert signals(old, {**new, "cpu_main": 9.0}, DT).loop_waiting_fraction == 0.0, "never below nothing"
    assert signals(old, {**new, "step_count": 0.0}, DT).loop_waiting_fraction is None, "no steps: no loop"
    assert signals(old, {**new, "step_count": 5.0}, DT).loop_waiting_fraction is not None, "a step every 2 s"
    assert signals({"step_count": 0.0}, {"step_count": 5.0}, DT).loop_waiting_fraction is None, "no threads"


def test_workers_are_busy_per_process_where_the_hook_counts_them() -> None:
    old = {"cpu_main": 0.0, "cpu_data_workers": 0.0, "delay_data_workers": 0.0}
    new = {"cpu_main": 1.0, "cpu_data_workers": 15.0, "delay_data_workers": 3.0, "worker_threads": 6.0,
           "worker_processes": 2.0}
    s = signals(old, new, DT)
    assert s.data_worker_busy == 18 / DT / 2
    assert s.data_workers_delay_cores is None and s.data_worker_delay_fraction is None, "no run delay measured"
    assert signals(old, {**new, "worker_processes": 0.0}, DT).data_worker_busy == 18 / DT / 6
    delayed = signals(old, {**new, "has_run_delay": 1.0}, DT)
    assert delayed.data_workers_delay_cores == 3 / DT and delayed.data_worker_delay_fraction == 3 / DT / 2


def test_a_window_of_no_time_has_no_signals() -> None:
    for dt in (0.0, -1.0):
        assert signals(OLD, NEW, dt) == Signals(window_s=dt)


def test_counters_that_went_backwards_read_as_no_growth() -> None:
    s = signals(NEW, OLD, DT)  # a restarted job: every counter below its last value
    assert s.steps_per_s == 0.0 and s.step_time_s is None and s.data_wait_fraction is None
    assert (s.samples_per_s, s.requests_per_s, s.process_cpu_cores, s.alloc_retries) == (0.0, 0.0, 0.0, 0.0)


def test_without_a_loop_decomposition_the_wait_is_the_wait_over_step_and_wait() -> None:
    old = {"step_count": 10.0, "step_sum": 2.0, "wait_sum": 1.0}
    new = {"step_count": 20.0, "step_sum": 5.0, "wait_sum": 2.0}
    s = signals(old, new, DT)
    assert s.data_wait_fraction == 1 / (3 + 1) and s.step_fraction is None and s.collective_wait_fraction is None


def test_collectives_are_read_only_where_the_job_reports_them_and_wait_is_at_most_the_wall() -> None:
    base = {"loop_wall": 0.0, "loop_data_wait": 0.0}
    assert signals(base, {"loop_wall": 10.0, "loop_data_wait": 1.0}, DT).collective_wait_fraction is None
    s = signals({**base, "collective_wait": 0.0}, {"loop_wall": 10.0, "collective_wait": 30.0}, DT)
    assert s.collective_wait_fraction == 1.0 and s.collective_fraction == 0.0


def test_gauges_and_shares_are_read_at_their_edges() -> None:
    s = signals({}, {"io_pressure": 50.0, "gpu_busy": 9.0, "gpu_observed": 3.0, "cpus": 0.0}, DT)
    assert s.io_pressure_fraction is None, "a pressure counter that appeared in the window holds time from before"
    assert s.gpu_busy_ratio == 1.0 and s.cpus == 1.0
    s = signals({"io_pressure": 0.0, "tree_io_read": 0.0}, {"io_pressure": 50.0, "tree_io_read": 5.0}, DT)
    assert s.io_pressure_fraction == 1.0 and s.storage_read_bytes_per_s == 0.5
    s = signals({}, {"host_mem_total": 0.0, "cgroup_mem_limit": 0.0}, DT)
    assert s.host_mem_available_ratio is None and s.container_mem_ratio is None, "no total, no limit: unmeasured"
    s = signals({}, {"host_mem_total": 8.0, "cgroup_mem_limit": 4.0}, DT)
    assert s.host_mem_available_ratio == 0.0 and s.container_mem_ratio == 0.0
    assert signals({}, {"intra_op_threads": 4.0}, DT).torch_cpu_only is True
    assert signals({}, {"intra_op_threads": 4.0, "gpu_busy": 1.0}, DT).torch_cpu_only is False
    assert signals({}, {"gpu_busy": 1.0}, DT).torch_cpu_only is False


def test_threads_are_read_only_from_a_window_whose_first_sweep_had_them() -> None:
    s = signals({}, {"cpu_main": 5.0}, DT)
    assert s.main_thread_busy is None and s.intra_op_busy is None
    s = signals({"cpu_main": 0.0}, {"cpu_main": 5.0}, DT)
    assert s.main_thread_busy == 0.5 and s.intra_op_busy == 0.0 and s.data_worker_busy is None
    assert s.ops_counted is False and s.main_cpu_us_per_op is None and s.run_delay_fraction is None
    s = signals({"cpu_main": 0.0}, {"cpu_main": 5.0, "autograd_ops": 100.0}, DT)
    assert s.ops_counted is True and s.main_cpu_us_per_op is None, "operations counted from mid-window: no size"
    s = signals({"cpu_main": 0.0, "autograd_ops": 0.0}, {"cpu_main": 5.0, "autograd_ops": 100.0}, DT)
    assert s.main_cpu_us_per_op == 5 / 100 * 1e6 and s.ops_per_step is None, "no steps: no operations per step"


def test_the_loops_own_time_is_never_less_than_the_main_threads_cpu() -> None:
    old = {"cpu_main": 0.0, "loop_wall": 0.0, "loop_data_wait": 0.0, "delay_main": 0.0}
    new = {"cpu_main": 6.0, "loop_wall": 10.0, "loop_data_wait": 2.0, "delay_main": 7.0, "has_run_delay": 1.0}
    assert signals(old, new, DT).data_wait_alone_fraction == 2 / (2 + 6)
    new["delay_main"] = 1.0
    assert signals(old, new, DT).data_wait_alone_fraction == 2 / (2 + 7)
    new["loop_data_wait"], new["cpu_main"] = 0.0, 0.0
    new["loop_wall"], new["delay_main"] = 1.0, 5.0
    assert signals(old, new, DT).data_wait_alone_fraction is None, "no time of its own at all"
    idle = {"cpu_main": 0.0, "has_run_delay": 1.0}
    assert signals({"cpu_main": 0.0}, idle, DT).run_delay_fraction is None


@pytest.mark.parametrize("samples", [PROFILE_MIN_SAMPLES - 1, PROFILE_MIN_SAMPLES])
def test_a_profile_needs_its_minimum_of_samples_in_the_window(samples: int) -> None:
    assert PROFILE_MIN_SAMPLES == 20
    s = signals({"prof_total": 0.0}, {"prof_total": float(samples), "prof_python": float(samples)}, DT)
    assert s.loop_samples == samples
    assert s.profile == ({"python": 1.0} if samples >= PROFILE_MIN_SAMPLES else {})
    assert signals({}, {"prof_total": 50.0, "prof_python": 50.0}, DT).loop_samples is None


def test_at_most_the_top_frames_most_sampled_first() -> None:
    assert TOP_FRAMES == 10
    new = {"prof_total": 100.0, **{f"frame{SEP}python{SEP}f.py:{i} f": float(i) for i in range(1, 13)}}
    s = signals({"prof_total": 0.0}, new, DT)
    assert [f for _, f, _ in s.top_frames] == [f"f.py:{i} f" for i in range(12, 2, -1)]
    assert s.top_frames[0][2] == 12 / 100


def rank_keys(job: str, rank: str, steps: float, step: float, wait: float, wall: float, data: float = 0.0) \
        -> dict[str, float]:
    return {f"rank{SEP}{job}{SEP}{rank}{SEP}{k}": v for k, v in
            (("steps", steps), ("step", step), ("collective_wait", wait), ("wall", wall), ("data_wait", data))}


def test_each_ranks_compute_and_wait_per_step() -> None:
    new = {**rank_keys("job", "0", 10, 5.0, 2.0, 8.0, 1.0), **rank_keys("job", "1", 10, 3.0, 4.0, 8.0)}
    s = signals({}, new, DT)
    assert s.ranks == [RankSignals("job", "0", 10, 0.3, 0.2, 0.8, 2 / 8, 1 / 8),
                       RankSignals("job", "1", 10, 0.0, 0.4, 0.8, 4 / 8, 0.0)]
    assert s.straggler_compute_ratio is None, "the others' typical compute is 0: no ratio"


def test_a_rank_without_steps_wall_or_collectives_is_left_out_and_a_job_of_one_rank_has_no_straggler() -> None:
    new = {**rank_keys("job", "0", 0, 5.0, 2.0, 8.0), **rank_keys("other", "0", 10, 5.0, 1.0, 8.0)}
    new[f"rank{SEP}job{SEP}1{SEP}steps"] = 10.0  # no wall, no collective wait
    new[f"rank{SEP}bad"] = 1.0  # too few fields
    s = signals({}, new, DT)
    assert [(r.training_job, r.rank) for r in s.ranks] == [("other", "0")]
    assert s.straggler_compute_ratio is None and s.straggler is None


def test_a_job_name_with_the_separator_keeps_its_ranks() -> None:
    job = f"a{SEP}b"
    s = signals({}, {**rank_keys(job, "0", 10, 2.0, 1.0, 4.0), **rank_keys(job, "1", 10, 2.0, 1.0, 4.0)}, DT)
    assert {(r.training_job, r.rank) for r in s.ranks} == {(job, "0"), (job, "1")}
    assert s.straggler_compute_ratio == 1.0 and s.others_wait_fraction == 0.25


def test_the_straggler_and_its_evidence() -> None:
    # rank 2 computes 2x the others per step and they wait for it: 0.2 s a step against 0.1
    new = {**rank_keys("job", "0", 10, 2.0, 1.0, 3.0), **rank_keys("job", "1", 10, 2.0, 1.0, 3.0),
           **rank_keys("job", "2", 10, 2.0, 0.0, 3.0)}
    s = signals({}, new, DT)
    assert s.straggler is not None and s.straggler.rank == "2" and s.straggler_rank == 2.0
    assert s.straggler_compute_ratio == 0.2 / 0.1 and s.others_wait_fraction == 1 / 3
    named = signals({}, {k.replace(f"{SEP}2{SEP}", f"{SEP}worker-b{SEP}"): v for k, v in new.items()}, DT)
    assert named.straggler is not None and named.straggler_rank is None, "a rank that is no number names no rank"


def test_of_two_jobs_the_larger_ratio_is_the_evidence() -> None:
    new = {**rank_keys("a", "0", 10, 2.0, 1.0, 3.0), **rank_keys("a", "1", 10, 2.0, 0.0, 3.0),
           **rank_keys("b", "0", 10, 3.0, 0.0, 4.0), **rank_keys("b", "1", 10, 4.0, 3.0, 4.0)}
    s = signals({}, new, DT)
    assert s.straggler_compute_ratio == 0.3 / 0.1 and s.others_wait_fraction == 3 / 4


def test_the_starved_rank_and_its_evidence() -> None:
    new = {**rank_keys("job", "0", 10, 4.0, 3.0, 10.0, 0.5), **rank_keys("job", "1", 10, 1.0, 0.2, 10.0, 6.0),
           **rank_keys("job", "2", 10, 4.0, 3.0, 10.0, 0.5)}
    s = signals({}, new, DT)
    assert s.starved is not None and s.starved.rank == "1" and s.starved_rank == 1.0
    assert s.starved_data_wait_fraction == 0.6
    # the fed ranks' wait in collectives, which the verdict states; the straggler's search (rank 0 computes a little
    # longer) once wrote over it with the wait of the ranks other than the slowest, the starved one among them
    assert s.others_wait_fraction == 0.3 and s.straggler is None


def sweep() -> list[Family]:
    """One sweep's families as the agent exports them (the catalog's label names), two ranks of job "j" and two
    GPUs, every family the snapshot reads."""
    h = HistogramValue((0.1, 1.0), (0, 0, 0), 0.0)
    return [
        Family("outrider_train_step_duration_seconds").add(HistogramValue((1.0,), (4, 1), 2.5), "0", "j")
        .add(HistogramValue((1.0,), (3, 0), 1.5), "1", "j"),
        Family("outrider_train_data_wait_seconds").add(HistogramValue((1.0,), (2, 0), 0.75), "0", "j"),
        Family("outrider_samples_total").add(32, "0", "j").add(16, "1", "j"),
        Family("outrider_tokens_total").add(100, "0", "j"),
        Family("outrider_requests_total").add(3, "/a", "GET", "http", "200", "2xx", "", "")
        .add(4, "/b", "POST", "http", "500", "5xx", "", ""),
        Family("outrider_watched_cpu_seconds_total").add(5, "user").add(2, "system"),
        Family("outrider_train_collective_seconds_total").add(1.5, "0", "j", "all_reduce")
        .add(0.5, "1", "j", "barrier"),
        Family("outrider_train_gpu_busy_seconds_total").add(3, "0", "j"),
        Family("outrider_train_gpu_observed_seconds_total").add(4, "0", "j"),
        Family("outrider_train_autograd_ops_total").add(900, "0", "j").add(100, "1", "j"),
        Family("outrider_torch_cuda_alloc_retries_total").add(2, "0", "j", "cuda:0"),
        Family("outrider_watched_io_bytes_total").add(4096, "read").add(512, "write"),
        Family("outrider_thread_cpu_seconds_total").add(6, "0", "j", "main").add(2, "1", "j", "main")
        .add(3, "0", "j", "intra_op"),
        Family("outrider_thread_run_delay_seconds_total").add(0.5, "0", "j", "main"),
        Family("outrider_host_cpu_utilization_ratio").add(0.4),
        Family("outrider_host_logical_cpus").add(16),
        Family("outrider_host_memory_available_bytes").add(3e9),
        Family("outrider_host_memory_limit_bytes").add(12e9),
        Family("outrider_cgroup_memory_working_set_bytes").add(1e9),
        Family("outrider_cgroup_memory_limit_bytes").add(2e9),
        Family("outrider_gpu_sm_activity_ratio").add(0.2, "0", "u0", "H200").add(0.6, "1", "u1", "H200"),
        Family("outrider_gpu_dram_activity_ratio").add(0.5, "0", "u0", "H200"),
        Family("outrider_train_loop_seconds_total").add(2.0, "0", "j", "data_wait").add(6.0, "0", "j", "step")
        .add(1.0, "1", "j", "step"),
        Family("outrider_train_collective_wait_seconds_total").add(1.25, "0", "j"),
        Family("outrider_train_loop_samples_total").add(30, "0", "j", "python").add(10, "1", "j", "waiting"),
        Family("outrider_train_loop_frame_samples_total").add(30, "0", "j", "python", "a.py:1 f")
        .add(5, "1", "j", "python", "a.py:1 f"),
        Family("outrider_threads").add(2, "0", "j", "main").add(1, "1", "j", "main").add(3, "0", "j", "data_workers")
        .add(8, "0", "j", "intra_op"),
        Family("outrider_child_processes").add(1, "0", "j").add(2, "1", "j"),
        # a service's requests: their durations, the server's queue phase (its other phases not), in flight now
        Family("outrider_request_duration_seconds").add(HistogramValue((1.0,), (3, 0), 0.6), "/a", "GET", "http",
                                                        "200", "2xx", "0", "j")
        .add(HistogramValue((1.0,), (3, 1), 2.4), "/b", "POST", "http", "500", "5xx", "0", "j"),
        Family("outrider_request_phase_duration_seconds").add(HistogramValue((1.0,), (5, 0), 0.25), "queue", "0", "j")
        .add(HistogramValue((1.0,), (5, 0), 0.75), "compute", "0", "j"),
        Family("outrider_requests_in_flight").add(2, "/a", "GET", "http", "0", "j").add(1, "/b", "POST", "http", "0",
                                                                                         "j"),
        Family("outrider_torch_intra_op_threads").add(8, "0", "j").add(4, "1", "j"),
        Family("outrider_host_pressure_stalled_seconds_total").add(7, "io", "some").add(9, "io", "full")
        .add(11, "cpu", "some"),
        Family("outrider_gpu_utilization_ratio").add(0.5, "0", "u0", "H200", "general")
        .add(0.7, "1", "u1", "H200", "general").add(0.9, "0", "u0", "H200", "decoder"),
        Family("outrider_gpu_memory_used_bytes").add(40, "0", "u0", "H200").add(30, "1", "u1", "H200")
        .add(5, "2", "u2", "H200"),
        Family("outrider_gpu_memory_total_bytes").add(100, "0", "u0", "H200").add(40, "1", "u1", "H200")
        .add(0, "2", "u2", "H200"),
        Family("outrider_gpu_clock_event_active").add(0, "0", "u0", "H200", "hw_thermal_slowdown")
        .add(1, "1", "u1", "H200", "sw_power_cap").add(1, "0", "u0", "H200", "gpu_idle"),
        Family("outrider_train_gpu_step_duration_seconds").add(h, "0", "j"),
    ]


def test_a_sweeps_snapshot_sums_what_it_sums_and_means_what_it_means() -> None:
    r = f"rank{SEP}j{SEP}"
    assert snapshot(sweep()) == {
        "step_sum": 4.0, "step_count": 8.0, f"{r}0{SEP}steps": 5.0, f"{r}1{SEP}steps": 3.0, "wait_sum": 0.75,
        "samples": 48.0, "tokens": 100.0, "requests": 7.0, "process_cpu": 7.0, "collective": 2.0, "gpu_busy": 3.0,
        "gpu_observed": 4.0, "autograd_ops": 1000.0, "alloc_retries": 2.0, "cuda_used": 1.0,
        "tree_io_read": 4096.0, "tree_io_write": 512.0, "cpu_main": 8.0, "cpu_intra_op": 3.0, "delay_main": 0.5,
        "has_run_delay": 1.0, "host_cpu_util": 0.4, "cpus": 16.0, "host_mem_avail": 3e9, "host_mem_total": 12e9,
        "cgroup_mem_working_set": 1e9, "cgroup_mem_limit": 2e9, "sm_activity": 0.4, "dram_activity": 0.5,
        "loop_data_wait": 2.0, "loop_step": 7.0, "loop_wall": 9.0, f"{r}0{SEP}data_wait": 2.0,
        f"{r}0{SEP}step": 6.0, f"{r}1{SEP}step": 1.0, f"{r}0{SEP}wall": 8.0, f"{r}1{SEP}wall": 1.0,
        "collective_wait": 1.25, f"{r}0{SEP}collective_wait": 1.25, "prof_python": 30.0, "prof_waiting": 10.0,
        "prof_total": 40.0, f"{r}0{SEP}prof_python": 30.0, f"{r}0{SEP}prof_total": 30.0,
        f"{r}1{SEP}prof_waiting": 10.0, f"{r}1{SEP}prof_total": 10.0, f"frame{SEP}python{SEP}a.py:1 f": 35.0,
        "main_threads": 3.0, "worker_threads": 3.0, "intra_op_threads": 4.0, "io_pressure": 7.0,
        "gpu_util": 0.6, "gpus": 2.0, "gpu_mem_ratio": 0.75, "throttle_thermal": 0.0, "throttle_power": 1.0,
        "worker_processes": 3.0, "request_sum": 3.0, "request_count": 7.0, "queue_sum": 0.25, "in_flight": 3.0,
    }


def test_clock_events_read_as_thermal_or_power_only_while_active() -> None:
    def events(*active: tuple[str, float]) -> tuple[float, float]:
        fam = Family("outrider_gpu_clock_event_active")
        for reason, v in active:
            fam.add(v, "0", "u0", "H200", reason)
        out = snapshot([fam])
        return out["throttle_thermal"], out["throttle_power"]

    assert events(("hw_thermal_slowdown", 1)) == (1.0, 0.0)
    assert events(("sw_thermal_slowdown", 1)) == (1.0, 0.0)
    for reason in ("hw_power_brake_slowdown", "hw_slowdown", "sw_power_cap"):
        assert events((reason, 1)) == (0.0, 1.0)
    assert events(("hw_thermal_slowdown", 0), ("sw_power_cap", 0), ("gpu_idle", 1)) == (0.0, 0.0)
    assert snapshot([]) == {"throttle_thermal": 0.0, "throttle_power": 0.0}


def test_a_cuda_family_alone_says_cuda_was_used() -> None:
    fam = Family("outrider_torch_cuda_memory_bytes").add(1.0, "0", "j", "cuda:0", "allocated")
    assert snapshot([fam]).get("cuda_used") == 1.0
    assert "cuda_used" not in snapshot([Family("outrider_samples_total").add(1, "0", "j")])


def test_a_verdicts_evidence_reads_back_as_the_signals_it_came_from() -> None:
    """A run's verdict is explained from the evidence it shows (runs/verdict.py): every signal comes back, with
    its type, the profile and the frames (most sampled first, at most TOP_FRAMES), the straggler and the starved
    rank by their number."""
    s = signals(OLD, NEW, DT)
    s.straggler_rank, s.starved_rank, s.starved_data_wait_fraction = 3.0, 1.0, 0.45
    s.torch_cpu_only = True
    ev = s.evidence()
    frames = [("native", f"f.py:{i} f", i / 100) for i in range(12)]
    back = Signals.from_evidence(ev, frames)
    assert back.evidence() == ev
    assert (type(back.gpus), type(back.throttle_thermal), type(back.torch_cpu_only)) == (int, bool, bool)
    assert (back.gpus, back.throttle_thermal, back.throttle_power, back.torch_cpu_only) == (2, True, False, True)
    assert back.profile == {k: round(v, 4) for k, v in s.profile.items()}
    assert back.top_frames == sorted(frames, key=lambda f: -f[2])[:TOP_FRAMES]
    assert back.straggler == RankSignals("", "3", 0.0, 0.0, 0.0, 0.0, 0.0)
    assert back.starved == RankSignals("", "1", 0.0, 0.0, 0.0, 0.0, 0.0, 0.45)
    assert back.window_s == 0.0 and back.extra == {}
    plain = Signals.from_evidence({"steps_per_s": 2.0, "not_a_signal": 5.0})
    assert plain.steps_per_s == 2.0 and plain.straggler is None and plain.starved is None
    assert plain.profile == {} and plain.top_frames == [] and not hasattr(plain, "not_a_signal")
    assert Signals.from_evidence({"starved_rank": 2.0}).starved == RankSignals("", "2", 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def test_single_samples_and_single_steps_count() -> None:
    s = signals({"prof_total": 0.0}, {"prof_total": 20.0, "prof_python": 19.0, "prof_waiting": 1.0,
                                      f"frame{SEP}waiting{SEP}q.py:1 get{SEP}x": 1.0}, DT)
    assert s.profile == {"python": 19 / 20, "waiting": 1 / 20}
    assert s.top_frames == [("waiting", f"q.py:1 get{SEP}x", 1 / 20)], "a frame's own text may hold the separator"
    s = signals({"prof_total": 0.0}, {"prof_total": 20.0, f"frame{SEP}python{SEP}a.py:1 f": 30.0}, DT)
    assert s.top_frames == [("python", "a.py:1 f", 1.0)], "a frame's share is at most all the samples"


def test_each_ranks_growth_in_the_window_and_its_edges() -> None:
    old = {**rank_keys("job", "0", 10, 2.0, 1.0, 3.0), "samples": 0.0}
    new = {"samples": 5.0, **rank_keys("job", "0", 11, 2.5, 1.25, 3.5, 0.25),
           "requests": 1.0, **rank_keys("job", "1", 1, 0.5, 0.25, 0.5)}
    del new[f"rank{SEP}job{SEP}0{SEP}step"], old[f"rank{SEP}job{SEP}0{SEP}step"]
    s = signals(old, new, DT)
    # rank 0 grew by one step, 0.5 s of wall, 0.25 s of collectives and no step part (the key is gone): compute 0
    assert s.ranks == [RankSignals("job", "0", 1.0, 0.0, 0.25, 0.5, 0.5, 0.5),
                       RankSignals("job", "1", 1.0, 0.25, 0.25, 0.5, 0.5, 0.0)]
    skew = signals({}, {**rank_keys("job", "0", 1, 0.5, 0.75, 0.5)}, DT)
    assert skew.ranks[0].wait_fraction == 1.0, "collectives longer than the wall (clocks read apart): all of it"
    hungry = signals({}, {**rank_keys("job", "0", 1, 0.5, 0.0, 0.5, 0.75)}, DT)
    assert hungry.ranks[0].data_wait_fraction == 1.0


def test_operations_and_run_delay_from_a_single_operation_and_a_short_loop() -> None:
    old = {"cpu_main": 0.0, "autograd_ops": 0.0, "loop_wall": 0.0, "loop_data_wait": 0.0}
    new = {"cpu_main": 0.25, "autograd_ops": 1.0, "loop_wall": 0.5, "loop_data_wait": 0.25, "delay_main": 0.5,
           "has_run_delay": 1.0}
    s = signals(old, new, DT)
    assert s.main_cpu_us_per_op == 0.25e6
    assert s.data_wait_alone_fraction == 0.25 / (0.25 + 0.25)
    assert s.run_delay_fraction == 0.5 / (0.25 + 0.5)
    no_delay = signals(old, {**new, "has_run_delay": 0.0}, DT)
    assert no_delay.data_wait_alone_fraction is None and no_delay.run_delay_fraction is None
