"""The verdict's rules at their edges: every threshold docs/diagnosis.md states, just below and just above; windows
without the evidence their rule needs are not judged (never a class, never a vote); the loop profile's classes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from outrider.diagnosis import bottleneck as b
from outrider.diagnosis import signals as sig
from outrider.diagnosis.bottleneck import NOT_JUDGED, classify
from outrider.diagnosis.signals import STARVED_WAIT, Signals, signals, snapshot
from outrider.diagnosis.window import VerdictWindow
from outrider.metrics.family import Family, HistogramValue
from outrider.runs.verdict import VerdictTally
from tests.diagnosis.test_bottleneck import ZERO, loop, threads

EPS = 0.01


def cpu(**kw: object) -> Signals:
    """An active CPU job (10 steps/s) with the given signals; per-thread CPU measured unless set to None."""
    base: dict[str, object] = {"window_s": 10.0, "steps_per_s": 10.0, "process_cpu_cores": 1.0,
                               "main_thread_busy": 0.9, "intra_op_busy": 0.05, "data_wait_fraction": 0.0}
    base.update(kw)
    return Signals(**base)  # type: ignore[arg-type]


def resting(**kw: object) -> Signals:
    """A loop stepping 1.5 times a second whose thread is off CPU 90% of the time beside everything the job
    measures (signals.loop_waiting_fraction), torch's pool idle."""
    base: dict[str, object] = {"steps_per_s": 1.5, "main_thread_busy": 0.1, "intra_op_busy": 0.02,
                               "loop_waiting_fraction": 0.9}
    base.update(kw)
    return cpu(**base)


def service(**kw: object) -> Signals:
    """A service answering 40 requests a second, no steps: 50 ms each, 1 ms of CPU, 98% of it outside the process."""
    base: dict[str, object] = {"steps_per_s": 0.0, "requests_per_s": 40.0, "requests_in_flight": 2.0,
                               "request_latency_s": 0.05, "request_cpu_s": 0.001, "request_cpu_wait_s": 0.0,
                               "demand_per_process": 0.04, "request_waiting_fraction": 0.98,
                               "main_thread_busy": 0.0, "process_cpu_cores": 0.04}
    base.update(kw)
    return cpu(**base)


def gpu(**kw: object) -> Signals:
    """An active job on a GPU (its busy share measured with CUDA events) with the given signals."""
    return cpu(gpus=1, gpu_util=0.5, **kw)


def cls(s: Signals) -> str:
    return classify(s).cls


def reason_says(text: str, s: Signals) -> str:
    return "said" if text in classify(s).reason else "not said"


def ranks(slow_compute: float = 1.0, slow_wait: float = 0.5, others_wait: float = 2.5, others_compute: float = 1.0,
          hungry_wait: float = 0.0, fed_wait: float = 0.0, others_coll: float | None = None) -> Signals:
    """Four ranks over a 10 s window of 100 steps: rank 2 computes slow_compute s and waits slow_wait s in
    collectives, the others others_compute and others_wait; rank 1's loop waits hungry_wait s of its 10 for data,
    the others' fed_wait, and then the others wait others_coll s in collectives."""
    old = [f for r in "0123" for f in loop(0, 0, rank=r, collective_wait=0.0, steps=10)] + ZERO
    new: list[Family] = []
    for r in "0123":
        if others_coll is not None:  # the starved-rank layout: every loop 10 s of wall time
            wait, coll = (hungry_wait, 0.2) if r == "1" else (fed_wait, others_coll)
            new += loop(wait, 10.0 - wait, rank=r, collective_wait=coll, steps=110)
        elif r == "2":
            new += loop(0, slow_compute + slow_wait, rank=r, collective_wait=slow_wait, steps=110)
        else:
            new += loop(0, others_compute + others_wait, rank=r, collective_wait=others_wait, steps=110)
    return signals(snapshot(old), snapshot(new + threads((20.0, 0.0), (2.0, 0.0), processes=4)), 10.0)


def straggler(s: Signals) -> str:
    return "straggler" if s.straggler is not None else "none"


def starved(s: Signals) -> str:
    return "starved" if s.starved is not None else "none"


