"""The loop profiler (hook/profiler.py) on real loops run by this thread while the hook's thread samples it: pure
Python, tensor operations written in the loop, torch modules, sleeping, a DataLoader, an optimizer, torch.save.
Each loop is one kind of work, so the share of its class must dominate; shares, never timings."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import outrider
from outrider.hook.profiler import MAX_FRAMES, WHERE, LoopProfiler, file_kind, frame_label
from outrider.hook.runtime import Hook
from outrider.hook.settings import HookSettings, read

torch = pytest.importorskip("torch")
SECONDS = 1.5


@pytest.fixture
def hook(tmp_path: Path) -> Iterator[Hook]:
    # flushes once an hour: the hook's thread only samples (the flush's sampler is called by the tests)
    h = Hook(HookSettings(spool_dir=str(tmp_path), standalone=False, flush_interval_s=3600.0))
    h.progress.record_steps(1, time.perf_counter(), [0.1])  # a process with a loop: the profiler starts
    yield h
    h.stop()


def sampled_by_the_hooks_thread(hook: Hook, p: LoopProfiler) -> None:
    p.sample()  # a flush's: the loop steps, so the hook's thread samples it between flushes
    hook.profiler = p
    assert hook.start() and p.period_s() > 0
    assert any(t.name == "outrider-hook" for t in threading.enumerate()), "sampled from the hook's one thread"


def stopped(hook: Hook) -> None:
    hook.stop()
    deadline = time.monotonic() + 10
    while hook.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not hook.running


def profile(hook: Hook, work: Callable[[], None], hz: float = 100.0) -> LoopProfiler:
    """Sample this thread while it runs `work` repeatedly for SECONDS; the hook's thread is stopped after."""
    tid = threading.get_native_id()
    p = LoopProfiler(hook, lambda: tid, hz)
    sampled_by_the_hooks_thread(hook, p)
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        work()
    stopped(hook)
    return p


def shares(p: LoopProfiler) -> dict[str, float]:
    total = sum(p.counts.values())
    assert total >= 20, f"too few samples to judge: {p.counts}"
    return {w: n / total for w, n in p.counts.items()}


def top(p: LoopProfiler) -> tuple[str, str]:
    return max(p.frames, key=p.frames.__getitem__)


def pure_python(n: int = 20_000) -> None:
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1_000_003


def test_pure_python_is_python_at_its_own_line(hook: Hook) -> None:
    p = profile(hook, pure_python)
    s = shares(p)
    assert s["python"] > 0.6, s
    where, frame = top(p)
    assert where == "python" and "test_profiler.py" in frame and frame.endswith("pure_python"), frame


def test_tensor_operations_in_the_users_file_are_native(hook: Hook) -> None:
    """GIL-free operations written in the user's own file: native, on any machine (the GIL's wait is told by the
    sampler's voluntary context switches, not by a wake-up lag that a VM's late timers stretch)."""
    torch.set_num_threads(1)
    a = torch.randn(384, 384)

    def matmuls() -> None:
        b = a
        for _ in range(4):
            b = torch.tanh(b @ a) * 0.01

    s = shares(profile(hook, matmuls))
    assert s["native"] + s["waiting"] > 0.7 and s["python"] < 0.3, s


def test_torch_modules_are_native(hook: Hook) -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(20)])
    x = torch.randn(8, 16)
    s = shares(profile(hook, lambda: model(x).sum().backward()))
    assert s["native"] > 0.6, s


def test_sleeping_is_waiting(hook: Hook) -> None:
    s = shares(profile(hook, lambda: time.sleep(0.02)))
    assert s["waiting"] > 0.7, s


