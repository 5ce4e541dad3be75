"""The Hook: registration limits, publishing, stalls, the agent-side merge, fork and spool failures."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.ground.clock import Clock
from outrider.ground.config import Config
from outrider.hook.progress import Progress
from outrider.hook.runtime import Hook, Identity
from outrider.hook.series import NoopSeries
from outrider.hook.settings import HookSettings
from outrider.metrics.exposition import render
from tests.helpers import samples, value


def hook(spool: Path, identity: Identity | None = None, **kw: object) -> Hook:
    return Hook(HookSettings(spool_dir=str(spool), standalone=False, **kw), identity)  # type: ignore[arg-type]


def agent_view(spool: Path, flush_s: float = 1.0) -> tuple[HookCollector, dict]:  # type: ignore[type-arg]
    c = HookCollector(CollectorContext(Config(spool_dir=str(spool), flush_interval_s=flush_s)))
    return c, samples(render(c.collect()).decode())


def steps(h: Hook, n: int, duration_s: float = 0.2) -> None:
    """n steps as the hook's drain reports them from the hot path's ring."""
    import time as t

    h.progress.record_steps(n, t.perf_counter(), [duration_s] * n)


def test_invalid_and_excess_series_are_refused_and_counted(tmp_path: Path) -> None:
    h = hook(tmp_path, hook_max_series_per_metric=3)
    assert isinstance(h.series("counter", "bad name"), NoopSeries)
    assert isinstance(h.series("counter", "outrider_fake_total"), NoopSeries), "the outrider_ prefix is reserved"
    assert isinstance(h.series("counter", "x_total", {"rank": "1"}), NoopSeries)
    for name in ("up", "scrape_samples_scraped", "ALERTS_FOR_STATE", "__x"):  # Prometheus's own series
        assert isinstance(h.series("gauge", name), NoopSeries), name
    assert isinstance(h.series("gauge", "x", {"__name__": "y"}), NoopSeries), "a label Prometheus keeps"
    assert isinstance(h.series("counter", "x_total", {"k": "v" * 500}), NoopSeries)
    for i in range(5):  # a request id used as a label: capped at 3 series
        h.series("counter", "req_total", {"id": str(i)}).inc()
    h.series("counter", "req_total", {"other": "x"})
    assert h.drop.counts == {"invalid_name": 1, "reserved_name": 5, "invalid_label_name": 2,
                             "invalid_label_value": 1, "series_limit_per_metric": 2, "inconsistent_label_names": 1}
    h.flush()
    _, parsed = agent_view(tmp_path)
    assert value(parsed, "outrider_hook_dropped_total", reason="series_limit_per_metric", rank="") == 2
    assert sum(1 for (n, _) in parsed if n == "req_total") == 3


@pytest.mark.parametrize(("durations", "typical"), [
    ([], 0.0), ([0.0, 0.0], 0.0), ([0.5], 0.5), ([0.4, 0.1, 0.3, 0.2], 0.3), ([0.0, 0.9, 0.1, 0.0, 0.5], 0.5),
    ([0.2, 0.1, 0.3], 0.2),
])
def test_the_typical_step_is_the_upper_median_of_the_recent_timed_ones(durations: list[float],
                                                                        typical: float) -> None:
    """One median judges both a stall (stall_factor times it) and an idle loop (the profiler's IDLE_STEPS)."""
    p = Progress(stall_factor=10.0, stall_floor_s=1.0)
    p.record_steps(max(1, len(durations)), 1.0, durations)
    assert p.typical_step_s() == typical
    assert p._step_threshold() == max(10.0 * typical, 1.0)


def test_publish_and_merge_two_processes_by_rank(tmp_path: Path) -> None:
    for pid, rank, n in ((os.getpid(), "0", 3), (os.getppid(), "1", 5)):
        h = hook(tmp_path, Identity(pid=pid, rank=rank, training_job="job-a"))
        for _ in range(n):
            h.series("histogram", "outrider_train_step_duration_seconds", builtin=True).observe(0.2)
        steps(h, n)
        h.flush()
    _, parsed = agent_view(tmp_path)
    assert value(parsed, "outrider_train_steps_total", rank="0", training_job="job-a") == 3
    assert value(parsed, "outrider_train_steps_total", rank="1", training_job="job-a") == 5
    assert value(parsed, "outrider_train_step_duration_seconds_count", rank="1", training_job="job-a") == 5
    assert value(parsed, "outrider_hook_processes", state="running") == 2
    assert value(parsed, "outrider_train_last_step_timestamp_seconds", rank="0", training_job="job-a") > \
        time.time() - 60
    assert value(parsed, "outrider_train_start_timestamp_seconds", rank="1", training_job="job-a") is not None


def test_nothing_publishes_until_there_is_data(tmp_path: Path) -> None:
    h = hook(tmp_path)
    h.flush()
    assert list(tmp_path.glob("*.shard")) == []


def test_a_closed_process_is_retired_counters_stay_and_its_shard_goes(tmp_path: Path) -> None:
    h = hook(tmp_path)
    h.series("counter", "work_total").inc(10)
    h.flush()
    c, parsed = agent_view(tmp_path)
    assert value(parsed, "work_total", rank="") == 10
    h.series("counter", "work_total").inc(5)
    h.close()
    parsed = samples(render(c.collect()).decode())
    assert value(parsed, "work_total", rank="") == 15, "the final flush is counted once"
    assert list(tmp_path.glob("*.shard")) == []
    parsed = samples(render(c.collect()).decode())
    assert value(parsed, "work_total", rank="") == 15, "and stays, never counted twice"


def test_a_killed_process_is_detected_by_pid_and_heartbeat(tmp_path: Path) -> None:
    h = hook(tmp_path, Identity(pid=2**22 + 12345), flush_interval_s=0.05)  # no such process
    h.series("counter", "work_total").inc(4)
    h.flush()
    c, parsed = agent_view(tmp_path, flush_s=0.05)
    assert value(parsed, "outrider_hook_processes", state="running") == 1, "just seen: not judged yet"
    time.sleep(0.2)  # more than three flush intervals without a new heartbeat, on the agent's own clock
    parsed = samples(render(c.collect()).decode())
    assert value(parsed, "work_total", rank="") == 4
    assert value(parsed, "outrider_hook_processes", state="running") == 0
    assert list(tmp_path.glob("*.shard")) == []


def test_stall_dumps_python_stacks_once_and_clears_on_progress(tmp_path: Path) -> None:
    h = hook(tmp_path, stall_factor=3, stall_floor_s=1.0)
    steps(h, 1, 0.01)
    h.flush()
    h.progress.last_step_perf -= 1.5  # the last step was 1.5 s ago: past the floor
    h.flush()
    h.flush()
    stacks = list(tmp_path.glob("*.stacks.txt"))
    assert len(stacks) == 1 and h.progress.stalls == 1
    text = stacks[0].read_text()
    assert "no step completed" in text and "test_stall_dumps_python_stacks" in text
    c, parsed = agent_view(tmp_path)
    assert value(parsed, "outrider_hook_stalled", rank="") == 1
    dumps = c.ctx.stalled_stacks
    assert dumps and dumps[0][2] == str(stacks[0]) and "test_stall_dumps_python_stacks" in dumps[0][3]
    steps(h, 1, 0.01)
    h.flush()
    parsed = samples(render(c.collect()).decode())
    assert value(parsed, "outrider_hook_stalled", rank="") == 0


def test_a_wall_clock_jump_neither_retires_a_live_process_nor_stalls_it(tmp_path: Path) -> None:
    def jumped() -> int:  # the node's clock jumped two hours back
        return time.time_ns() - 2 * 3600 * 10**9

    # a pid the agent cannot see: only the heartbeat tells it the process lives
    h = Hook(HookSettings(spool_dir=str(tmp_path), standalone=False, flush_interval_s=0.05),
             Identity(pid=2**22 + 777, start_ns=jumped()), wall_ns=jumped)
    h.series("counter", "work_total").inc(1)
    h.flush()
    c, _ = agent_view(tmp_path, flush_s=0.05)
    for _ in range(6):
        time.sleep(0.05)
        h.flush()  # heartbeats keep coming, two hours "old" by the wall clock
        parsed = samples(render(c.collect()).decode())
        assert value(parsed, "outrider_hook_processes", state="running") == 1
    assert list(tmp_path.glob("*.shard")), "a live process's shard is never retired"


def test_spool_unwritable_then_writable_again_loses_nothing(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.write_text("a file where the directory should be: like a full or read-only volume")
    h = hook(spool)
    s = h.series("counter", "work_total")
    s.inc(3)
    h.flush()
    assert h.publisher.writer is None and h.drop.counts["spool_unwritable"] == 1
    s.inc(2)
    spool.unlink()
    h.publisher.retry_at = 0.0  # instead of waiting WRITER_RETRY_S
    h.flush()
    assert h.publisher.writer is not None and not h.publisher.failing
    _, parsed = agent_view(spool)
    assert value(parsed, "work_total", rank="") == 5, "cumulative values: the outage lost nothing"


def test_unwritable_spool_keeps_measuring_and_never_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    h = hook(blocker / "spool")
    s = h.series("counter", "work_total")
    s.inc()
    h.flush()
    h.flush()
    s.inc()
    assert s.total() == [2.0]
    assert h.publisher.writer is None


def test_corrupt_and_newer_shards_are_skipped_and_counted(tmp_path: Path) -> None:
    import json
    import struct

    from outrider.shared import spool

    (tmp_path / "outrider-1-1.shard").write_bytes(b"garbage" * 1000)
    # A shard a newer hook wrote: whole and well-formed, its format version one past this agent's.
    elsewhere = tmp_path / "newer"
    elsewhere.mkdir(mode=0o700)
    w = spool.ShardWriter(str(elsewhere), 1, 2)
    w.write(json.dumps({"meta": {}, "series": [["newer_total", "counter", {}, 0, []]]}).encode(), [9.0], flags=0,
            pid=1, stalls=0, start_ns=1, heartbeat_ns=1, last_step_ns=0, steps=0, stalled_since_ns=0)
    newer = bytearray(Path(w.path).read_bytes())
    struct.pack_into("<I", newer, len(spool.MAGIC), spool.VERSION + 1)
    (tmp_path / "outrider-1-2.shard").write_bytes(bytes(newer))
    h = hook(tmp_path)
    h.series("counter", "work_total").inc(2)
    h.flush()
    _, parsed = agent_view(tmp_path)
    assert value(parsed, "work_total", rank="") == 2, "bad neighbours do not hide good shards"
    assert value(parsed, "outrider_hook_shard_errors_total", reason="corrupt") == 1
    assert value(parsed, "outrider_hook_shard_errors_total", reason="newer_version") == 1
    assert not [k for k in parsed if k[0] == "newer_total"], "nothing read from a format this agent does not know"


def test_a_declared_phase_is_not_a_stall_until_it_overruns(tmp_path: Path) -> None:
    h = hook(tmp_path, stall_factor=3, stall_floor_s=1.0, phase_timeout_s=60.0)
    steps(h, 5, 0.01)
    h.progress.open_phase("checkpoint")
    h.progress.open_phases["checkpoint"] -= 30  # a 30 s checkpoint: far past the 1 s step threshold
    h.progress.last_step_perf -= 30
    h.flush()
    c, parsed = agent_view(tmp_path)
    assert value(parsed, "outrider_hook_stalled") == 0, "an expected long phase is not a stall"
    assert value(parsed, "outrider_train_phase_active", phase="checkpoint") == 1
    assert value(parsed, "outrider_train_phase_seconds_total", phase="checkpoint") >= 30
    h.progress.close_phase("checkpoint")
    h.flush()
    parsed = samples(render(c.collect()).decode())
    assert value(parsed, "outrider_hook_stalled") == 0, "the phase's time does not count after it closed either"
    assert value(parsed, "outrider_train_phase_active", phase="checkpoint") == 0
    h.progress.open_phase("evaluation")
    h.progress.open_phases["evaluation"] -= 61  # past phase_timeout_s: a phase that hangs is a stall
    h.flush()
    parsed = samples(render(c.collect()).decode())
    assert value(parsed, "outrider_hook_stalled") == 1
    assert "declared phase 'evaluation' still open" in next(tmp_path.glob("*.stacks.txt")).read_text()


def test_a_training_process_that_never_steps_is_stalled_after_the_first_step_timeout(tmp_path: Path) -> None:
    h = hook(tmp_path, role="training", first_step_timeout_s=120.0)
    h.flush()
    c, parsed = agent_view(tmp_path)
    assert value(parsed, "outrider_train_first_step_pending") == 1
    assert value(parsed, "outrider_hook_stalled") == 0, "still within the first-step timeout"
    h.progress.started_perf -= 121
    h.flush()
    parsed = samples(render(c.collect()).decode())
    assert value(parsed, "outrider_hook_stalled") == 1
    assert "no first step" in next(tmp_path.glob("*.stacks.txt")).read_text()
    steps(h, 1)
    h.flush()
    parsed = samples(render(c.collect()).decode())
    assert value(parsed, "outrider_train_first_step_pending") == 0 and value(parsed, "outrider_hook_stalled") == 0


def test_a_service_that_never_steps_is_never_stalled(tmp_path: Path) -> None:
    h = hook(tmp_path, first_step_timeout_s=1.0)
    h.series("counter", "outrider_requests_total", {"route": "/", "method": "GET", "scheme": "http",
                                                    "status_code": "200", "status_class": "2xx"}, builtin=True).inc()
    h.progress.serving_seen = True
    h.progress.started_perf -= 3600
    h.flush()
    _, parsed = agent_view(tmp_path)
    assert value(parsed, "outrider_hook_stalled") == 0
    assert value(parsed, "outrider_train_first_step_pending") is None


@pytest.fixture
def flushed_by_hand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The public API instrumented afresh on tmp_path, with a flush interval so long that only the test flushes;
    yields the hook API's module (api.S.hook.flush())."""
    import outrider
    from outrider.hook import api

    monkeypatch.setattr(api, "S", api.HookState())
    monkeypatch.setenv("OUTRIDER_SPOOL_DIR", str(tmp_path))
    monkeypatch.setenv("OUTRIDER_STANDALONE", "false")
    monkeypatch.setenv("OUTRIDER_FLUSH_INTERVAL_S", "3600")
    assert outrider.instrument()
    try:
        yield api
    finally:
        api.S.hook.close()


def test_the_step_ring_counts_every_step_even_when_it_laps(tmp_path: Path, flushed_by_hand: Any) -> None:
    import outrider

    for _ in range(20_000):  # five times the ring between two flushes
        with outrider.step(samples=2, tokens=3):
            pass
    flushed_by_hand.S.hook.flush()
    _, parsed = agent_view(tmp_path)
    assert value(parsed, "outrider_train_steps_total") == 20_000, "once 4,096: the ring lost counts"
    assert value(parsed, "outrider_samples_total") == 40_000
    assert value(parsed, "outrider_tokens_total") == 60_000
    assert value(parsed, "outrider_train_step_duration_seconds_count") == 4096, "only durations are lost"
    assert value(parsed, "outrider_hook_dropped_total", reason="step_ring_overflow") == 1


def test_the_wait_ring_counts_every_batch_even_when_it_laps(tmp_path: Path, flushed_by_hand: Any) -> None:
    import outrider

    with outrider.step():
        for _ in outrider.dataloader([[1, 2]] * 5000):  # more waits than the ring holds between two flushes
            pass
    flushed_by_hand.S.hook.flush()
    _, parsed = agent_view(tmp_path)
    assert value(parsed, "outrider_train_data_wait_seconds_count") == 4096, "only durations are lost"
    assert value(parsed, "outrider_hook_dropped_total", reason="wait_ring_overflow") == 1
    assert flushed_by_hand.S.waits.ring.drained == 5000


def test_data_waits_no_step_places_are_dropped_and_counted(tmp_path: Path, flushed_by_hand: Any) -> None:
    import outrider

    for _ in range(3):  # a loader iterated outside any training loop: no step ever places its waits
        for _ in outrider.dataloader(range(3000)):
            pass
        flushed_by_hand.S.hook.flush()
    _, parsed = agent_view(tmp_path)
    lost = flushed_by_hand.S.loop.account.lost
    assert lost > 0
    assert value(parsed, "outrider_hook_dropped_total", reason="loop_backlog") == lost
    assert value(parsed, "outrider_hook_dropped_total", reason="wait_ring_overflow") is None


def test_retired_series_of_dead_processes_are_bounded(tmp_path: Path) -> None:
    import outrider.collectors.hook as hook_collector

    c = HookCollector(CollectorContext(Config(spool_dir=str(tmp_path)), hold_spool_lock=False))
    for n in range(50):  # 50 processes came and went, each with 1,000 series of its own
        h = hook(tmp_path, Identity(pid=10_000 + n), hook_max_series_per_metric=1000)
        for i in range(1000):
            h.series("counter", "request_total", {"id": f"{n}-{i}"}).inc()
        h.close()
        c.collect()
    assert len(c._retired) == hook_collector.MAX_RETIRED, "was 50,000: memory grew with every process"
    parsed = samples(render(c.collect()).decode())
    assert value(parsed, "outrider_hook_retired_series") == hook_collector.MAX_RETIRED
    later = time.monotonic() + hook_collector.RETIRED_TTL_S + 1
    c.ctx.clock = Clock(monotonic=lambda: later)  # the agent two hours on
    c.collect()
    assert len(c._retired) == 0, "no live process shares them: they expire"


def test_a_retired_counter_a_live_process_shares_never_expires(tmp_path: Path) -> None:
    import outrider.collectors.hook as hook_collector

    c = HookCollector(CollectorContext(Config(spool_dir=str(tmp_path)), hold_spool_lock=False))
    gone = hook(tmp_path, Identity(pid=2**22 + 1))
    gone.series("counter", "work_total").inc(5)
    gone.close()
    c.collect()
    live = hook(tmp_path)
    live.series("counter", "work_total").inc(2)
    live.flush()
    later = time.monotonic() + hook_collector.RETIRED_TTL_S + 1
    c.ctx.clock = Clock(monotonic=lambda: later)  # the agent two hours on
    parsed = samples(render(c.collect()).decode())
    assert value(parsed, "work_total") == 7, "dropping the 5 would make the merged counter go backwards"
def test_the_closing_flush_is_the_last_word_even_beside_a_slow_periodic_one(tmp_path: Path) -> None:
    """At exit, close() flushes while the publisher thread may still be inside a periodic flush (its samplers read
    /proc, which takes longer on a crowded machine). The periodic one must not land after the closing one: the
    shard would be left unclosed with older values, and the agent would retire it with steps missing."""
    import threading

    from outrider.shared import spool

    h = hook(tmp_path)
    counter = h.series("counter", "work_total")
    counter.inc()
    calls, inside, release = [0], threading.Event(), threading.Event()

    def slow_sampler() -> None:
        calls[0] += 1
        if calls[0] == 1:  # the periodic flush, held inside its samplers
            inside.set()
            release.wait(30)

    h.samplers.append(slow_sampler)
    periodic = threading.Thread(target=h.flush)
    periodic.start()
    assert inside.wait(30)
    counter.inc()
    closer = threading.Thread(target=h.close)
    closer.start()
    closer.join(1.0)  # without the flush lock, close() is done by now, before the periodic flush writes
    release.set()
    periodic.join(30)
    closer.join(30)
    snap = spool.decode(next(tmp_path.glob("*.shard")).read_bytes())
    assert snap.header.flags & spool.FLAG_CLOSED, "the last write is the closing one"
    assert dict((s[0], s[3]) for s in snap.series)["work_total"] == [2.0]
    h.flush()  # a publisher waking after close() writes nothing more
    assert spool.decode(next(tmp_path.glob("*.shard")).read_bytes()).header.flags & spool.FLAG_CLOSED


def test_a_stopped_process_is_stopped_not_stalled(tmp_path: Path) -> None:
    """A real process stepping under the hook, SIGSTOPped: its heartbeat stops with it, and the agent (its clock moved
    past the unresponsive threshold) reads /proc/PID/stat's T: stopped, not stalled (outrider_hook_stalled was 1
    within 12 s of a SIGSTOP, and TrainingStalled paged). Continued, it runs again."""
    import signal
    import subprocess
    import sys
    import textwrap

    from outrider.ground.clock import ManualClock
    from tests.helpers import wait_until

    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import time
        import outrider
        outrider.instrument()
        while True:
            with outrider.step(samples=8):
                time.sleep(0.01)
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    env.update({"OUTRIDER_SPOOL_DIR": str(tmp_path), "OUTRIDER_STANDALONE": "false",
                "OUTRIDER_FLUSH_INTERVAL_S": "0.1", "OUTRIDER_TRAINING_JOB": "llm", "RANK": "0"})
    proc = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        manual = ManualClock()
        c = HookCollector(CollectorContext(Config(spool_dir=str(tmp_path), flush_interval_s=0.1),
                                           clock=manual.clock()))

        def collect() -> dict:  # type: ignore[type-arg]
            return samples(render(c.collect()).decode())

        wait_until(lambda: value(collect(), "outrider_train_steps_total", rank="0", training_job="llm") or None,
                   timeout_s=30, what="the loop's steps in the spool")
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: procfs_state(proc.pid) == "T", timeout_s=10, what="the process stopped")
        collect()  # the last heartbeat it wrote, seen now
        manual.now += 20.0  # past max(10 x flush, 10 s): unresponsive, were it not stopped
        parsed = collect()
        assert value(parsed, "outrider_hook_processes", state="stopped") == 1
        assert value(parsed, "outrider_hook_processes", state="unresponsive") == 0
        assert value(parsed, "outrider_hook_stopped", rank="0", training_job="llm") == 1
        assert value(parsed, "outrider_hook_stalled", rank="0", training_job="llm") == 0
        proc.send_signal(signal.SIGCONT)

        def running_again() -> bool:
            manual.now += 0.05
            parsed = collect()
            return value(parsed, "outrider_hook_processes", state="running") == 1
        wait_until(running_again, timeout_s=30, what="the continued process running again")
        assert value(collect(), "outrider_hook_stopped", rank="0", training_job="llm") == 0
    finally:
        proc.kill()
        proc.wait()


def procfs_state(pid: int) -> str | None:
    from outrider.kernel import procfs

    return procfs.process_state("/proc", pid)
