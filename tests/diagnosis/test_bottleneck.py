"""Bottleneck classes from signals; the GPU-side classes from the real GPU collector against fake-NVML scenarios
(standing in for a GPU) combined with hook and process families."""

from __future__ import annotations

import pytest

from outrider.diagnosis.bottleneck import CLASSES, RECOMMENDATIONS, classify
from outrider.diagnosis.signals import signals, snapshot
from outrider.metrics.family import Family, HistogramValue
from tests.gpu.conftest import Scenario, make_collector

BOUNDS = (0.01, 0.1, 1.0)


def workload(step_s: float, wait_s: float, cpu_s: float, steps: int = 100) -> list[Family]:
    """Cumulative hook and process families after `steps` steps of the given shape."""
    return [
        Family("outrider_train_step_duration_seconds").add(HistogramValue(BOUNDS, (0, steps, 0, 0), step_s * steps),
                                                            "", ""),
        Family("outrider_train_data_wait_seconds").add(HistogramValue(BOUNDS, (0, steps, 0, 0), wait_s * steps), "",
                                                       ""),
        Family("outrider_samples_total").add(32 * steps, "", ""),
        Family("outrider_watched_cpu_seconds_total").add(cpu_s, "user"),
        Family("outrider_host_logical_cpus").add(8),
    ]


def verdict(old: list[Family], new: list[Family], dt: float = 10.0) -> str:
    return classify(signals(snapshot(old), snapshot(new), dt)).cls


GPU = """device_count 1
gpu 0 name NVIDIA H100 80GB HBM3
gpu 0 uuid GPU-0
gpu 0 memory_total 100
gpu 0 memory_free 0
"""


@pytest.mark.parametrize(("scenario_text", "wait_s", "cpu_cores", "expected"), [
    ("gpu 0 util_gpu 95\ngpu 0 memory_used 50\n", 0.0, 1.0, "compute_bound"),
    ("gpu 0 util_gpu 90\ngpu 0 memory_used 50\ngpu 0 clock_reasons 0x40\n", 0.0, 1.0, "throttled"),
    ("gpu 0 util_gpu 90\ngpu 0 memory_used 50\ngpu 0 clock_reasons 0x80\n", 0.0, 1.0, "throttled"),
    ("gpu 0 util_gpu 70\ngpu 0 memory_used 97\n", 0.0, 1.0, "memory_pressure"),
    ("gpu 0 util_gpu 20\ngpu 0 memory_used 50\n", 0.08, 0.3, "input_bound"),
    ("gpu 0 util_gpu 25\ngpu 0 memory_used 50\n", 0.0, 1.0, "host_bound"),
    ("gpu 0 util_gpu 70\ngpu 0 memory_used 50\ngpu 0 gpm_supported 1\ngpu 0 gpm 10 85\ngpu 0 gpm 2 30\n", 0.0, 1.0,
     "memory_bandwidth_bound"),
])
def test_gpu_side_classes_from_fake_nvml(fake_nvml: dict[str, str], scenario: Scenario, scenario_text: str,
                                        wait_s: float, cpu_cores: float, expected: str) -> None:
    scenario.write(GPU + scenario_text)
    gpu = make_collector(fake_nvml["full"])
    first = gpu.collect()
    second = gpu.collect()  # GPM needs two samples
    old = workload(0.02, wait_s, 0.0, steps=100) + first
    new = workload(0.02, wait_s, cpu_cores * 10.0, steps=300) + second
    assert verdict(old, new) == expected


def test_idle() -> None:
    same = workload(0.02, 0.0, 5.0)
    assert verdict(same, same) == "idle"


def threads(main: tuple[float, float], pool: tuple[float, float], workers: float = 0.0, processes: int = 1,
            rank: str = "") -> list[Family]:
    """Cumulative per-thread CPU and run delay (seconds) of `processes` instrumented processes, by role."""
    cpu, delay, count = (Family("outrider_thread_cpu_seconds_total"), Family("outrider_thread_run_delay_seconds_total"),
                         Family("outrider_threads"))
    for role, (c, d) in {"main": main, "intra_op": pool, "data_workers": (workers, 0.0)}.items():
        cpu.add(c, rank, "", role)
        delay.add(d, rank, "", role)
        count.add(processes if role == "main" else 1, rank, "", role)
    return [cpu, delay, count]