# Every threshold of the verdict's rules (diagnosis/bottleneck.py, and the straggler's and the starved rank's in
# diagnosis/signals.py) with the value docs/diagnosis.md states: (module, constant, its value, where the line falls (a
# multiple of the value), the outcome at a value x of what it bounds, the outcome just below, just above). The
# constant must keep its value, and the outcome must change between 2% below the line and 2% above it: changing
# any of them fails the test that names it.
THRESHOLDS: list[tuple[object, str, float, float, Callable[[float], str], str, str]] = [
    (b, "IDLE_CORES", 0.05, 1, lambda x: cls(cpu(steps_per_s=0.0, process_cpu_cores=x)), "idle", NOT_JUDGED),
    (b, "IDLE_GPU", 0.05, 1, lambda x: cls(cpu(steps_per_s=0.0, process_cpu_cores=0.01, gpus=1, gpu_util=x)),
     "idle", NOT_JUDGED),
    (b, "THROTTLED_BUSY", 0.3, 1, lambda x: cls(cpu(gpus=1, gpu_util=x, throttle_thermal=True)), "host_bound",
     "throttled"),
    (b, "GPU_MEMORY", 0.95, 1, lambda x: cls(cpu(main_cpu_us_per_op=50.0, gpu_mem_ratio=x)), "host_bound",
     "memory_pressure"),
    (b, "HOST_MEMORY", 0.05, 1, lambda x: cls(cpu(main_cpu_us_per_op=50.0, host_mem_available_ratio=x)),
     "memory_pressure", "host_bound"),
    (b, "CONTAINER_MEMORY", 0.95, 1, lambda x: cls(cpu(main_cpu_us_per_op=50.0, container_mem_ratio=x)),
     "host_bound", "memory_pressure"),
    (b, "CHECKPOINT_SHARE", 0.3, 1,
     lambda x: cls(cpu(main_cpu_us_per_op=50.0, data_wait_fraction=0.05, checkpoint_fraction=x)), "host_bound",
     "checkpoint_bound"),
    (b, "INPUT_WAIT", 0.3, 1, lambda x: cls(cpu(main_cpu_us_per_op=50.0, data_wait_fraction=x)), "balanced",
     "input_bound"),
    (b, "COMM_WAIT", 0.3, 1, lambda x: cls(cpu(main_cpu_us_per_op=50.0, data_wait_fraction=0.05,
                                               collective_wait_fraction=x)), "host_bound", "communication_bound"),
    (b, "DRAM_BUSY", 0.7, 1, lambda x: cls(gpu(gpu_busy_ratio=0.5, dram_activity=x, sm_activity=0.3)), "balanced",
     "memory_bandwidth_bound"),
    (b, "SM_BUSY", 0.5, 1, lambda x: cls(gpu(gpu_busy_ratio=0.5, dram_activity=0.8, sm_activity=x)),
     "memory_bandwidth_bound", "balanced"),
    # a loop off CPU most of its time beside what the job measures waits (outside the process)...
    (b, "WAITING_SHARE", 0.5, 1, lambda x: cls(resting(loop_waiting_fraction=x)), "balanced", "waiting"),
    # ...and so does a service whose requests' time is mostly off CPU (else it is CPU: compute_bound)
    (b, "WAITING_SHARE", 0.5, 1, lambda x: cls(service(request_waiting_fraction=x)), "compute_bound", "waiting"),
    # ...while torch's pool rests...
    (b, "POOL_RESTING", 0.2, 1, lambda x: cls(resting(intra_op_busy=x)), "waiting", "balanced"),
    # ...or the loop thread's samples say it waits beside a pool that spins...
    (b, "RESTING_SHARE", 0.5, 1, lambda x: cls(resting(main_thread_busy=0.17, intra_op_busy=0.3, loop_samples=500.0,
                                                       profile={"waiting": x, "native": 1 - x})),
     "balanced", "waiting"),
    # ...and the process's other threads do not work for it
    (b, "OTHER_BUSY", 0.5, 1, lambda x: cls(resting(other_threads_busy=x)), "waiting", "balanced"),
    (b, "PYTHON_SHARE", 0.5, 1, lambda x: cls(cpu(main_cpu_us_per_op=900.0, loop_samples=1000.0,
                                                  profile={"python": x, "native": 1 - x})),
     "compute_bound", "python_bound"),
    (b, "GPU_BUSY", 0.6, 1, lambda x: cls(gpu(gpu_busy_ratio=x)), "balanced", "compute_bound"),
    (b, "GPU_IDLE", 0.3, 1, lambda x: cls(gpu(gpu_busy_ratio=x)), "host_bound", "balanced"),
    (b, "FED", 0.1, 1, lambda x: cls(gpu(gpu_busy_ratio=0.2, data_wait_fraction=x)), "host_bound", "balanced"),
    (b, "FED", 0.1, 1, lambda x: cls(cpu(main_cpu_us_per_op=50.0, data_wait_fraction=x)), "host_bound",
     "balanced"),
    (b, "OPS_MAIN", 0.5, 1, lambda x: cls(cpu(main_thread_busy=x, main_cpu_us_per_op=900.0)), "balanced",
     "compute_bound"),
    (b, "MAIN_SATURATED", 0.6, 1, lambda x: cls(cpu(main_cpu_us_per_op=50.0, main_thread_busy=x)), "balanced",
     "host_bound"),
    (b, "MAIN_SATURATED", 0.6, 1, lambda x: cls(cpu(main_thread_busy=x, intra_op_busy=0.05)), "balanced",
     "host_bound"),
    # no operations counted: the pool decides, beside a main thread busy half of MAIN_SATURATED (docs: 30%)
    (b, "MAIN_SATURATED", 0.6, 0.5, lambda x: cls(cpu(main_thread_busy=x, intra_op_busy=0.9)), "balanced",
     "compute_bound"),
    (b, "POOL_BUSY", 0.5, 0.9, lambda x: cls(cpu(main_thread_busy=0.9, intra_op_busy=x)), "balanced",
     "compute_bound"),
    (b, "POOL_IDLE", 0.25, 0.9, lambda x: cls(cpu(main_thread_busy=0.9, intra_op_busy=x)), "host_bound",
     "balanced"),
    (b, "POOL_IDLE", 0.25, 0.9, lambda x: cls(cpu(main_cpu_us_per_op=2000.0, intra_op_threads=2.0,
                                                  intra_op_busy=x)), NOT_JUDGED, "compute_bound"),
    (b, "HOST_OP_US", 100.0, 1, lambda x: cls(cpu(main_cpu_us_per_op=x)), "host_bound", "balanced"),
    (b, "COMPUTE_OP_US", 500.0, 1, lambda x: cls(cpu(main_cpu_us_per_op=x)), "balanced", "compute_bound"),
    (b, "PROCESS_COMPUTE_CORES", 1.5, 1,
     lambda x: cls(cpu(main_thread_busy=None, intra_op_busy=None, process_cpu_cores=x)), NOT_JUDGED,
     "compute_bound"),
    (b, "WORKERS_WAITING", 0.5, 1,
     lambda x: reason_says("wait for storage", cpu(data_wait_fraction=0.6, data_worker_busy=x,
                                                   io_pressure_fraction=0.5)), "said", "not said"),
    # workers starved of CPU: their run delay as long as their CPU (1 core here)...
    (b, "WORKERS_STARVED", 1.0, 1,
     lambda x: reason_says("starved of CPU", cpu(data_wait_fraction=0.6, data_worker_busy=0.9,
                                                 data_workers_cpu_cores=1.0, data_workers_delay_cores=x,
                                                 data_worker_delay_fraction=1.0)), "not said", "said"),
    # ...and at least half the loop's wait for data
    (b, "WORKERS_DELAYED", 0.5, 1,
     lambda x: reason_says("starved of CPU", cpu(data_wait_fraction=0.6, data_worker_busy=0.9,
                                                 data_workers_cpu_cores=0.5, data_workers_delay_cores=2.0,
                                                 data_worker_delay_fraction=x)), "not said", "said"),
    # storage is named on its evidence only: the host's I/O pressure...
    (b, "STORAGE_PRESSURE", 0.1, 1,
     lambda x: reason_says("wait for storage", cpu(data_wait_fraction=0.6, data_worker_busy=0.1,
                                                   io_pressure_fraction=x)), "not said", "said"),
    # ...or the job's reads from storage
    (b, "STORAGE_READ", 1e6, 1,
     lambda x: reason_says("wait for storage", cpu(data_wait_fraction=0.6, data_worker_busy=0.1,
                                                   storage_read_bytes_per_s=x)), "not said", "said"),
    # a process whose threads want 95% of a CPU or more: its own work explains its requests' waits
    (sig, "SATURATED", 0.95, 1, lambda x: cls(serving(x)), "waiting", "compute_bound"),
    (b, "CONTENDED", 0.2, 1, lambda x: reason_says("CPU contention", cpu(main_cpu_us_per_op=50.0,
                                                                          run_delay_fraction=x)), "not said",
     "said"),
    # the straggler: compute per step 1.5x the others'...
    (sig, "STRAGGLER_RATIO", 1.5, 1, lambda x: straggler(ranks(slow_compute=x)), "none", "straggler"),
    # ...longer by a tenth of its step (3x the others' compute, 2 ms a step more, in a step that is mostly its
    # own collective wait: its wall per step is 0.2 s / x)...
    (sig, "STRAGGLER_SHARE", 0.1, 1, lambda x: straggler(ranks(slow_compute=0.3, others_compute=0.1,
                                                               slow_wait=0.2 / x - 0.3)), "none", "straggler"),
    # ...and the others wait for it, per step, at least half of that difference more than it does (2x the
    # compute, 10 ms a step more; the others wait 0.5 s + x of the 1 s difference in the window)
    (sig, "STRAGGLER_WAITED", 0.5, 1, lambda x: straggler(ranks(slow_compute=2.0, others_wait=0.5 + x)), "none",
     "straggler"),
    # the starved rank: its loop waits for data 30% of its time...
    (sig, "STARVED_WAIT", 0.3, 1, lambda x: starved(ranks(hungry_wait=10 * x, others_coll=5.0)), "none", "starved"),
    # ...the others' median under half of its share...
    (sig, "STARVED_FED", 0.5, 1, lambda x: starved(ranks(hungry_wait=6.0, fed_wait=6.0 * x, others_coll=5.0)),
     "starved", "none"),
    # ...and they wait for it in collectives at least half of its share
    (sig, "STARVED_WAITED", 0.5, 1, lambda x: starved(ranks(hungry_wait=6.0, others_coll=6.0 * x)), "none",
     "starved"),
]
NEAR = 0.02  # just below and just above: 2% of the line either side


