"""The public hook API (hook/api.py) in this process, value by value: what each function writes on the hot path, and
what the publisher's drain makes of it, read back the way the agent reads it (the spool's shard, through the hook
collector). The workload tests drive the same API from subprocesses; these pin its arithmetic, its labels, its
caches' bounds and its never-raise paths, one at a time.

Each test gets a fresh module state (`api.S`) and a hook on its own spool, whose publisher thread sleeps an hour:
the test drains by calling flush(), so nothing races it. The hook's exit handlers (atexit, SIGTERM) are not
installed in the test process: tests/hook/test_exit_paths.py covers them in workloads."""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from time import perf_counter, time
from typing import Any

import psutil
import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.ground.config import Config
from outrider.hook import api, runtime
from outrider.hook.series import DURATION_BOUNDS, NoopSeries
from outrider.hook.state import NOOP, RING, HookState
from outrider.hook.torch_data import TIMED_MARK
from outrider.kernel import procfs
from outrider.metrics.exposition import render
from tests.helpers import samples, value

ATTACH_TORCH = api._attach_torch  # the real one: the fixture turns it off
Parsed = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def hooked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """instrument() on a fresh state and a spool of the test's own; its hook is closed afterwards."""
    fresh(monkeypatch)
    assert api.instrument(spool_dir=str(tmp_path), standalone=False)
    hook = api.S.hook
    yield tmp_path
    if hook is not None:
        hook.close()


def fresh(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for key in list(os.environ):
        if key.startswith("OUTRIDER_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("OUTRIDER_FLUSH_INTERVAL_S", "3600")
    for key, v in env.items():
        monkeypatch.setenv(key, v)
    monkeypatch.setattr(api, "S", HookState())
    monkeypatch.setattr(runtime, "register_exit", lambda getter: None)
    monkeypatch.setattr(api, "_attach_torch", lambda: None)  # whatever other tests imported: no torch patching here
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # instrument() may add its import watch


def published(spool: Path) -> Parsed:
    api.flush()
    collector = HookCollector(CollectorContext(Config(spool_dir=str(spool), flush_interval_s=3600)))
    return samples(render(collector.collect()).decode())


def drops(spool: Path) -> dict[str, float]:
    return {dict(k[1])["reason"]: v for k, v in published(spool).items() if k[0] == "outrider_hook_dropped_total"}


def loop_parts(parsed: Parsed) -> dict[str, float]:
    return {dict(k[1])["part"]: round(v, 9) for k, v in parsed.items()
            if k[0] == "outrider_train_loop_seconds_total"}


class Batch:
    def __init__(self, n: int) -> None:
        self.shape = (n, 3)


class FakeTorch:
    def __init__(self) -> None:
        self.stopped = 0

    def stop_counting(self) -> None:
        self.stopped += 1

    def detach(self) -> None:
        pass


# --- before instrument(), and disabled --------------------------------------------------------------------------

def test_before_instrument_the_step_and_request_paths_do_nothing_and_cache_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fresh(monkeypatch)
    s = api.S
    api.step_begin()
    api.step_end(samples=4, tokens=9)
    with api.step(samples=2):
        pass
    assert s.steps.ring.n == 0 and s.steps.sample_sum == 0 and s.steps.token_sum == 0
    api.record_request(0.1, route="/a")
    api.record_latency(0.1)
    gauge = api.in_flight("/a")
    assert gauge is NOOP and s.http == {} and s.http_in_flight == {} and s.cached == {}
    assert s.identity.served, "a service, even before instrument()"
    assert list(api.dataloader([[1], [2]])) == [[1], [2]]
    api.flush()
    api.shutdown()
    with api.phase("warmup"):
        pass


@pytest.mark.parametrize("text", ["1", "true", "yes", "on", " TRUE ", "On"])
def test_outrider_disabled_turns_everything_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str) -> None:
    fresh(monkeypatch, OUTRIDER_DISABLED=text)
    assert api.instrument(spool_dir=str(tmp_path), standalone=False) is False
    assert api.counter("work") is NOOP and api.gauge("g") is NOOP and api.histogram("h") is NOOP
    assert api.S.hook is None and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["0", "", "no", "off", "2"])
