"""The loop's decomposition (hook/loop.py): wall = data wait + step + other, exactly, for every way a loop can be
timed; collective wait only inside the step; and GPU busy per step from step-end CUDA events (hook/gpu_pacing.py),
whatever the unknown offset between the GPU's clock and the host's."""

from __future__ import annotations

import pytest

from outrider.hook.gpu_pacing import GpuPacing
from outrider.hook.loop import LoopAccount


def parts(it: object) -> tuple[float, ...]:
    return tuple(round(getattr(it, k), 9) for k in ("wall", "data_wait", "step", "other", "collective_wait"))


def test_the_first_step_opens_the_accounting() -> None:
    loop = LoopAccount()
    loop.add_wait(0.5, 0.9)
    assert loop.step(0.0, 1.0) is None, "no previous end: nothing to split"
    assert not loop.waits, "its waits are consumed with it"


def test_automatic_steps_split_exactly() -> None:
    """for batch in loader: (wait 0.3) train (0.5); log (0.2): the optimizer hook ends each step."""
    loop = LoopAccount()
    loop.step(0.0, 10.0)
    loop.add_wait(10.2, 10.5)  # after 0.2 of logging, the loader is asked for the next batch
    it = loop.step(0.0, 11.0)
    assert parts(it) == (1.0, 0.3, 0.5, 0.2, 0.0)


def test_gradient_accumulation_counts_every_wait_and_all_the_work_between() -> None:
    loop = LoopAccount()
    loop.step(0.0, 10.0)
    for k in range(4):  # four micro-batches of 0.1 wait + 0.15 compute, from 10.0 on
        loop.add_wait(10.0 + 0.25 * k, 10.1 + 0.25 * k)
    it = loop.step(0.0, 11.0)
    assert parts(it) == (1.0, 0.4, 0.6, 0.0, 0.0)


def test_explicit_step_timing_and_data_in_memory() -> None:
    loop = LoopAccount()
    loop.step(0.0, 10.0)
    loop.add_wait(10.1, 10.3)  # fetched before the timed step
    it = loop.step(10.5, 11.0)  # with outrider.step(): 10.5 .. 11.0
    assert parts(it) == (1.0, 0.2, 0.5, 0.3, 0.0)
    it = loop.step(0.0, 12.0)  # no loader, no explicit begin: the iteration is all step
    assert parts(it) == (1.0, 0.0, 1.0, 0.0, 0.0)


def test_waits_of_later_iterations_wait_for_their_step() -> None:
    loop = LoopAccount()
    loop.step(0.0, 10.0)
    loop.add_wait(10.0, 10.4)
    loop.add_wait(11.1, 11.3)  # already the next iteration's (the publisher drains between steps)
    assert parts(loop.step(0.0, 11.0)) == (1.0, 0.4, 0.6, 0.0, 0.0)
    assert parts(loop.step(0.0, 12.0)) == (1.0, 0.2, 0.7, 0.1, 0.0)


def test_collective_wait_is_inside_the_step_only() -> None:
    loop = LoopAccount()
    loop.step(0.0, 10.0)
    loop.add_collective(10.05, 10.1, blocking=True)  # a metrics all_reduce while logging: not the step's
    loop.add_wait(10.1, 10.2)
    loop.add_collective(10.6, 10.8, blocking=True)  # dist.all_reduce(grads) in the step
    it = loop.step(0.0, 11.0)
    assert parts(it) == (1.0, 0.1, 0.8, 0.1, 0.2)


def test_ddp_buckets_wait_only_for_what_outlasts_the_last_launch() -> None:
    """Buckets launched during the backward overlap it; the loop waits from the last launch to the last
    completion."""
    loop = LoopAccount()
    loop.step(0.0, 10.0)
    loop.add_wait(10.0, 10.1)
    for launch, done in ((10.4, 10.6), (10.5, 10.75), (10.7, 10.9)):
        loop.add_collective(launch, done, blocking=False)
    it = loop.step(0.0, 11.0)
    assert it is not None and it.collective_wait == pytest.approx(0.2)


def test_a_lapped_ring_restarts_the_accounting() -> None:
    loop = LoopAccount()
    loop.step(0.0, 10.0)
    loop.restart()
    assert loop.step(0.0, 50.0) is None


def test_pending_intervals_are_bounded() -> None:
    loop = LoopAccount()
    for i in range(20_000):  # a loader iterated outside any training loop
        loop.add_wait(float(i), i + 0.5)
    assert len(loop.waits) <= 4096 and loop.lost > 0


# --- GPU busy per step ---------------------------------------------------------------------------------------------

def drive(pacing: GpuPacing, host: list[float], gpu: list[float], ages: dict[int, float] | None = None) \
        -> tuple[float, float]:
    """Feed markers recorded at host times `host`, completed on the GPU at `gpu` (on a clock with an unknown
    offset: only differences are given, as elapsed_time does); sums (busy, wall)."""
    busy = wall = 0.0
    for k, h in enumerate(host):
        interval = None if k == 0 else gpu[k] - gpu[k - 1]
        out = pacing.marker(h, interval, (ages or {}).get(k, 0.0))
        if out is not None:
            busy += out[0]
            wall += out[1]
    return busy, wall


def test_gpu_that_keeps_up_with_the_host_is_not_busy_per_step() -> None:
    host = [0.01 * k for k in range(200)]
    gpu = [1000.0 + h + 0.0002 for h in host]  # each marker done 0.2 ms after it was queued
    busy, wall = drive(GpuPacing(), host, gpu)
    assert busy / wall < 0.05


def test_gpu_that_paces_the_host_is_busy_the_whole_step() -> None:
    """The host queues ahead until the GPU holds it back: every marker completes 3 steps after it was recorded. A
    poll saw the oldest marker pending for 25 ms, which fixes the unknown constant."""
    host = [0.01 * k for k in range(200)]
    gpu = [-77.0 + h + 0.03 for h in host]
    busy, wall = drive(GpuPacing(), host, gpu, ages={5: 0.025})
    assert busy / wall > 0.95


def test_a_sync_after_each_step_shows_as_the_share_the_host_waited() -> None:
    """loss.item() after the optimizer step: the GPU still had 6 ms of a 10 ms step queued at each step end. A lag
    that never changes cannot be told from none by the events alone; the publisher's polls (once a second, at
    random moments) now and then find the newest marker pending, and how long for anchors it."""
    host, gpu, t = [], [], 0.0
    for _ in range(300):
        t += 0.004  # host launches for 4 ms
        host.append(t)
        gpu.append(t + 0.006)  # the GPU finishes 6 ms later; the host waits for it in .item()
        t += 0.006
    assert drive(GpuPacing(), host, gpu)[0] == pytest.approx(0.0, abs=1e-9), "no anchor: no claim"
    polls = {10: 0.0021, 40: 0.0057, 90: 0.0044, 150: 0.0059}  # pending for so long when a poll looked
    busy, wall = drive(GpuPacing(), host, gpu, ages=polls)
    # the estimate only grows with its anchors: 2.1 ms for steps 11-40, 5.7 for 41-150, 5.9 from 151 on
    expected = (30 * 0.0021 + 110 * 0.0057 + 149 * 0.0059) / (299 * 0.010)
    assert busy / wall == pytest.approx(expected, abs=0.005)


def test_a_lost_marker_restarts_the_chain() -> None:
    pacing = GpuPacing()
    assert pacing.marker(1.0, None) is None
    assert pacing.marker(1.01, 0.01) is not None
    assert pacing.marker(2.0, None) is None, "the previous marker unknown: a new chain"