def serving(demand: float) -> Signals:
    """A service's window of 10 s: 100 requests of 10 s each finished (100 handled at once, on average), its one
    process's threads using `demand` cores (no run delay)."""
    def sweep(count: int, cpu_s: float) -> list[Family]:
        return [Family("outrider_request_duration_seconds").add(
                    HistogramValue((1.0, 10.0), (0, count, 0), 10.0 * count), "/", "GET", "http", "200", "2xx", "",
                    ""),
                Family("outrider_requests_total").add(float(count), "/", "GET", "http", "200", "2xx", "", ""),
                *threads((0.0, 0.0), (0.0, 0.0)), Family("outrider_thread_cpu_seconds_total").add(cpu_s, "", "",
                                                                                                   "other")]
    return signals(snapshot(sweep(0, 0.0)), snapshot(sweep(100, 10.0 * demand)), 10.0)


@pytest.mark.parametrize(("module", "name", "value", "line", "outcome", "below", "above"), THRESHOLDS,
                         ids=[f"{t[1]}-{i}" for i, t in enumerate(THRESHOLDS)])
def test_each_threshold_keeps_the_documented_value_and_the_verdict_turns_there(
        module: object, name: str, value: float, line: float, outcome: Callable[[float], str], below: str,
        above: str) -> None:
    assert getattr(module, name) == value, f"{name} is {value} in docs/diagnosis.md"
    at = value * line
    assert (outcome(at * (1 - NEAR)), outcome(at * (1 + NEAR))) == (below, above)


