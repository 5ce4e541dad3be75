"""The Hook: registration limits, publishing, stalls, the agent-side merge, fork and spool failures."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.config import Config
from outrider.hook.runtime import Hook
from outrider.hook.series import NoopSeries
from outrider.metrics.exposition import render
from outrider.sampler import SweepStats
from tests.helpers import samples, value


def hook(spool: Path, **kw: object) -> Hook:
    return Hook(spool_dir=str(spool), standalone=False, **kw)  # type: ignore[arg-type]


def agent_view(spool: Path, flush_s: float = 1.0) -> tuple[HookCollector, dict]:  # type: ignore[type-arg]
    c = HookCollector(CollectorContext(Config(spool_dir=str(spool), flush_interval_s=flush_s), SweepStats()))
    return c, samples(render(c.collect()).decode())


def test_invalid_and_excess_series_are_refused_and_counted(tmp_path: Path) -> None:
    h = hook(tmp_path, max_series_per_metric=3)
    assert isinstance(h.series("counter", "bad name"), NoopSeries)
    assert isinstance(h.series("counter", "outrider_fake_total"), NoopSeries), "the outrider_ prefix is reserved"
    assert isinstance(h.series("counter", "x_total", {"rank": "1"}), NoopSeries)
    assert isinstance(h.series("counter", "x_total", {"k": "v" * 500}), NoopSeries)
    for i in range(5):  # a request id used as a label: capped at 3 series
        h.series("counter", "req_total", {"id": str(i)}).inc()
    h.series("counter", "req_total", {"other": "x"})
    assert h.drop.counts == {"invalid_name": 1, "reserved_name": 1, "invalid_label_name": 1,
                             "invalid_label_value": 1, "series_limit_per_metric": 2, "inconsistent_label_names": 1}
    h.flush()
    _, parsed = agent_view(tmp_path)
    assert value(parsed, "outrider_hook_dropped_total", reason="series_limit_per_metric", rank="") == 2
    assert sum(1 for (n, _) in parsed if n == "req_total") == 3


def test_publish_and_merge_two_processes_by_rank(tmp_path: Path) -> None:
    for pid, rank, steps in ((os.getpid(), "0", 3), (os.getppid(), "1", 5)):
        h = hook(tmp_path)
        h.pid, h.rank = pid, rank
        for _ in range(steps):
            h.series("counter", "outrider_train_steps_total", builtin=True).inc()
            h.series("histogram", "outrider_train_step_duration_seconds", builtin=True).observe(0.2)
            h.step_completed(0.2)
        h.flush()
    _, parsed = agent_view(tmp_path)
    assert value(parsed, "outrider_train_steps_total", rank="0") == 3
    assert value(parsed, "outrider_train_steps_total", rank="1") == 5
    assert value(parsed, "outrider_train_step_duration_seconds_count", rank="1") == 5
    assert value(parsed, "outrider_hook_processes", state="running") == 2
    assert value(parsed, "outrider_train_last_step_timestamp_seconds", rank="0") > time.time() - 60


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
    h = hook(tmp_path, flush_interval_s=0.05)
    h.pid = 2**22 + 12345  # no such process
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
    h = hook(tmp_path, stall_factor=3, stall_floor_s=0.05)
    h.series("counter", "outrider_train_steps_total", builtin=True).inc()
    h.step_completed(0.01)
    h.flush()
    time.sleep(0.1)
    h.flush()
    h.flush()
    stacks = list(tmp_path.glob("*.stacks.txt"))
    assert len(stacks) == 1 and h.stalls == 1
    text = stacks[0].read_text()
    assert "no step completed" in text and "test_stall_dumps_python_stacks" in text
    c, parsed = agent_view(tmp_path)
    assert value(parsed, "outrider_hook_stalled", rank="") == 1
    assert c.stack_dumps() and c.stack_dumps()[0][2] == str(stacks[0])
    h.step_completed(0.01)
    h.flush()
    parsed = samples(render(c.collect()).decode())
    assert value(parsed, "outrider_hook_stalled", rank="") == 0


def test_a_wall_clock_jump_neither_retires_a_live_process_nor_stalls_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import outrider.hook.runtime as runtime

    real = time.time_ns
    monkeypatch.setattr(runtime.time, "time_ns", lambda: real() - 2 * 3600 * 10**9)  # the node's clock jumped
    h = hook(tmp_path, flush_interval_s=0.05)
    h.pid = 2**22 + 777  # a pid the agent cannot see: only the heartbeat tells it the process lives
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
    assert h._writer is None and h.drop.counts["spool_unwritable"] == 1
    s.inc(2)
    spool.unlink()
    h._writer_retry_at = 0.0  # instead of waiting WRITER_RETRY_S
    h.flush()
    assert h._writer is not None and not h._writer_failed
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
    assert h._writer is None


def test_corrupt_and_newer_shards_are_skipped_and_counted(tmp_path: Path) -> None:
    (tmp_path / "outrider-1-1.shard").write_bytes(b"garbage" * 1000)
    h = hook(tmp_path)
    h.series("counter", "work_total").inc(2)
    h.flush()
    _, parsed = agent_view(tmp_path)
    assert value(parsed, "work_total", rank="") == 2, "a bad neighbour does not hide good shards"
    assert value(parsed, "outrider_hook_shard_errors_total", reason="corrupt") == 1