class Slow(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> object:
        # decoding in the loop's own process (num_workers=0): still the loop waiting for data. Longer than the GIL's
        # switch interval (5 ms) on any machine: a sampler let in only where the loop releases the GIL (collate's
        # torch.stack) would never see the dataset's frames (CI saw that once, with 20,000 iterations)
        pure_python(200_000)
        return torch.zeros(4)


def test_the_dataloader_is_data_even_when_it_runs_the_users_code(hook: Hook) -> None:
    it = iter(torch.utils.data.DataLoader(Slow(), batch_size=2))
    p = profile(hook, lambda: next(it))
    s = shares(p)
    # every sample in the dataset's own code is data; the rest is this test's loop around next() (a sampler that
    # waits for the GIL is let in at the loop's back edge more often than its share of the time)
    inside = {k: n for k, n in p.frames.items() if k[1].endswith(("pure_python", "__getitem__"))}
    assert inside and all(where == "data" for where, _ in inside), p.frames
    assert s["data"] > 0.6, (s, p.frames)
    assert top(p)[1].startswith("diagnosis/test_profiler.py:"), "the frame shown is the user's, not torch's"


def test_optimizer_and_checkpoint(hook: Hook) -> None:
    params = [torch.nn.Parameter(torch.randn(2_000_000))]
    for q in params:
        q.grad = torch.ones_like(q)
    opt = torch.optim.Adam(params, foreach=False)
    s = shares(profile(hook, opt.step))
    assert s["optimizer"] > 0.8, s
    state = {"w": torch.randn(1_000_000)}
    s = shares(profile(hook, lambda: torch.save(state, io.BytesIO())))
    assert s["checkpoint"] > 0.8, s


def test_published_as_counters_and_bounded(hook: Hook) -> None:
    p = profile(hook, pure_python)
    p.publish()
    counters = {(name, labels): s.total()[0] for (name, labels), s in hook.registry._series.items()}
    by_where = {dict(labels)["where"]: v for (name, labels), v in counters.items()
                if name == "outrider_train_loop_samples_total"}
    assert by_where == {w: n for w, n in p.counts.items() if n}
    frames = [dict(labels) for (name, labels) in counters if name == "outrider_train_loop_frame_samples_total"]
    assert any(f["frame"].endswith("pure_python") and f["where"] == "python" for f in frames), frames
    # the frame table stays bounded however many distinct lines are sampled; a late hot line still rises
    p.frames = {}
    for i in range(3 * MAX_FRAMES):
        p.count("python", f"x.py:{i} f")
    for _ in range(50):
        p.count("python", "late.py:1 hot")
    assert len(p.frames) <= MAX_FRAMES and top(p) == ("python", "late.py:1 hot")


def test_off_with_one_setting_and_bounded(hook: Hook) -> None:
    settings, problems = read({"OUTRIDER_PROFILE_HZ": "0"})
    assert settings.profile_hz == 0 and not problems
    p = LoopProfiler(hook, lambda: 0, settings.profile_hz)
    p.sample()
    assert p.period_s() == 0 and not any(name.startswith("outrider_train_loop") for name, _ in hook.registry._series)
    for bad in ("-1", "5000", "nan", "fast"):
        settings, problems = read({"OUTRIDER_PROFILE_HZ": bad})
        assert settings.profile_hz == 50.0 and problems, bad


def test_files_and_labels() -> None:
    site = "/usr/lib/python3/site-packages/torch"
    assert file_kind(f"{site}/utils/data/dataloader.py") == "data"
    assert file_kind(f"{site}/distributed/distributed_c10d.py") == "collective"
    assert file_kind(f"{site}/distributed/checkpoint/state_dict_saver.py") == "checkpoint"
    assert file_kind(f"{site}/serialization.py") == "checkpoint"
    assert file_kind(f"{site}/optim/adam.py") == "optimizer"
    assert file_kind(f"{site}/nn/modules/linear.py") == "torch"
    assert file_kind("/usr/lib/python3/site-packages/numpy/core/numeric.py") == "lib"
    assert file_kind("/home/me/train.py") == "user"
    from outrider.commands.demo import workload  # `outrider demo`'s workload stands for a user's training script

    assert file_kind(workload.__file__) == "user" and file_kind(outrider.__file__) == "outrider"
    assert frame_label("/home/me/proj/train.py", 42, "step") == "proj/train.py:42 step"
    assert len(frame_label("/x/" + "a" * 500 + ".py", 1, "f")) <= 120
    assert set(WHERE) >= {"python", "native", "waiting", "data", "collective", "checkpoint", "optimizer"}


def test_nothing_is_sampled_before_the_loop_thread_is_known(hook: Hook) -> None:
    """Before the first step the thread that will run the loop is unknown: the main thread may only be waiting
    for it (the demo's main thread joins its training thread), so no sample is taken."""
    known = [0]
    p = LoopProfiler(hook, lambda: known[0], 200.0)
    p.sample()
    assert p.period_s() == 0, "no wake-up for a loop not known yet"
    known[0] = threading.get_native_id()
    p.sample()  # the next flush knows the loop's thread
    sampled_by_the_hooks_thread(hook, p)
    deadline = time.monotonic() + 10
    while sum(p.counts.values()) < 5 and time.monotonic() < deadline:
        pure_python()
    stopped(hook)
    assert sum(p.counts.values()) >= 5, "sampled once the loop thread is known"