def test_every_threshold_constant_is_pinned() -> None:
    """A constant added to the rules without a row in THRESHOLDS fails here."""
    pinned = {(m.__name__, n) for m, n, *_ in THRESHOLDS}  # type: ignore[attr-defined]
    for module in (b, sig):
        names = {n for n, v in vars(module).items() if n.isupper() and isinstance(v, float | int)
                 and not isinstance(v, bool) and n not in UNJUDGED_CONSTANTS}
        assert names <= {n for m, n in pinned if m == module.__name__}, names - {n for _, n in pinned}


# Constants that are not verdict thresholds: how many samples or frames a window needs or keeps
UNJUDGED_CONSTANTS = {"PROFILE_MIN_SAMPLES", "TOP_FRAMES"}


def test_a_rank_computing_twice_as_long_that_nobody_waits_for_is_no_straggler() -> None:
    """2x the others' compute, but they wait in collectives no longer than it does: a heavier shard the job does not
    wait on (an asynchronous rank), not a straggler, and not communication_bound."""
    s = ranks(slow_compute=2.0, slow_wait=0.5, others_wait=0.5)
    assert s.straggler is None and s.straggler_compute_ratio == pytest.approx(2.0)
    assert classify(s).cls != "communication_bound"
    assert "straggler_rank" not in s.evidence()


def test_a_rank_computing_twice_as_long_in_a_step_that_is_mostly_communication_is_no_straggler() -> None:
    """2x the others' compute is 1 ms a step more in a 50 ms step spent in collectives: noise, not a straggler."""
    s = ranks(slow_compute=0.2, others_compute=0.1, slow_wait=4.8, others_wait=4.9)
    assert s.straggler is None and s.straggler_compute_ratio == pytest.approx(2.0)


def test_python_share_threshold_and_the_hottest_line_named() -> None:
    def with_python(share: float) -> b.Verdict:
        return classify(cpu(main_cpu_us_per_op=900.0, loop_samples=1000.0,
                            profile={"python": share, "native": 1 - share},
                            top_frames=[("native", "torch/nn/modules/linear.py:125 forward", 1 - share),
                                        ("python", "train.py:12 tokenize", share)]))

    assert with_python(b.PYTHON_SHARE - EPS).cls == "compute_bound"
    v = with_python(b.PYTHON_SHARE + EPS)
    assert v.cls == "python_bound" and "train.py:12 tokenize" in v.reason, v.reason
    assert v.evidence["in_python_fraction"] == pytest.approx(b.PYTHON_SHARE + EPS)
    # a GPU pacing the steps is compute-bound however much Python the host runs beside it
    assert classify(cpu(gpus=1, gpu_util=0.9, gpu_busy_ratio=0.9, loop_samples=1000.0,
                        profile={"python": 0.9})).cls == "compute_bound"