def loop(wait: float, step: float, other: float = 0.0, rank: str = "", collective_wait: float | None = None,
         steps: int = 100) -> list[Family]:
    """Cumulative loop decomposition (seconds) of one rank after `steps` steps."""
    fams = [Family("outrider_train_loop_seconds_total").add(wait, rank, "", "data_wait").add(step, rank, "", "step")
            .add(other, rank, "", "other"),
            Family("outrider_train_step_duration_seconds").add(
                HistogramValue(BOUNDS, (0, steps, 0, 0), wait + step + other), rank, ""),
            Family("outrider_samples_total").add(32 * steps, rank, "")]
    if collective_wait is not None:
        fams.append(Family("outrider_train_collective_wait_seconds_total").add(collective_wait, rank, ""))
    return fams


ZERO = threads((0, 0), (0, 0))


def test_cpu_compute_bound_is_the_pool_busy_whatever_the_neighbours() -> None:
    # two threads' worth of demand over 10 s: alone (all CPU), and beside a hog (a third of it run delay)
    alone = threads((10.0, 0.0), (9.0, 0.0))
    shared = threads((6.5, 3.5), (6.0, 3.0))
    for now in (alone, shared):
        assert verdict(loop(0, 0, steps=10) + ZERO, loop(0, 10.0, steps=200) + now) == "compute_bound"
    v = classify(signals(snapshot(loop(0, 0, steps=10) + ZERO), snapshot(loop(0, 10.0, steps=200) + shared), 10.0))
    assert "contention" in v.reason and v.evidence["run_delay_fraction"] == pytest.approx(6.5 / 19.0, abs=1e-3)
    assert "contention" not in classify(signals(snapshot(loop(0, 0, steps=10) + ZERO),
                                                snapshot(loop(0, 10.0, steps=200) + alone), 10.0)).reason


def test_cpu_host_bound_is_the_main_thread_saturated_while_the_pool_idles() -> None:
    for main in ((9.8, 0.0), (5.0, 4.8)):  # alone; beside a hog (half of its demand waiting for a CPU)
        assert verdict(loop(0, 0, steps=10) + ZERO,
                       loop(0, 10.0, steps=3000) + threads(main, (0.1, 0.05))) == "host_bound"
    # a job that only gets half a core does not become "host_bound" by its CPU alone: its demand is what counts
    assert verdict(loop(0, 0, steps=10) + ZERO, loop(0, 10.0, steps=3000) + threads((5.0, 0.0), (0.1, 0.0))) \
        == "balanced"


def test_input_bound_from_the_loop_decomposition() -> None:
    v = classify(signals(snapshot(loop(0, 0, steps=10) + ZERO),
                         snapshot(loop(7.0, 2.0, 1.0, steps=200) + threads((3.0, 0.0), (0.5, 0.0), workers=9.0)),
                         10.0))
    assert v.cls == "input_bound" and v.evidence["data_wait_fraction"] == pytest.approx(0.7)
    assert v.evidence["other_fraction"] == pytest.approx(0.1) and v.evidence["data_workers_cpu_cores"] == 0.9


def test_many_ranks_are_judged_per_process() -> None:
    """Four ranks' main threads saturated are four processes host-bound, not 'four cores busy'."""
    fams_old = [f for r in "0123" for f in loop(0, 0, rank=r, steps=10)] + threads((0, 0), (0, 0), processes=4)
    fams_new = [f for r in "0123" for f in loop(0, 10.0, rank=r, steps=3000)] + threads((39.0, 0.0), (0.4, 0.0),
                                                                                        processes=4)
    assert verdict(fams_old, fams_new) == "host_bound"


