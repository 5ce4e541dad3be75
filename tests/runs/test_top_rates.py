"""`outrider top`'s rates over the window between two sweeps' publications, timed by the publishers' heartbeats the
agent serves (metrics/rate.py): an agent sweeping every 5 s read every 2 s once showed a running job at 0 steps/s
on one screen and 2.5x its rate on the next, and later a service at 690-830 req/s for 20 s after its client had
stopped. top reads every half second, draws every 2 s, and states the window."""

from __future__ import annotations

import math
import re

from outrider.commands.top import Reads, frame, parse, render_text

TRUE = 40.0  # steps per second
EPOCH = 1_700_000_000.0


def metrics(t: float, sweep_s: float = 5.0, stop_s: float = math.inf) -> str:
    """/metrics at time t of an agent sweeping every sweep_s a job at TRUE steps/s until stop_s (32 samples a
    step, 30% of its loop waiting for data) whose hook publishes every second, and p50 step times that change
    after 60 s: each sweep serves the hook's last publication and its heartbeat."""
    swept = sweep_s * math.floor(t / sweep_s)
    at = math.floor(swept - 0.6) + 0.6  # the hook flushes at .6 of every second
    worked = min(at, stop_s)
    steps = TRUE * worked
    slow = worked > 60
    fast_steps = TRUE * min(worked, 60.0)
    return (f'outrider_train_steps_total{{rank=""}} {steps}\n'
            f'outrider_samples_total{{rank=""}} {32 * steps}\n'
            f'outrider_train_loop_seconds_total{{part="step",rank=""}} {0.7 * worked}\n'
            f'outrider_train_loop_seconds_total{{part="data_wait",rank=""}} {0.3 * worked}\n'
            f'outrider_train_step_duration_seconds_bucket{{le="0.01",rank=""}} {fast_steps}\n'
            f'outrider_train_step_duration_seconds_bucket{{le="0.1",rank=""}} {steps}\n'
            f'outrider_train_step_duration_seconds_bucket{{le="+Inf",rank=""}} {steps}\n'
            f'outrider_train_step_duration_seconds_sum{{rank=""}} {0.025 * steps if slow else 0.005 * steps}\n'
            f'outrider_train_step_duration_seconds_count{{rank=""}} {steps}\n'
            f'outrider_hook_last_heartbeat_timestamp_seconds{{pid="7",rank=""}} {EPOCH + at}\n')


def test_every_screen_of_a_running_job_shows_its_true_rate_or_says_it_is_measuring() -> None:
    reads = Reads()
    shown = []
    for i in range(360):  # three minutes of reads every half second, of a job running for a while already
        t = 0.5 * i + 10.3
        reads.add(t, parse(metrics(t)))
        if i % 4:
            continue  # a screen every 2 s
        screen = render_text(frame(reads, "http://agent"), 160)
        m = re.search(r"training +(\S+) steps/s +(\S+) samples/s(?: +data wait (\d+)%)?", screen)
        assert m, screen
        shown.append((m.group(1), m.group(2), m.group(3)))
    measuring = [s for s in shown if s[0] == "…"]
    assert 0 < len(measuring) <= 3, "the first screens say the rate is not known yet: until a second sweep"
    assert all(s[0] == "…" for s in shown[:len(measuring)])
    assert {s[0] for s in shown[len(measuring):]} == {"40"}
    assert {s[1] for s in shown[len(measuring):]} == {"1,280"}
    assert {s[2] for s in shown[len(measuring):]} == {"30"}
    assert re.search(r"step time p50 [\d.]+ ms +p99 [\d.]+ ms +over 5 s\n", screen), screen


def test_a_job_that_stops_reads_zero_from_the_second_sweep_after_the_stop() -> None:
    """It stops at 42.3 s: the sweep at 45 s holds its last 1.3 s of steps (its window opens at the publication
    seen at 40 s); every screen from the sweep at 50 s reads 0."""
    reads = Reads()
    after = []
    for i in range(160):
        t = 0.5 * i
        reads.add(t, parse(metrics(t, stop_s=42.3)))
        m = re.search(r"training +(\S+) steps/s", render_text(frame(reads, "http://agent"), 160))
        assert m
        if t >= 45:
            after.append((t, m.group(1)))
    assert all(rate == "0" for t, rate in after if t >= 50), after
    assert all(rate not in ("0", "40") for t, rate in after if t < 50), after


def test_the_step_time_percentiles_are_over_the_same_window() -> None:
    reads = Reads()
    for i in range(120):
        t = 0.5 * i
        reads.add(t, parse(metrics(t)))
    early = render_text(frame(reads, "http://agent"), 160)
    assert re.search(r"step time p50 [\d.]+ ms", early), early
    for i in range(120, 240):
        t = 0.5 * i
        reads.add(t, parse(metrics(t)))
    late = render_text(frame(reads, "http://agent"), 160)
    p50 = float(re.search(r"step time p50 ([\d.]+) ms", late).group(1))  # type: ignore[union-attr]
    assert p50 > 10, "the window's steps (all slow by now), not the whole run's"


def test_the_advice_follows_the_evidence_the_agent_serves_beside_the_verdict() -> None:
    """input_bound with its workers starved of CPU: top says fewer workers or more CPUs, as the run's summary does,
    not the decoding advice's "more workers"; a CPU job never reads about the GPU."""
    def screen(evidence: dict[str, float]) -> str:
        text = "".join(f'outrider_bottleneck{{class="{c}"}} {1 if c == "input_bound" else 0}\n'
                       for c in ("idle", "input_bound", "waiting"))
        text += "".join(f'outrider_diagnosis_signal{{signal="{k}"}} {v}\n' for k, v in evidence.items())
        reads = Reads()
        reads.add(0.0, parse(text))
        return " ".join(render_text(frame(reads, "http://agent"), 200).split())

    starved = {"steps_per_s": 20.0, "data_wait_fraction": 0.6, "data_worker_busy": 0.8, "data_workers_cpu_cores": 0.1,
               "data_workers_delay_cores": 1.6, "data_worker_delay_fraction": 0.8, "gpus": 0.0}
    shown = screen(starved)
    assert re.search(r"verdict +input_bound", shown) and "Fewer DataLoader workers" in shown, shown
    decoding = screen({**starved, "data_workers_delay_cores": 0.0})
    advice = decoding.split("verdict input_bound ", 1)[1].split(" alerts ", 1)[0]
    assert advice.startswith("The data pipeline's CPU paces the loop") and "GPU" not in advice, decoding