def test_a_loop_at_rest_waits_never_idle_nor_compute_bound() -> None:
    """0.036 cores, a loop sleeping 0.66 s a step: the pool's spin after each op once made it compute_bound, and a
    rule for loops at rest called it idle under the steps it counted. It steps: it waits, at the line it sleeps on."""
    at_rest = resting(process_cpu_cores=0.036, main_thread_busy=0.03, loop_waiting_fraction=0.97,
                      loop_samples=500.0, profile={"waiting": 0.97, "native": 0.03},
                      top_frames=[("waiting", "train.py:30 main", 0.97)])
    v = classify(at_rest)
    assert v.cls == "waiting" and "train.py:30 main" in v.reason and "off CPU 97%" in v.reason, v.reason
    # the pool spinning on a crowded machine, the loop thread's samples mostly waiting: waiting all the same
    assert classify(resting(main_thread_busy=0.17, intra_op_busy=b.POOL_RESTING + EPS, loop_samples=500.0,
                            profile={"waiting": 0.83, "native": 0.17})).cls == "waiting"
    # a loop that waits for its own process's threads (a producer thread) waits on the job's work, not outside it
    assert classify(resting(other_threads_busy=0.9)).cls != "waiting"
    # without operations counted the pool decides, but only beside a busy main thread
    assert classify(cpu(main_thread_busy=0.25, intra_op_busy=0.3)).cls != "compute_bound"
    assert classify(cpu(main_thread_busy=0.9, intra_op_busy=0.9)).cls == "compute_bound"
    # however long the loop waits, a process that steps or serves is never idle
    for active in (resting(process_cpu_cores=0.0), service(process_cpu_cores=0.0),
                   service(requests_per_s=0.0, requests_in_flight=1.0, request_latency_s=None)):
        assert classify(active).cls != "idle", active


def test_a_service_is_judged_on_its_requests() -> None:
    """Handlers waiting 50 ms downstream on 1 ms of CPU wait; handlers whose time is CPU are compute_bound; a
    request in flight with none finished says how many, and waits only where the process's threads rest."""
    v = classify(service())
    assert v.cls == "waiting" and v.reason.startswith(
        "handlers wait: 50 ms per request (mean latency), 1 ms of CPU and 0 s waiting for a CPU per request; 98% of "
        "the requests' time off CPU, outside the process"), v.reason
    queued = classify(service(request_queue_s=0.01)).reason
    assert "0 s waiting for a CPU per request, 10 ms of it queued; " in queued, queued
    busy = classify(service(request_cpu_s=0.04, request_waiting_fraction=0.2, demand_per_process=0.9))
    assert busy.cls == "compute_bound" and busy.reason.startswith(
        "the requests' time is CPU: 50 ms per request (mean latency), 40 ms of CPU"), busy.reason
    assert "More worker processes" in busy.recommendation and "CUDA" not in busy.recommendation
    held = classify(service(requests_per_s=0.0, requests_in_flight=3.0, request_latency_s=None))
    assert held.cls == "waiting" and held.reason.startswith("3 requests in flight and none finished"), held.reason
    working = service(requests_per_s=0.0, requests_in_flight=3.0, request_latency_s=None,
                      request_waiting_fraction=0.1)
    assert classify(working).cls == NOT_JUDGED
    # a GPU decides a service whose requests are not waiting: the GPU's rules, not the CPU's
    assert classify(service(request_waiting_fraction=0.1, gpus=1, gpu_util=0.9)).cls == "compute_bound"
    assert "CPU:" not in classify(service(request_waiting_fraction=0.1, gpus=1, gpu_util=0.9)).reason
    assert classify(service(request_waiting_fraction=None)).cls != "waiting", "no CPU measured: not split"
    # a loop that also answers requests is judged as a loop
    assert classify(service(steps_per_s=5.0, main_thread_busy=0.9, main_cpu_us_per_op=50.0)).cls == "host_bound"


def test_a_window_without_per_thread_cpu_is_not_judged_and_never_votes() -> None:
    v = classify(cpu(main_thread_busy=None, intra_op_busy=None))
    assert v.cls == NOT_JUDGED and v.cls not in b.CLASSES and not v.judged and "per-thread" in v.reason
    assert classify(cpu(ops_counted=True, main_cpu_us_per_op=None)).cls == NOT_JUDGED
    tally = VerdictTally()
    tally.add(NOT_JUDGED, "no per-thread CPU", {}, 0.0, 30.0)
    tally.add("input_bound", "waits", {"data_wait_fraction": 0.6}, 30.0, 35.0)
    r = tally.result()
    assert r.cls == "input_bound" and r.share == 1.0 and "not judged 30" in r.headline(), r.headline()
    only = VerdictTally()
    only.add(NOT_JUDGED, "no per-thread CPU", {}, 0.0, 30.0)
    assert only.result().cls == "" and "not judged" in only.result().headline()