def test_straggler_is_the_rank_that_computes_longest_and_waits_least() -> None:
    old = [f for r in "0123" for f in loop(0, 0, rank=r, collective_wait=0.0, steps=10)] + ZERO
    new = []
    for r in "0123":  # every rank takes 10 s for 100 steps; rank 2 computes 9 s of them, the others 4 s and wait
        new += loop(0, 10.0, rank=r, collective_wait=1.0 if r == "2" else 6.0, steps=110)
    new += threads((20.0, 0.0), (2.0, 0.0), processes=4)
    s = signals(snapshot(old), snapshot(new), 10.0)
    v = classify(s)
    assert v.cls == "communication_bound", v.reason
    assert s.straggler is not None and s.straggler.rank == "2" and v.evidence["straggler_rank"] == 2
    assert v.evidence["straggler_compute_ratio"] == pytest.approx(9.0 / 4.0)
    assert "rank 2 is a straggler" in v.reason and "60%" in v.reason


def test_communication_bound_without_a_straggler() -> None:
    old = [f for r in "01" for f in loop(0, 0, rank=r, collective_wait=0.0, steps=10)] + ZERO
    new = [f for r in "01" for f in loop(0, 10.0, rank=r, collective_wait=6.0, steps=110)]
    new += threads((16.0, 0.0), (2.0, 0.0), processes=2)
    s = signals(snapshot(old), snapshot(new), 10.0)
    v = classify(s)
    assert v.cls == "communication_bound" and s.straggler is None and "no straggler" in v.reason
    assert v.evidence["collective_wait_fraction"] == pytest.approx(0.6)
    # 100 ms steps spent all but a millisecond in collectives: 1.2 ms of compute against 0.7 ms is noise, not a
    # straggler, though it is 1.7x and the others wait a little longer
    noisy = [f for r, wait in (("0", 9.88), ("1", 9.93), ("2", 9.93)) for f in
             loop(0, 10.0, rank=r, collective_wait=wait, steps=110)]
    old = [f for r in "012" for f in loop(0, 0, rank=r, collective_wait=0.0, steps=10)] + ZERO
    s = signals(snapshot(old), snapshot(noisy + threads((3.0, 0.0), (0.0, 0.0), processes=3)), 10.0)
    assert s.straggler_compute_ratio == pytest.approx(12 / 7, rel=0.01)
    assert s.straggler is None and classify(s).cls == "communication_bound"


def test_gpu_busy_from_cuda_events_decides_over_nvml() -> None:
    """NVML says 90% busy (a kernel was running); the step-end CUDA events say the GPU waited for the host."""
    def gpu(util: float, busy: float, observed: float) -> list[Family]:
        return [Family("outrider_gpu_utilization_ratio").add(util, "0", "GPU-0", "H100", "general"),
                Family("outrider_train_gpu_busy_seconds_total").add(busy, "", ""),
                Family("outrider_train_gpu_observed_seconds_total").add(observed, "", "")]

    start = loop(0, 0, steps=10) + gpu(0.9, 0, 0) + ZERO
    host = loop(0, 10.0, steps=1000) + gpu(0.9, 0.5, 10.0) + threads((9.9, 0.0), (0.0, 0.0))
    compute = loop(0, 10.0, steps=1000) + gpu(0.9, 9.5, 10.0) + threads((9.9, 0.0), (0.0, 0.0))
    assert verdict(start, host) == "host_bound"
    assert verdict(start, compute) == "compute_bound"
    no_events = [f for f in host if not f.defn.name.startswith("outrider_train_gpu")]
    assert verdict([f for f in start if not f.defn.name.startswith("outrider_train_gpu")], no_events) \
        == "compute_bound", "NVML's utilisation is the fallback where no events were measured"