def test_other_values_of_outrider_disabled_leave_it_on(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    fresh(monkeypatch, OUTRIDER_DISABLED=text)
    assert api._disabled() is False


# --- instrument() -----------------------------------------------------------------------------------------------

def test_instrument_sets_up_one_hook_with_the_given_spool_and_mode(hooked: Path) -> None:
    s = api.S
    hook = s.hook
    assert hook is not None and hook.settings.spool_dir == str(hooked) and hook.settings.standalone is False
    assert api.instrument() is True and api.S.hook is hook, "idempotent"
    assert api._drain in hook.samplers and len(hook.samplers) == 3, "the drain, thread CPU and the profiler"
    threads, profiler = (getattr(sampler, "__self__") for sampler in hook.samplers[1:])  # noqa: B009
    assert type(threads).__name__ == "ThreadCpuAccounting" and type(profiler).__name__ == "LoopProfiler"
    s.steps.loop_tid = 4321
    for part in (threads, profiler):
        assert part.hook is hook and part.loop_tid() == 4321, "each reads the loop's thread as the step path set it"
    s.steps.loop_tid = 0
    assert s.series.step is not NOOP and s.series.samples is not NOOP and s.series.tokens is not NOOP
    assert s.series.data_wait is not NOOP and s.series.first_step is not NOOP and s.series.batch_size is not NOOP
    assert abs(s.identity.process_start_s - psutil.Process().create_time()) < 10.0, "psutil is the oracle"
    assert not s.setting_up
    assert any(isinstance(f, api._AfterTorchImport) for f in sys.meta_path) == ("torch" not in sys.modules)


def test_instrument_registers_the_final_flush_for_its_own_hook(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    fresh(monkeypatch)
    getters: list[Any] = []
    monkeypatch.setattr(runtime, "register_exit", getters.append)
    assert api.instrument(spool_dir=str(tmp_path), standalone=False)
    hook = api.S.hook
    assert hook is not None
    try:
        assert len(getters) == 1 and getters[0]() is hook, "atexit and SIGTERM close the hook instrument() made"
        published(tmp_path)
        assert "sampler_error" not in hook.drop.counts, "every sampler runs"
    finally:
        hook.close()


def test_the_import_watch_goes_first_and_only_without_torch(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    import types

    fresh(monkeypatch)
    attached: list[int] = []
    monkeypatch.setattr(api, "_attach_torch", lambda: attached.append(1))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert api.instrument(spool_dir=str(tmp_path), standalone=False)
    assert isinstance(sys.meta_path[0], api._AfterTorchImport) and attached == []
    assert api.S.hook is not None
    api.S.hook.close()
    fresh(monkeypatch)
    monkeypatch.setattr(api, "_attach_torch", lambda: attached.append(1))
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    finders = list(sys.meta_path)
    assert api.instrument(spool_dir=str(tmp_path), standalone=False)
    assert attached == [1] and sys.meta_path == finders, "torch imported: attached now, no watch"
    assert api.S.hook is not None
    api.S.hook.close()


def test_the_builtin_histograms_have_their_own_bounds(hooked: Path) -> None:
    from outrider.hook.series import SIZE_BOUNDS

    api.record_batch_size(3)
    api.S.steps.ring.put(0.0, perf_counter() - 2.0)
    api.S.steps.ring.put(0.0, perf_counter() - 1.0)
    parsed = published(hooked)

    def bounds(name: str) -> list[float]:
        return sorted(float(dict(k[1])["le"]) for k in parsed if k[0] == name)

    assert bounds("outrider_inference_batch_size_bucket") == [*map(float, SIZE_BOUNDS), float("inf")]
    assert bounds("outrider_train_step_duration_seconds_bucket") == [*map(float, DURATION_BOUNDS), float("inf")]


def test_instrument_with_no_arguments_keeps_the_environments_settings(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    fresh(monkeypatch, OUTRIDER_SPOOL_DIR=str(tmp_path), OUTRIDER_STANDALONE="false")
    assert api.instrument()
    hook = api.S.hook
    assert hook is not None
    try:
        assert hook.settings.spool_dir == str(tmp_path) and hook.settings.standalone is False
        assert hook.settings.flush_interval_s == 3600
    finally:
        hook.close()


def test_a_refused_setting_is_logged_and_its_default_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    fresh(monkeypatch, OUTRIDER_HOOK_MAX_SERIES_PER_METRIC="many")
    with caplog.at_level(logging.WARNING, logger="outrider.hook"):
        assert api.instrument(spool_dir=str(tmp_path), standalone=False)
    hook = api.S.hook
    assert hook is not None
    hook.close()
    assert any(r.getMessage().startswith("outrider: ") and "HOOK_MAX_SERIES_PER_METRIC" in r.getMessage()
               for r in caplog.records)


def test_a_failing_setup_leaves_no_hook_and_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    fresh(monkeypatch)

    def broken(*a: object, **k: object) -> None:
        raise RuntimeError("no spool today")

    monkeypatch.setattr(runtime, "Hook", broken)
    with caplog.at_level(logging.WARNING, logger="outrider.hook"):
        assert api.instrument(spool_dir=str(tmp_path)) is False
    assert api.S.hook is None and not api.S.setting_up
    assert [r.getMessage() for r in caplog.records if r.name == "outrider.hook"] == \
        ["outrider: instrument() failed, continuing without the hook: no spool today"]


def test_instrument_called_again_from_inside_its_own_setup_returns_false(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    """A signal handler or GC callback that calls outrider.counter() while this thread sets the hook up."""
    fresh(monkeypatch)
    seen: list[bool] = []
    real = runtime.Hook

    def reentering(*a: Any, **k: Any) -> Any:
        seen.append(api.instrument())
        return real(*a, **k)

    monkeypatch.setattr(runtime, "Hook", reentering)
    assert api.instrument(spool_dir=str(tmp_path), standalone=False) is True
    assert seen == [False]
    assert api.S.hook is not None
    api.S.hook.close()


def test_a_thread_waiting_for_the_setup_gets_the_hook_it_made(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    fresh(monkeypatch)
    results: list[bool] = []
    api._SETTING_UP.acquire()
    try:
        waiter = threading.Thread(target=lambda: results.append(api.instrument()))
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive(), "it waits for the thread setting up"
        assert api._instrument(str(tmp_path), False)
    finally:
        api._SETTING_UP.release()
    waiter.join(30)
    assert results == [True]
    assert api.S.hook is not None
    api.S.hook.close()


def test_a_fork_during_setup_gets_a_lock_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh(monkeypatch)
    old = api._SETTING_UP
    monkeypatch.setattr(api, "_SETTING_UP", old)
    api.S.setting_up = True
    api._renew_setting_up()
    assert api._SETTING_UP is not old and api.S.setting_up is False
    assert api._SETTING_UP.acquire(blocking=False)
    api._SETTING_UP.release()


def test_the_process_start_is_now_less_its_age_in_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, object]] = []

    def age(root: str, pid: object) -> float:
        asked.append((root, pid))
        return 100.0

    monkeypatch.setattr(procfs, "age_s", age)
    before = time()
    start = api._process_start_time()
    assert start is not None and before - 100.0 <= start <= time() - 100.0
    assert asked == [("/proc", "self")]


def test_the_process_start_falls_back_to_now_when_proc_cannot_tell(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    fresh(monkeypatch)
    for error in (OSError, ValueError, IndexError):
        def age(*a: object, _e: type[Exception] = error) -> float:
            raise _e("no /proc")
        monkeypatch.setattr(procfs, "age_s", age)
        assert api._process_start_time() is None
    before = time()
    assert api.instrument(spool_dir=str(tmp_path), standalone=False)
    assert api.S.hook is not None
    api.S.hook.close()
    assert before <= api.S.identity.process_start_s <= time()


def test_shutdown_closes_the_hook_and_a_failing_flush_is_counted(hooked: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    hook = api.S.hook
    assert hook is not None
    api.counter("work").inc(3)

    def failing(closing: bool = False) -> None:
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(hook, "flush", failing)
        api.flush()  # never raises
    assert hook.drop.counts.get("flush_error") == 1
    api.shutdown()
    assert hook.closed
    collector = HookCollector(CollectorContext(Config(spool_dir=str(hooked), flush_interval_s=3600)))
    assert value(samples(render(collector.collect()).decode()), "work_total") == 3
    assert list(hooked.glob("*.shard")) == [], "marked closed: the agent retires the shard at once"


# --- steps ------------------------------------------------------------------------------------------------------

def test_an_explicit_step_writes_its_begin_end_and_counts(hooked: Path) -> None:
    st = api.S.steps
    torch = FakeTorch()
    api.S.torch = torch
    t0 = perf_counter()
    api.step_begin()
    assert st.explicit and torch.stopped == 1
    begin = st.begin
    assert t0 <= begin <= perf_counter()
    api.step_end(samples=8, tokens=100)
    assert st.ring.n == 1 and st.begin == 0.0
    b, e = next(st.ring.entries(0, 1))
    assert b == begin and begin <= e <= perf_counter()
    assert (st.sample_sum, st.token_sum, st.samples_given) == (8, 100, True)
    assert st.loop_tid == threading.get_native_id()
    api.step_begin()
    api.step_end(samples=0, tokens=0)
    assert (st.sample_sum, st.token_sum) == (8, 100) and torch.stopped == 1, "explicit once"
    parsed = published(hooked)
    assert value(parsed, "outrider_train_steps_total") == 2
    assert value(parsed, "outrider_samples_total") == 8 and value(parsed, "outrider_tokens_total") == 100
    assert value(parsed, "outrider_train_step_duration_seconds_count") == 2


def test_step_end_alone_goes_explicit_and_its_step_runs_from_the_last_end(hooked: Path) -> None:
    st = api.S.steps
    torch = FakeTorch()
    api.S.torch = torch
    api.step_end()
    assert st.explicit and torch.stopped == 1
    api.step_end(samples=0)
    assert st.samples_given is False, "samples=0 counts nothing, and leaves the batch counting on"
    assert [b for b, _ in st.ring.entries(0, 2)] == [0.0, 0.0]


def test_with_step_times_the_block_and_a_raising_step_is_not_counted(hooked: Path) -> None:
    st = api.S.steps
    torch = FakeTorch()
    api.S.torch = torch
    with api.step(samples=3, tokens=7) as s:
        assert isinstance(s, api.step) and st.begin > 0
        assert st.explicit and torch.stopped == 1, "the framework's hooks stop counting steps"
    assert st.ring.n == 1 and (st.sample_sum, st.token_sum) == (3, 7)
    with pytest.raises(KeyError), api.step(samples=5):
        raise KeyError("bad batch")
    assert st.ring.n == 1 and st.begin == 0.0 and st.sample_sum == 3 and torch.stopped == 1
    assert api.step(samples=1, tokens=2).samples == 1 and api.step(tokens=2).tokens == 2


def test_the_step_path_reads_the_operation_counter_once_when_asked_and_calls_listeners(hooked: Path) -> None:
    st = api.S.steps
    reads: list[int] = []
    called: list[int] = []
    def reader() -> int:
        reads.append(1)
        return 41 + len(reads)

    st.ops_reader = reader
    st.want_ops = True
    st.listeners.append(lambda: called.append(1))
    api.step_end()
    api.step_end()
    assert (st.ops, len(reads), st.want_ops) == (42, 1, False)
    assert called == [1, 1]


def test_a_failing_listener_is_counted_and_never_raises_and_the_step_still_counts(hooked: Path) -> None:
    st = api.S.steps

    def broken() -> None:
        raise ValueError("listener")

    st.listeners.append(broken)
    api.step_end()
    assert st.ring.n == 1
    assert drops(hooked).get("step_error") == 1


def test_a_step_ending_on_another_thread_after_one_has_stepped_keeps_the_loop_thread(hooked: Path) -> None:
    api.step_end()
    tid = api.S.steps.loop_tid
    t = threading.Thread(target=api.step_end)
    t.start()
    t.join()
    assert api.S.steps.loop_tid == tid and api.S.steps.ring.n == 2


# --- the optimizer's step hook ----------------------------------------------------------------------------------

class Optimizer:
    pass


def optimizer_hook(first: list[Any], claimed: list[Any], claim: bool = False) -> Any:
    def claim_fn(opt: Any) -> bool:
        claimed.append(opt)
        return claim
    return api._optimizer_step_hook(api.S, first, claim_fn)


def test_the_optimizer_hook_counts_the_steps_of_its_optimizer_only(hooked: Path) -> None:
    st = api.S.steps
    opt, other = Optimizer(), Optimizer()
    claimed: list[Any] = []
    on_step = optimizer_hook([weakref.ref(opt)], claimed)
    t0 = perf_counter()
    on_step(opt, (), {})
    assert st.ring.n == 1 and claimed == []
    b, e = next(st.ring.entries(0, 1))
    assert b == 0.0 and t0 <= e <= perf_counter()
    assert st.loop_tid == threading.get_native_id()
    on_step(other, (), {})
    assert st.ring.n == 1 and claimed == [other], "another optimizer's step: asked, refused, not counted"


def test_the_optimizer_hook_asks_the_integration_when_its_optimizer_is_unset_or_gone(hooked: Path) -> None:
    st = api.S.steps
    opt = Optimizer()
    claimed: list[Any] = []
    optimizer_hook([None], claimed, claim=True)(opt, (), {})
    assert st.ring.n == 1 and claimed == [opt]
    gone = Optimizer()
    ref = weakref.ref(gone)
    del gone
    optimizer_hook([ref], claimed, claim=True)(opt, (), {})
    assert st.ring.n == 2 and claimed == [opt, opt]
    optimizer_hook([None], claimed, claim=False)(opt, (), {})
    assert st.ring.n == 2


def test_the_optimizer_hook_steps_aside_for_explicit_timing_and_without_a_hook(hooked: Path) -> None:
    st = api.S.steps
    opt = Optimizer()
    on_step = optimizer_hook([weakref.ref(opt)], [])
    st.explicit = True
    on_step(opt, (), {})
    assert st.ring.n == 0
    st.explicit = False
    hook, api.S.hook = api.S.hook, None
    try:
        on_step(opt, (), {})
    finally:
        api.S.hook = hook
    assert st.ring.n == 0


def test_the_optimizer_hook_reads_ops_once_calls_listeners_and_counts_its_own_errors(hooked: Path) -> None:
    st = api.S.steps
    opt = Optimizer()
    on_step = optimizer_hook([weakref.ref(opt)], [])
    st.ops_reader = lambda: 7
    st.want_ops = True
    called: list[int] = []
    st.listeners.append(lambda: called.append(1))
    on_step(opt, (), {})
    on_step(opt, (), {})
    assert (st.ops, st.want_ops, called) == (7, False, [1, 1])
    ends = [e for _, e in st.ring.entries(0, 2)]
    assert 0.0 < ends[0] <= ends[1] and st.ring.slots[4:] == [0.0] * (len(st.ring.slots) - 4), \
        "each step's end in its own slot"
    tid = st.loop_tid
    st.loop_tid = 5
    on_step(opt, (), {})
    assert st.loop_tid == 5 != tid, "the loop's thread is the first that stepped"

    def broken() -> None:
        raise RuntimeError("cuda marker")

    st.listeners.append(broken)
    on_step(opt, (), {})
    assert st.ring.n == 4
    assert drops(hooked).get("torch_hook_error") == 1


# --- the drain: durations, the loop's parts, counts --------------------------------------------------------------

def test_the_drain_turns_automatic_and_explicit_steps_into_durations_and_loop_parts(hooked: Path) -> None:
    s = api.S
    base = perf_counter() - 20.0
    s.identity.process_start_s = time() - 100.0  # the process started 100 s ago, its first step ended 20 s ago
    s.steps.ring.put(0.0, base)  # the first step opens the accounting: no duration, no parts
    s.waits.ring.put(base + 1.0, base + 1.3)
    s.steps.ring.put(0.0, base + 2.0)  # automatic: 2.0 from the last end; 0.3 wait, 0.7 step, 1.0 other
    s.steps.ring.put(base + 2.5, base + 3.0)  # explicit: 0.5; 0.5 other before it
    parsed = published(hooked)
    assert value(parsed, "outrider_train_steps_total") == 3
    assert value(parsed, "outrider_train_step_duration_seconds_count") == 2
    assert value(parsed, "outrider_train_step_duration_seconds_sum") == pytest.approx(2.5)
    assert value(parsed, "outrider_train_data_wait_seconds_count") == 1
    assert value(parsed, "outrider_train_data_wait_seconds_sum") == pytest.approx(0.3)
    assert loop_parts(parsed) == {"data_wait": 0.3, "step": 1.2, "other": 1.5}, "checkpoint: only once one is seen"
    assert value(parsed, "outrider_train_collective_wait_seconds_total") is None
    first = value(parsed, "outrider_train_time_to_first_step_seconds")
    assert first == pytest.approx(80.0, abs=10.0), "a slip is off by decades"
    assert s.steps.last_end == base + 3.0 and s.steps.ring.drained == 3 and s.waits.ring.drained == 1
    assert s.hook is not None and s.hook.progress.steps == 3 and s.hook.progress.last_step_perf == base + 3.0

    # the next flush: the first automatic step runs from the last drained end; time to first step stays
    s.identity.process_start_s -= 50.0
    s.steps.ring.put(0.0, base + 4.0)
    parsed = published(hooked)
    assert value(parsed, "outrider_train_step_duration_seconds_sum") == pytest.approx(3.5)
    assert loop_parts(parsed) == {"data_wait": 0.3, "step": 2.2, "other": 1.5}
    assert value(parsed, "outrider_train_time_to_first_step_seconds") == first
    assert value(parsed, "outrider_train_steps_total") == 4


def test_no_step_no_time_to_first_step(hooked: Path) -> None:
    api.count_tokens(5)  # something to publish
    parsed = published(hooked)
    assert value(parsed, "outrider_tokens_total") == 5
    assert value(parsed, "outrider_train_time_to_first_step_seconds") is None
    assert value(parsed, "outrider_train_steps_total") is None


def test_the_drained_durations_feed_the_stall_detector(hooked: Path) -> None:
    s = api.S
    base = perf_counter() - 20.0
    s.steps.ring.put(0.0, base)
    s.steps.ring.put(0.0, base + 2.0)
    s.steps.ring.put(base + 2.5, base + 3.0)
    published(hooked)
    assert s.hook is not None
    assert sorted(round(d, 9) for d in s.hook.progress.recent if d) == [0.5, 2.0]


def test_a_drain_with_nothing_new_publishes_the_same(hooked: Path) -> None:
    s = api.S
    base = perf_counter() - 5.0
    s.steps.ring.put(0.0, base)
    s.steps.ring.put(0.0, base + 1.0)
    first = published(hooked)
    again = published(hooked)
    def training(parsed: Parsed) -> Parsed:
        return {k: v for k, v in parsed.items() if k[0].startswith(("outrider_train_", "outrider_samples"))
                and "timestamp" not in k[0]}

    assert training(first) == training(again) and value(first, "outrider_train_steps_total") == 2
    assert s.hook is not None and s.hook.progress.steps == 2


def test_checkpoints_and_collectives_are_drained_into_their_parts(hooked: Path) -> None:
    s = api.S
    base = perf_counter() - 20.0
    s.steps.ring.put(0.0, base)
    s.loop.checkpoints.append((base + 0.2, base + 0.6))  # a save between steps: out of "other"
    s.loop.collectives.append((base + 0.7, base + 0.8, "all_reduce", True))
    s.loop.collectives.append((base + 0.8, base + 0.85, "all_reduce", True))
    s.loop.collectives.append((base + 0.85, base + 0.9, "broadcast", False))
    s.steps.ring.put(base + 0.7, base + 1.0)
    parsed = published(hooked)
    parts = loop_parts(parsed)
    assert parts == {"data_wait": 0.0, "step": 0.3, "other": 0.3, "checkpoint": 0.4}
    assert value(parsed, "outrider_train_collective_seconds_total", op="all_reduce") == pytest.approx(0.15)
    assert value(parsed, "outrider_train_collective_seconds_total", op="broadcast") == pytest.approx(0.05)
    assert value(parsed, "outrider_train_collective_wait_seconds_total") == pytest.approx(0.2)
    assert not s.loop.collectives and not s.loop.checkpoints and s.loop.collectives_seen


def test_checkpoints_and_collective_waits_of_several_steps_in_one_drain_add_up(hooked: Path) -> None:
    s = api.S
    base = perf_counter() - 20.0
    s.steps.ring.put(0.0, base)
    for k in range(3):  # each step: 0.2 s saving between steps, then 0.5 s of step with 0.1 s in a blocking collective
        t = base + k
        s.loop.checkpoints.append((t + 0.1, t + 0.3))
        s.loop.collectives.append((t + 0.6, t + 0.7, "all_reduce", True))
        s.steps.ring.put(t + 0.5, t + 1.0)
    parsed = published(hooked)
    assert loop_parts(parsed) == {"data_wait": 0.0, "step": 1.5, "other": 0.9, "checkpoint": 0.6}
    assert value(parsed, "outrider_train_collective_wait_seconds_total") == pytest.approx(0.3)
    assert value(parsed, "outrider_train_collective_seconds_total", op="all_reduce") == pytest.approx(0.3)


def test_the_collective_wait_stays_published_once_collectives_were_seen(hooked: Path) -> None:
    s = api.S
    base = perf_counter() - 20.0
    s.steps.ring.put(0.0, base)
    s.loop.collectives.append((base + 5.0, base + 5.5, "all_reduce", True))  # in "other": not the step's wait
    s.steps.ring.put(base + 0.5, base + 1.0)
    parsed = published(hooked)
    assert value(parsed, "outrider_train_collective_wait_seconds_total") == 0.0
    assert value(parsed, "outrider_train_collective_seconds_total", op="all_reduce") == pytest.approx(0.5)


def test_a_lapped_step_ring_keeps_the_count_drops_the_lost_and_restarts_the_loop(hooked: Path) -> None:
    s = api.S
    base = perf_counter() - 100.0
    s.steps.ring.put(0.0, base)
    published(hooked)
    for k in range(RING + 2):  # more steps than the ring holds between two flushes
        s.steps.ring.put(0.0, base + 1.0 + k * 0.01)
    parsed = published(hooked)
    assert value(parsed, "outrider_train_steps_total") == RING + 3, "the count is exact"
    assert value(parsed, "outrider_hook_dropped_total", reason="step_ring_overflow") == 1
    # the oldest entry still held opens the accounting again: the lost steps' time is in no part
    held = RING - 1
    assert loop_parts(parsed)["step"] == pytest.approx(held * 0.01, abs=1e-6)
    assert value(parsed, "outrider_train_step_duration_seconds_count") == RING - 1, \
        "the first held step has no begin: its start was overwritten"


def test_a_ring_filled_exactly_to_its_size_is_no_overflow(hooked: Path) -> None:
    s = api.S
    base = perf_counter() - 100.0
    for k in range(RING):
        s.steps.ring.put(0.0, base + k * 0.01)
        s.waits.ring.put(base + k * 0.01 - 0.001, base + k * 0.01)
    parsed = published(hooked)
    assert value(parsed, "outrider_hook_dropped_total", reason="step_ring_overflow") is None
    assert value(parsed, "outrider_hook_dropped_total", reason="wait_ring_overflow") is None
    assert value(parsed, "outrider_train_data_wait_seconds_count") == RING


def test_a_lapped_wait_ring_is_counted_and_drains_what_it_holds(hooked: Path) -> None:
    s = api.S
    base = perf_counter() - 100.0
    for k in range(RING + 1):
        s.waits.ring.put(base + k * 0.01, base + k * 0.01 + 0.005)
    parsed = published(hooked)
    assert value(parsed, "outrider_hook_dropped_total", reason="wait_ring_overflow") == 1
    assert value(parsed, "outrider_train_data_wait_seconds_count") == RING
    assert s.waits.ring.drained == RING + 1


def test_waits_with_no_step_to_place_them_in_are_dropped_and_counted(hooked: Path) -> None:
    """A loader iterated outside training: waits pile up past the loop's bound (hook/loop.MAX_PENDING)."""
    from outrider.hook.loop import MAX_PENDING

    s = api.S
    base = perf_counter() - 100.0
    for k in range(MAX_PENDING):
        s.waits.ring.put(base + k * 0.001, base + k * 0.001 + 0.0005)
    assert drops(hooked).get("loop_backlog") is None
    s.waits.ring.put(base + 50.0, base + 50.5)
    assert drops(hooked).get("loop_backlog") == MAX_PENDING // 2


def test_samples_and_tokens_published_are_the_growth_of_the_running_totals(hooked: Path) -> None:
    s = api.S
    s.steps.sample_sum, s.steps.token_sum = 10, 300
    parsed = published(hooked)
    assert value(parsed, "outrider_samples_total") == 10 and value(parsed, "outrider_tokens_total") == 300
    s.steps.sample_sum, s.steps.token_sum = 25, 301
    parsed = published(hooked)
    assert value(parsed, "outrider_samples_total") == 25 and value(parsed, "outrider_tokens_total") == 301
    assert (s.steps.samples_drained, s.steps.tokens_drained) == (25, 301)


def test_the_loaders_batches_count_as_samples_once_a_step_ended_and_none_counts_its_own(hooked: Path) -> None:
    s = api.S
    batches = [Batch(4), Batch(4), Batch(3)]
    for _ in api.dataloader(batches):
        pass
    assert s.waits.batch_samples == 11 and s.waits.ring.n == 3
    assert value(published(hooked), "outrider_samples_total") is None, "no step yet: not training samples yet"
    api.step_end()
    assert value(published(hooked), "outrider_samples_total") == 11
    for _ in api.dataloader([Batch(5)]):
        pass
    assert value(published(hooked), "outrider_samples_total") == 16
    api.count_samples(2)  # the user counts from now on: the loaders' batches no more
    for _ in api.dataloader([Batch(5)]):
        pass
    assert value(published(hooked), "outrider_samples_total") == 18


def test_training_and_serving_are_seen_from_the_apis_used(hooked: Path) -> None:
    hook = api.S.hook
    assert hook is not None
    def seen() -> tuple[bool, bool]:
        published(hooked)
        return hook.progress.training_seen, hook.progress.serving_seen

    assert seen() == (False, False)
    list(api.dataloader([1]))
    assert seen() == (True, False)
    api.record_request(0.01)
    assert seen() == (True, True)


def test_explicit_steps_mark_training(hooked: Path) -> None:
    hook = api.S.hook
    assert hook is not None
    api.step_begin()
    published(hooked)
    assert hook.progress.training_seen


def test_the_drain_without_a_hook_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh(monkeypatch)
    api.S.steps.ring.put(0.0, 1.0)
    api._drain()
    assert api.S.steps.ring.drained == 0


# --- the dataloader wrapper -------------------------------------------------------------------------------------

def test_the_dataloader_wrapper_times_each_wait_and_passes_the_loader_through(hooked: Path) -> None:
    class Loader:
        dataset = "the dataset"

        def __init__(self, items: list[Any]) -> None:
            self.items = items

        def __iter__(self) -> Iterator[Any]:
            return iter(self.items)

        def __len__(self) -> int:
            return 7

    waits = api.S.waits
    wrapped = api.dataloader(Loader([Batch(2), (Batch(3), "labels"), "text"]))
    assert len(wrapped) == 7 and wrapped.dataset == "the dataset"
    with pytest.raises(AttributeError):
        _ = wrapped.missing
    before = perf_counter()
    got = list(wrapped)
    assert len(got) == 3 and got[2] == "text"
    assert api.S.identity.loader_used
    assert waits.ring.n == 3 and waits.batch_samples == 5
    for b, e in waits.ring.entries(0, 3):
        assert before <= b <= e <= perf_counter()


def test_a_loader_the_torch_integration_already_times_is_not_timed_twice(hooked: Path) -> None:
    class TimedIterator:
        def __init__(self) -> None:
            self.left = [Batch(2), Batch(2)]

        def __iter__(self) -> TimedIterator:
            return self

        def __next__(self) -> Any:
            if not self.left:
                raise StopIteration
            return self.left.pop()

    setattr(TimedIterator.__next__, TIMED_MARK, True)

    class Loader:
        def __iter__(self) -> TimedIterator:
            return TimedIterator()

    assert len(list(api.dataloader(Loader()))) == 2
    assert api.S.waits.ring.n == 0 and api.S.waits.batch_samples == 0
    assert api.S.identity.loader_used


# --- phases -----------------------------------------------------------------------------------------------------

def test_a_phase_is_published_while_open_and_after(hooked: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    from outrider.hook import progress

    monkeypatch.setattr(progress, "perf_counter", lambda: clock[0])
    with api.phase("checkpoint") as p:
        assert isinstance(p, api.phase) and p.name == "checkpoint"
        clock[0] += 2.5
        parsed = published(hooked)
        assert value(parsed, "outrider_train_phase_active", phase="checkpoint") == 1
        assert value(parsed, "outrider_train_phase_seconds_total", phase="checkpoint") == pytest.approx(2.5)
    clock[0] += 1.0
    parsed = published(hooked)
    assert value(parsed, "outrider_train_phase_active", phase="checkpoint") == 0
    assert value(parsed, "outrider_train_phase_seconds_total", phase="checkpoint") == pytest.approx(2.5)
    assert api.phase(7).name == "7"  # type: ignore[arg-type]


def test_a_phase_decorates_a_function(hooked: Path) -> None:
    @api.phase("eval")
    def evaluate(a: int, b: int = 2) -> int:
        """evaluates"""
        hook = api.S.hook
        assert hook is not None and "eval" in hook.progress.open_phases
        return a * b

    assert evaluate(3, b=5) == 15
    assert evaluate.__name__ == "evaluate" and evaluate.__doc__ == "evaluates"
    hook = api.S.hook
    assert hook is not None and "eval" not in hook.progress.open_phases


def test_a_failing_phase_is_counted_never_raised(hooked: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hook = api.S.hook
    assert hook is not None

    def broken(name: str) -> None:
        raise RuntimeError("phase")

    monkeypatch.setattr(hook.progress, "open_phase", broken)
    monkeypatch.setattr(hook.progress, "close_phase", broken)
    with api.phase("x"):
        pass
    assert hook.drop.counts.get("phase_error") == 2


# --- counters, latency, requests ---------------------------------------------------------------------------------

def test_counts_and_batch_sizes(hooked: Path) -> None:
    api.count_samples()
    api.count_samples(4)
    api.count_tokens()
    api.count_tokens(10)
    api.record_batch_size(8)
    api.record_batch_size(24)
    parsed = published(hooked)
    assert api.S.steps.samples_given
    assert value(parsed, "outrider_samples_total") == 5 and value(parsed, "outrider_tokens_total") == 11
    assert value(parsed, "outrider_inference_batch_size_count") == 2
    assert value(parsed, "outrider_inference_batch_size_sum") == 32


def fake_clock(monkeypatch: pytest.MonkeyPatch, *ticks: float) -> None:
    it = iter(ticks)
    monkeypatch.setattr(api, "perf_counter", lambda: next(it))


def test_latency_its_context_manager_and_decorator(hooked: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api.record_latency(0.25)
    api.record_latency(0.5, name="db")
    fake_clock(monkeypatch, 10.0, 10.75, 20.0, 21.0, 30.0, 30.125, 40.0, 42.0)
    with api.latency("model") as lat:
        assert isinstance(lat, api.latency) and lat.name == "model"

    @api.timed()
    def handle(x: int) -> int:
        return x + 1

    @api.timed("named")
    def other() -> None:
        raise ValueError("still timed")

    assert handle(1) == 2
    with pytest.raises(ValueError):
        other()
    with api.latency():
        pass
    assert handle.__name__ == "handle"
    parsed = published(hooked)
    qual = "test_latency_its_context_manager_and_decorator.<locals>.handle"
    expect = {"request": (2, 2.25), "db": (1, 0.5), "model": (1, 0.75), qual: (1, 1.0), "named": (1, 0.125)}
    for name, (count, total) in expect.items():
        assert value(parsed, "outrider_latency_seconds_count", name=name) == count, name
        assert value(parsed, "outrider_latency_seconds_sum", name=name) == pytest.approx(total), name
    le = {dict(k[1])["le"] for k in parsed if k[0] == "outrider_latency_seconds_bucket"}
    assert len(le) == len(DURATION_BOUNDS) + 1


def test_a_latency_exited_without_its_enter_records_nothing_and_each_enter_once(
        hooked: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_clock(monkeypatch, 100.0, 100.5, 200.0, 200.25, 300.0)
    lat = api.latency("db")
    lat.__exit__(None, None, None)  # no start: nothing to measure (it once recorded perf_counter() itself)
    with lat:
        pass
    lat.__exit__(None, None, None)  # a second exit of one enter
    with lat:  # the same object, entered again
        pass
    parsed = published(hooked)
    assert value(parsed, "outrider_latency_seconds_count", name="db") == 2
    assert value(parsed, "outrider_latency_seconds_sum", name="db") == pytest.approx(0.75)


def test_a_function_without_a_qualname_is_timed_as_function(hooked: Path) -> None:
    class Callable_:
        def __call__(self) -> int:
            return 1

    c = Callable_()
    wrapped = api.timed()(c)
    assert wrapped() == 1
    assert value(published(hooked), "outrider_latency_seconds_count", name="function") == 1


@pytest.mark.parametrize(("status", "expect"), [
    (200, ("200", "2xx")), ("404", ("404", "4xx")), (" 503 ", ("503", "5xx")), (100, ("100", "1xx")),
    (599, ("599", "5xx")), (99, ("", "other")), (600, ("", "other")), ("0200", ("200", "2xx")),
    ("2xx", ("", "other")), (-200, ("", "other")), ("", ("", "other"))])
def test_http_status_code_and_class(status: int | str, expect: tuple[str, str]) -> None:
    assert api.http_status(status) == expect


def test_http_method_and_scheme_keep_only_known_values() -> None:
    for m in ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE"):
        assert api.http_method(m) == m
    assert [api.http_method(m) for m in ("get", "BREW", "", "_OTHER")] == ["_OTHER"] * 4
    assert [api.http_scheme(s) for s in ("http", "https", "HTTP", "ws", "")] == ["http", "https", "", "", ""]


def test_a_request_is_published_with_the_labels_the_exporter_writes(hooked: Path) -> None:
    api.record_request(0.2, route="/v1/chat", status=200, method="POST", scheme="https")
    api.record_request(0.4, route="/v1/chat", status=200, method="POST", scheme="https")
    api.record_request(0.1, route="/v1/chat", status="503", method="BREW", scheme="gopher")
    api.record_request(0.3)
    parsed = published(hooked)
    ok = {"route": "/v1/chat", "method": "POST", "scheme": "https", "status_code": "200", "status_class": "2xx"}
    assert value(parsed, "outrider_requests_total", **ok) == 2
    assert value(parsed, "outrider_request_duration_seconds_count", **ok) == 2
    assert value(parsed, "outrider_request_duration_seconds_sum", **ok) == pytest.approx(0.6)
    bad = {"route": "/v1/chat", "method": "_OTHER", "status_code": "503", "status_class": "5xx"}
    assert value(parsed, "outrider_requests_total", **bad) == 1
    assert value(parsed, "outrider_requests_total", method="_OTHER", status_code="200", status_class="2xx") == 1
    assert api.S.identity.served
    assert (("/v1/chat", 200, "POST", "https") in api.S.http) and len(api.S.http) == 3


def test_the_request_cache_stops_growing_at_its_bound_and_still_records(hooked: Path) -> None:
    s = api.S
    for k in range(api.MAX_HTTP_KEYS - 1):
        s.http[(f"/r{k}", 200, "GET", "")] = (NOOP, NOOP)
    api.record_request(0.1, route="/last")
    assert len(s.http) == api.MAX_HTTP_KEYS, "the last place is taken"
    api.record_request(0.1, route="/beyond")
    api.record_request(0.1, route="/beyond")
    assert len(s.http) == api.MAX_HTTP_KEYS and ("/beyond", 200, "_OTHER", "") not in s.http
    assert value(published(hooked), "outrider_requests_total", route="/beyond", method="_OTHER",
                 status_code="200", status_class="2xx") == 2, "uncached, still counted"


def test_the_series_cache_stops_growing_at_ten_thousand(hooked: Path) -> None:
    s = api.S
    for k in range(10_000 - 1):
        s.cached[("counter", f"x{k}", (), False)] = NOOP
    api.record_latency(0.1, name="last")
    assert len(s.cached) == 10_000
    api.record_latency(0.1, name="beyond")
    api.record_latency(0.2, name="beyond")
    assert len(s.cached) == 10_000
    assert value(published(hooked), "outrider_latency_seconds_count", name="beyond") == 2


def test_cached_series_are_keyed_by_kind_name_labels_and_ownership(hooked: Path) -> None:
    a = api._cached("counter", "jobs_total", {"q": "a"}, builtin=False)
    assert api._cached("counter", "jobs_total", {"q": "a"}, builtin=False) is a
    assert api._cached("counter", "jobs_total", {"q": "b"}, builtin=False) is not a
    assert ("counter", "jobs_total", (("q", "a"),), False) in api.S.cached
    refused = api._cached("counter", "outrider_mine_total", {}, builtin=False)
    assert isinstance(refused, NoopSeries), "a workload cannot publish a name the agent owns"


def test_phases_tokens_and_in_flight_requests(hooked: Path) -> None:
    api.record_phase("queue", 0.05)
    api.record_phase("queue", 0.15)
    api.record_time_to_first_token(0.3, route="/gen")
    api.record_inter_token_latency(0.02, route="/gen", operation="text_completion", provider="vllm")
    g = api.in_flight("/gen", method="POST", scheme="http")
    assert api.in_flight("/gen", method="POST", scheme="http") is g
    g.add(1)
    g.add(1)
    g.add(-1)
    api.in_flight("/other", method="FETCH", scheme="ftp").add(3)
    parsed = published(hooked)
    assert value(parsed, "outrider_request_phase_duration_seconds_count", phase="queue") == 2
    assert value(parsed, "outrider_request_phase_duration_seconds_sum", phase="queue") == pytest.approx(0.2)
    assert value(parsed, "outrider_inference_time_to_first_token_seconds_sum", route="/gen", operation="chat",
                 provider="self_hosted") == pytest.approx(0.3)
    assert value(parsed, "outrider_inference_inter_token_latency_seconds_count", route="/gen",
                 operation="text_completion", provider="vllm") == 1
    assert value(parsed, "outrider_requests_in_flight", route="/gen", method="POST", scheme="http") == 1
    assert value(parsed, "outrider_requests_in_flight", route="/other", method="_OTHER") == 3
    assert ("/gen", "POST", "http") in api.S.http_in_flight and len(api.S.http_in_flight) == 2


def test_the_in_flight_cache_has_the_request_caches_bound(hooked: Path) -> None:
    s = api.S
    for k in range(api.MAX_HTTP_KEYS - 1):
        s.http_in_flight[(f"/r{k}", "GET", "")] = NOOP
    api.in_flight("/last")
    assert len(s.http_in_flight) == api.MAX_HTTP_KEYS
    api.in_flight("/beyond").add(2)
    assert len(s.http_in_flight) == api.MAX_HTTP_KEYS
    assert value(published(hooked), "outrider_requests_in_flight", route="/beyond", method="_OTHER") == 2


# --- custom metrics ---------------------------------------------------------------------------------------------

def test_custom_metrics_set_the_hook_up_and_publish(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fresh(monkeypatch, OUTRIDER_SPOOL_DIR=str(tmp_path), OUTRIDER_STANDALONE="false")
    c = api.counter("jobs", {"queue": "a"})
    assert api.S.hook is not None, "the first custom series sets the hook up"
    try:
        c.inc(2)
        api.counter("done_total").inc()
        api.gauge("temperature", {"room": "1"}).set(21.5)
        api.gauge("depth").add(3)
        h = api.histogram("payload_bytes", bounds=(10.0, 100.0))
        h.observe(50)
        h.observe(500)
        api.histogram("wait_seconds").observe(0.01)
        labels = {"queue": "b"}
        api.counter("jobs", labels).inc()
        labels["queue"] = "changed"  # the caller's dict is copied
        parsed = published(tmp_path)
    finally:
        api.S.hook.close()
    assert value(parsed, "jobs_total", queue="a") == 2 and value(parsed, "jobs_total", queue="b") == 1
    assert value(parsed, "done_total") == 1 and value(parsed, "done_total_total") is None
    assert value(parsed, "temperature", room="1") == 21.5 and value(parsed, "depth") == 3
    assert {dict(k[1])["le"]: v for k, v in parsed.items() if k[0] == "payload_bytes_bucket"} == \
        {"10.0": 0, "100.0": 1, "+Inf": 2}
    assert len([k for k in parsed if k[0] == "wait_seconds_bucket"]) == len(DURATION_BOUNDS) + 1
    assert api.counter(7) is not None  # type: ignore[arg-type]  # a name that is no string: refused, no raise


# --- torch, after fork ------------------------------------------------------------------------------------------

def test_torch_is_attached_once_and_never_in_a_dormant_worker(monkeypatch: pytest.MonkeyPatch,
                                                             hooked: Path) -> None:
    from outrider.hook import torch_integration

    calls: list[Any] = []

    integration = FakeTorch()

    def attach(hook: Any, state: Any, optimizer_hook: Any) -> FakeTorch:
        calls.append((hook, state, optimizer_hook))
        return integration

    monkeypatch.setattr(torch_integration, "attach", attach)
    s = api.S
    ATTACH_TORCH()
    assert s.torch is integration and calls == [(s.hook, s, api._optimizer_step_hook)]
    ATTACH_TORCH()
    assert len(calls) == 1, "once"
    s.torch = None
    s.identity.dormant = True
    ATTACH_TORCH()
    assert len(calls) == 1, "a dormant DataLoader worker measures nothing"
    s.identity.dormant = False
    hook, s.hook = s.hook, None
    ATTACH_TORCH()
    s.hook = hook
    assert len(calls) == 1 and s.torch is None, "nor a process without a hook"


class Loader:
    def __init__(self) -> None:
        self.ran: list[Any] = []

    def exec_module(self, module: Any) -> None:
        self.ran.append(module)


class Spec:
    def __init__(self, loader: Any) -> None:
        self.loader = loader


class Finder:
    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.asked: list[tuple[str, Any, Any]] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        self.asked.append((fullname, path, target))
        return self.spec


def test_the_import_watch_attaches_once_torchs_init_has_run(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh(monkeypatch)
    attached: list[int] = []
    loader = Loader()
    monkeypatch.setattr(api, "_attach_torch", lambda: attached.append(len(loader.ran)))
    spec = Spec(loader)
    watch = api._AfterTorchImport()
    finders = [Finder(None), Finder(spec)]
    sys.meta_path[:0] = [watch, *finders]
    assert watch.find_spec("numpy") is None and watch in sys.meta_path, "only torch"
    assert watch.find_spec("torch", ["a path"], "a target") is spec
    assert finders[0].asked == finders[1].asked == [("torch", ["a path"], "a target")], "asked as it was asked"
    assert watch not in sys.meta_path, "answers once"
    spec.loader.exec_module("the module")
    assert loader.ran == ["the module"] and attached == [1], "attached after torch's own exec_module"


def test_the_import_watch_never_fails_torchs_import(monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    fresh(monkeypatch)

    def broken() -> None:
        raise RuntimeError("integration")

    monkeypatch.setattr(api, "_attach_torch", broken)
    loader = Loader()
    watch = api._AfterTorchImport()
    sys.meta_path[:0] = [watch, Finder(Spec(loader))]
    spec = watch.find_spec("torch")
    with caplog.at_level(logging.DEBUG, logger="outrider.hook"):
        spec.loader.exec_module("m")  # does not raise
    assert loader.ran == ["m"]
    [record] = [r for r in caplog.records if r.name == "outrider.hook"]
    assert record.getMessage() == "outrider: attaching to torch after its import failed"
    assert record.levelno == logging.DEBUG and record.exc_info is not None and record.exc_info[0] is RuntimeError


def test_an_import_watch_already_taken_off_still_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads importing torch at once: the second finds the watch gone from sys.meta_path."""
    fresh(monkeypatch)
    spec = Spec(Loader())
    monkeypatch.setattr(sys, "meta_path", [Finder(spec)])
    assert api._AfterTorchImport().find_spec("torch") is spec


def test_the_import_watch_leaves_what_it_cannot_wrap(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh(monkeypatch)
    watch = api._AfterTorchImport()
    monkeypatch.setattr(sys, "meta_path", [watch, Finder(None)])
    assert watch.find_spec("torch") is None, "no finder has torch"
    bare = Spec(object())
    watch = api._AfterTorchImport()
    monkeypatch.setattr(sys, "meta_path", [watch, object(), Finder(bare)])
    assert watch.find_spec("torch") is bare, "a loader without exec_module, past a finder without find_spec"

    class Raising:
        def find_spec(self, *a: object) -> None:
            raise ImportError("finder")

    watch = api._AfterTorchImport()
    monkeypatch.setattr(sys, "meta_path", [watch, Raising()])
    assert watch.find_spec("torch") is None, "the import machinery goes on with the other finders"


def test_a_dataloader_worker_forked_while_starting_goes_dormant(hooked: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = api.S
    hook = s.hook
    assert hook is not None
    asked: list[str] = []
    monkeypatch.setattr(hook.election, "after_fork_in_child", lambda: asked.append("election"))
    monkeypatch.setattr(hook, "after_fork_in_child", lambda: asked.append("hook"))
    s.steps.ring.put(0.0, 1.0)
    s.waits.starting_workers = True
    api._after_fork_in_child()
    assert s.hook is None and s.identity.dormant and asked == ["election"]
    assert s.steps.ring.drained == 0, "a dormant worker's state is left as it is: nothing drains it"
    api._after_fork_in_child()
    assert asked == ["election"], "no hook: nothing to do"
    s.hook = hook


def test_a_forked_child_starts_from_none_of_its_parents_steps(hooked: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = api.S
    hook = s.hook
    assert hook is not None
    asked: list[str] = []
    monkeypatch.setattr(hook, "after_fork_in_child", lambda: asked.append("hook"))
    s.steps.ring.put(0.0, 1.0)
    s.waits.ring.put(0.5, 0.75)
    s.loop.checkpoints.append((0.1, 0.2))
    api._after_fork_in_child()
    assert s.hook is hook and not s.identity.dormant and asked == ["hook"]
    assert s.steps.ring.drained == 1 and s.waits.ring.drained == 1 and not s.loop.checkpoints


def test_a_workload_cannot_publish_under_the_agents_names(hooked: Path) -> None:
    """outrider_hook_stalled 0 from a workload once hid a real stall: the custom-metric functions refuse the prefix."""
    for series in (api.counter("outrider_hook_stalled"), api.gauge("outrider_hook_stalled"),
                   api.histogram("outrider_train_step_duration_seconds")):
        assert isinstance(series, NoopSeries)
    hook = api.S.hook
    assert hook is not None and hook.drop.counts.get("reserved_name") == 3


def test_the_default_route_is_no_route(hooked: Path) -> None:
    api.record_time_to_first_token(0.5)
    api.record_inter_token_latency(0.01)
    api.in_flight().add(2)
    parsed = published(hooked)
    assert value(parsed, "outrider_inference_time_to_first_token_seconds_count", operation="chat",
                 provider="self_hosted") == 1
    assert value(parsed, "outrider_inference_inter_token_latency_seconds_count", operation="chat",
                 provider="self_hosted") == 1
    assert value(parsed, "outrider_requests_in_flight", method="_OTHER") == 2