def test_the_first_window_is_judged_from_the_first_sweep_with_per_thread_cpu() -> None:
    """Per-thread CPU appears after the first step; a 30 s window is judged from the sweep that first has it,
    not called 'balanced' for 30 s."""
    def sweep(t: float, with_threads: bool) -> list[Family]:
        fams = [*loop(0, t, steps=int(100 * t) + 1), Family("outrider_watched_cpu_seconds_total").add(t, "user")]
        if with_threads:  # a host-bound loop: main thread saturated by tiny operations (50 us each)
            fams += [*threads((t, 0.0), (0.01 * t, 0.0)),
                     Family("outrider_train_autograd_ops_total").add(t / 50e-6, "", "")]
        return fams

    w = VerdictWindow(30.0)
    w.add(sweep(1.0, False), now=1.0)
    v = w.add(sweep(2.0, True), now=2.0)
    assert v is not None and v.cls == NOT_JUDGED, "the counters appeared in this sweep: nothing to compare yet"
    v = w.add(sweep(3.0, True), now=3.0)
    assert v is not None and v.cls == "host_bound", v


def test_input_bound_on_the_loops_own_time_under_contention() -> None:
    """A loop waiting on storage 2 s of 10, whose step is stretched by neighbours (its thread waited 7 s for a
    CPU, ran 1 s): 20% measured, two thirds of its own time. Alone (8 s of CPU in the step) it is not input-bound."""
    old = loop(0, 0, steps=10) + ZERO
    crowded = classify(signals(snapshot(old), snapshot(loop(2.0, 8.0, steps=110) + threads((1.0, 7.0), (0.1, 0.0))),
                               10.0))
    assert crowded.cls == "input_bound", crowded.reason
    assert crowded.evidence["data_wait_fraction"] == pytest.approx(0.2)
    assert crowded.evidence["data_wait_alone_fraction"] == pytest.approx(2.0 / 3.0, abs=1e-3)
    assert "of its own time" in crowded.reason
    alone = classify(signals(snapshot(old), snapshot(loop(2.0, 8.0, steps=110) + threads((8.0, 0.0), (0.1, 0.0))),
                             10.0))
    assert alone.cls != "input_bound" and alone.evidence["data_wait_alone_fraction"] == pytest.approx(0.2)