def test_every_verdict_carries_evidence_and_advice() -> None:
    v = classify(signals(snapshot(workload(0.01, 0.03, 0.0)), snapshot(workload(0.01, 0.03, 2.0, steps=300)), 10))
    assert v.cls == "input_bound", "a hook without the loop decomposition: the data-wait histogram decides"
    assert v.evidence["data_wait_fraction"] == pytest.approx(0.75)
    assert v.evidence["steps_per_s"] == pytest.approx(20)
    assert "num_workers" in v.recommendation or "workers" in v.recommendation
    assert set(RECOMMENDATIONS) == set(CLASSES)


def test_no_verdict_while_a_busy_process_is_still_starting() -> None:
    """Imports and loading before the first step are not a bottleneck of the job: no verdict until it is active;
    idle is still said, and once the job has stepped every window gets a verdict."""
    from outrider.diagnosis.window import VerdictWindow

    def sweep(cpu_s: float, steps: int) -> list[Family]:
        fams = [Family("outrider_watched_cpu_seconds_total").add(cpu_s, "user")]
        return fams + (loop(0, steps * 0.01, steps=steps) if steps else [])

    w = VerdictWindow(5.0)
    w.add(sweep(0.0, 0), now=0.0)
    assert w.add(sweep(4.0, 0), now=5.0) is None, "busy importing torch: nothing to diagnose yet"
    assert w.add(sweep(8.0, 100), now=10.0) is None, "the first steps, in a window that began before them"
    v = w.add(sweep(12.0, 200), now=15.0)
    assert v is not None and v.cls != "idle", "a window that begins with the job at work"
    assert w.add(sweep(16.0, 200), now=20.0) is not None, "after the job was active, every window has a verdict"
    idle = VerdictWindow(5.0)
    idle.add(sweep(0.0, 0), now=0.0)
    v = idle.add(sweep(0.0, 0), now=5.0)
    assert v is not None and v.cls == "idle"


def test_a_cpu_torch_job_on_a_gpu_node_is_judged_by_its_cpu() -> None:
    """NVML sees an idle GPU; the job's torch never initialised CUDA: the CPU rules decide, not 'the GPU waits'."""
    gpu = [Family("outrider_gpu_utilization_ratio").add(0.0, "0", "GPU-0", "H100", "general"),
           Family("outrider_torch_intra_op_threads").add(8, "", "")]
    old = loop(0, 0, steps=10) + ZERO + gpu + [Family("outrider_train_autograd_ops_total").add(0, "", "")]
    new = loop(0, 10.0, steps=200) + threads((9.9, 0.0), (60.0, 0.0)) + gpu + [
        Family("outrider_train_autograd_ops_total").add(1900, "", "")]
    assert verdict(old, new) == "compute_bound"
    cuda = [Family("outrider_torch_cuda_memory_bytes").add(1e9, "", "", "0", "allocated")]
    assert verdict(old + cuda, new + cuda) == "host_bound", "with CUDA in use, the idle GPU waits for the host"


def test_the_window_of_the_first_steps_after_an_idle_one_is_not_judged_never_idle() -> None:
    """An idle start (a job waiting for its data to mount), then the first steps in a window that began before them:
    not judged, with its reason; idle never speaks for a window in which the job stepped."""
    from outrider.diagnosis.bottleneck import NOT_JUDGED
    from outrider.diagnosis.window import FIRST_STEPS, VerdictWindow

    def sweep(steps: int) -> list[Family]:
        return [Family("outrider_watched_cpu_seconds_total").add(0.0, "user")] + (loop(0, steps * 0.01, steps=steps)
                                                                                   if steps else [])

    w = VerdictWindow(5.0)
    w.add(sweep(0), now=0.0)
    idle = w.add(sweep(0), now=5.0)
    assert idle is not None and idle.cls == "idle"
    first = w.add(sweep(100), now=10.0)
    assert first is not None and (first.cls, first.reason) == (NOT_JUDGED, FIRST_STEPS)
    assert first.evidence["steps_per_s"] == 20.0 and w.verdict is first
    v = w.add(sweep(200), now=15.0)
    assert v is not None and v.reason != FIRST_STEPS, "judged by the rules once a window begins with the job at work"