def test_input_bound_says_what_the_loop_waits_for_from_its_evidence() -> None:
    """The data pipeline's CPU, CPU starvation, storage or something else, each from its own evidence: storage only
    with reads or I/O pressure, starvation only with the workers' run delay; and the advice follows."""
    def io(read: float, stalled: float) -> list[Family]:
        return [Family("outrider_watched_io_bytes_total").add(read, "read").add(0.0, "write"),
                Family("outrider_host_pressure_stalled_seconds_total").add(stalled, "io", "some")]

    def judged(read: float, stalled: float, workers: tuple[float, float], processes: int = 2) -> b.Verdict:
        cpu_s, delay_s = workers
        new = loop(7.0, 3.0, steps=110) + io(read, stalled) + threads((3.0, 0.0), (0.1, 0.0))
        new += [Family("outrider_thread_cpu_seconds_total").add(cpu_s, "", "", "data_workers"),
                Family("outrider_thread_run_delay_seconds_total").add(delay_s, "", "", "data_workers"),
                Family("outrider_threads").add(3.0 * processes - 1, "", "", "data_workers"),
                Family("outrider_child_processes").add(float(processes), "", "")]
        return classify(signals(snapshot(loop(0, 0, steps=10) + ZERO + io(0.0, 0.0)), snapshot(new), 10.0))

    storage = judged(250e6, 4.0, (1.0, 0.0))
    assert storage.cls == "input_bound"
    assert storage.reason.endswith("; the DataLoader workers (each busy 5% of the time) wait for storage: 23.8 MiB/s "
                                   "read from storage, I/O pressure on the host 40%"), storage.reason
    assert storage.evidence["storage_read_bytes_per_s"] == 25e6 and storage.evidence["data_worker_busy"] == 0.05
    assert storage.recommendation.startswith("Storage paces the loader")
    elsewhere = judged(0.0, 0.0, (1.0, 0.0))
    assert "wait off CPU, and not for storage (0 B/s read from storage, I/O pressure on the host 0%)" in \
        elsewhere.reason
    assert elsewhere.recommendation.startswith("The loader waits for something that is neither a CPU nor storage")
    decode = judged(0.0, 0.0, (19.0, 0.0))
    assert "the data pipeline's CPU: the DataLoader workers decode, each busy 95% of the time" in decode.reason
    assert decode.recommendation.startswith("The data pipeline's CPU paces the loop")
    assert "GPU" not in decode.recommendation and "pin_memory" not in decode.recommendation, "a CPU job"
    # two CPU hogs beside the job: the workers wait for a CPU 16 s against 0.7 s used, reading next to nothing
    starved = judged(0.8e6, 0.0, (0.7, 16.0))
    assert starved.cls == "input_bound" and "storage" not in starved.reason.split("(")[0]
    assert "the DataLoader workers are starved of CPU: 1.60 s a second waiting for a CPU and 0.07 s on one, each " \
           "worker 80% of the time waiting (78.1 KiB/s read from storage)" in starved.reason, starved.reason
    assert "Fewer DataLoader workers" in starved.recommendation and "more workers would wait longer" in \
        starved.recommendation
    assert starved.evidence["data_workers_delay_cores"] == 1.6
    # a wake-up's delay after each sleep or read is no starvation: 1 s waiting for a CPU against 0.5 s used, each
    # worker 5% of the time; said beside what they wait for
    woken = judged(0.0, 0.0, (0.5, 1.0))
    assert "starved" not in woken.reason and "a sleep in the loader; they also wait for a CPU (0.10 s a second " \
        "waiting for a CPU and 0.05 s on one, each worker 5% of the time waiting); slowed by" in woken.reason, woken
    # ...and the advice puts CPUs before more workers there, and only there
    assert woken.recommendation.endswith(b.CPUS_SHORT) and woken.recommendation.startswith("The loader waits")
    assert judged(0.0, 0.0, (0.5, 0.5)).recommendation.endswith(b.CPUS_SHORT), "as long as their CPU"
    for calm in (elsewhere, decode, storage, starved, judged(0.0, 0.0, (0.5, 0.49))):
        assert not calm.recommendation.endswith(b.CPUS_SHORT), calm.recommendation
    assert not b.workers_wait_for_cpus(cpu(data_workers_delay_cores=0.0)), "no wait at all is not as long as none"
    # no workers: the loader on the loop's saturated thread is its CPU; an idle thread waits off CPU
    inline = classify(cpu(data_wait_fraction=0.6, main_thread_busy=0.9))
    assert "the loader works on the loop's thread (no DataLoader workers; busy 90%" in inline.reason, inline.reason
    assert inline.recommendation.startswith("The data pipeline's CPU paces the loop: the loader runs on the loop's")
    assert "waits off CPU, and not for storage" in classify(cpu(data_wait_fraction=0.6, main_thread_busy=0.1)).reason


def test_a_service_is_a_window_of_requests_without_steps() -> None:
    """Requests finished or in flight, and no steps: a loop that also answers requests is judged as a loop."""
    none = {"steps_per_s": 0.0, "requests_per_s": 0.0, "requests_in_flight": None}
    assert [b.serving(Signals(window_s=1.0, **{**none, **kw})) for kw in (  # type: ignore[arg-type]
        {}, {"requests_per_s": 0.5}, {"requests_in_flight": 0.5}, {"requests_in_flight": 0.0},
        {"requests_per_s": 0.5, "steps_per_s": 0.5}, {"requests_in_flight": 2.0, "steps_per_s": 0.5})] == \
        [False, True, True, False, False, False]


def test_what_the_loop_waits_for_is_not_said_without_per_thread_cpu() -> None:
    assert b.input_cause(cpu(data_wait_fraction=0.6, main_thread_busy=None)) == ""
    assert b.input_cause(cpu(data_wait_fraction=0.6, data_workers_cpu_cores=1.0)) == "", "workers without a count"
    assert b.input_cause(cpu(data_wait_fraction=0.6)) == "loop_cpu"
    assert classify(cpu(steps_per_s=0.0, process_cpu_cores=0.5)).recommendation == b.NOT_JUDGED_ADVICE


def test_no_accelerator_advice_without_an_accelerator() -> None:
    """A CPU job (no GPU, or a torch that never initialised CUDA on a GPU node) never reads about CUDA, GPUs or
    tensor cores; a job with one does where it helps."""
    words = ("CUDA", "GPU", "tensor cores", "accelerator underused")
    cpu_only = [cpu(main_cpu_us_per_op=900.0), cpu(main_cpu_us_per_op=50.0), cpu(data_wait_fraction=0.6),
                cpu(host_mem_available_ratio=0.01), cpu(collective_wait_fraction=0.5, data_wait_fraction=0.0),
                cpu(data_wait_fraction=0.6, data_worker_busy=0.9), cpu(gpus=1, gpu_util=0.0, torch_cpu_only=True,
                                                                     main_cpu_us_per_op=900.0)]
    for s in cpu_only:
        v = classify(s)
        assert v.judged
        said = [w for w in words if w in v.recommendation or w in v.reason]
        assert said == [], (v.cls, said, v.recommendation)
    with_gpu = classify(gpu(gpu_busy_ratio=0.9))
    assert with_gpu.cls == "compute_bound" and "tensor cores" in with_gpu.recommendation
    assert "CUDA graphs" in classify(gpu(gpu_busy_ratio=0.1)).recommendation
    assert "PYTORCH_CUDA_ALLOC_CONF" in classify(gpu(gpu_mem_ratio=0.99)).recommendation
    assert "on the GPU" in classify(gpu(data_wait_fraction=0.6, data_worker_busy=0.9,
                                        gpu_busy_ratio=0.1)).recommendation
    short = classify(gpu(data_wait_fraction=0.6, data_worker_busy=0.9, gpu_busy_ratio=0.1, data_workers_cpu_cores=1.0,
                         data_workers_delay_cores=1.0, data_worker_delay_fraction=0.25)).recommendation
    assert "on the GPU" in short and short.endswith(b.CPUS_SHORT), short


def test_the_starved_rank_is_named_and_a_rank_that_merely_waits_is_not() -> None:
    """Rank 1 waits 6 s of 10 for data; ranks 0, 2 and 3 wait 5 s in collectives for it: rank 1 is named, not an
    average of 15% data wait and 'collectives evenly across ranks'."""
    def judged(hungry_wait: float, others_coll: float) -> b.Verdict:
        old = [f for r in "0123" for f in loop(0, 0, rank=r, collective_wait=0.0, steps=10)] + ZERO
        new = []
        for r in "0123":
            if r == "1":
                new += loop(hungry_wait, 10.0 - hungry_wait, rank=r, collective_wait=0.2, steps=110)
            else:
                new += loop(0.0, 10.0, rank=r, collective_wait=others_coll, steps=110)
        return classify(signals(snapshot(old), snapshot(new + threads((8.0, 0.0), (1.0, 0.0), processes=4)), 10.0))

    v = judged(6.0, 5.0)
    assert v.cls == "input_bound" and "rank 1 is starved by its DataLoader: 60%" in v.reason, v.reason
    assert v.evidence["starved_rank"] == 1
    assert "starved_rank" not in judged(6.0, 1.0).evidence, "the others do not wait for it: not starving them"
    assert "starved_rank" not in judged(STARVED_WAIT * 10 - 0.5, 5.0).evidence, "under the line"


def test_milliseconds_per_operation_beside_an_idle_pool_are_not_math() -> None:
    """On a crowded machine the main thread spins at libgomp's barriers after each parallel region: its CPU per
    operation grows while the pool, which would share any real math, idles. Not judged, not compute_bound."""
    spinning = classify(cpu(main_cpu_us_per_op=2000.0, intra_op_threads=2.0, intra_op_busy=b.POOL_IDLE * 0.9 - EPS))
    assert spinning.cls == NOT_JUDGED and "pool" in spinning.reason
    math = classify(cpu(main_cpu_us_per_op=2000.0, intra_op_threads=2.0, intra_op_busy=b.POOL_IDLE * 0.9 + EPS))
    assert math.cls == "compute_bound"
    assert classify(cpu(main_cpu_us_per_op=2000.0, intra_op_threads=1.0, intra_op_busy=0.0)).cls == "compute_bound"


def test_the_containers_memory_limit_is_memory_pressure_at_its_threshold() -> None:
    kw = {"main_cpu_us_per_op": 50.0, "data_wait_fraction": 0.05, "host_mem_available_ratio": 0.6}
    assert classify(cpu(**kw, container_mem_ratio=b.CONTAINER_MEMORY - EPS)).cls != "memory_pressure"
    v = classify(cpu(**kw, container_mem_ratio=b.CONTAINER_MEMORY + EPS))
    assert v.cls == "memory_pressure" and "memory limit" in v.reason, "the host has memory to spare: the limit rules"
    assert b.CONTAINER_MEMORY == 0.95


def test_the_container_ratio_comes_from_the_cgroup_families() -> None:
    def sweep(ws: float) -> list[Family]:
        return [Family("outrider_cgroup_memory_working_set_bytes").add(ws),
                Family("outrider_cgroup_memory_limit_bytes").add(1000.0)]
    s = signals(snapshot(sweep(900.0)), snapshot(sweep(970.0)), 10.0)
    assert s.container_mem_ratio == pytest.approx(0.97)
    no_limit = signals(snapshot([Family("outrider_cgroup_memory_working_set_bytes").add(1.0)]),
                       snapshot([Family("outrider_cgroup_memory_working_set_bytes").add(2.0)]), 10.0)
    assert no_limit.container_mem_ratio is None, "no limit set: no ratio, never a ratio over zero"
