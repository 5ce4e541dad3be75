"""Zero configuration with PyTorch: instrument() alone times every DataLoader (single-process and multi-worker),
never twice with the explicit wrapper, keeps forked loader workers silent, splits the loop's wall time, counts
operations per step, and times torch.distributed collectives (gloo, in this process) and DDP's gradient buckets."""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import outrider
from outrider.hook import api
from outrider.hook.runtime import Hook
from outrider.hook.settings import HookSettings
from tests.helpers import free_port, value
from tests.hook.torch_hook import read, torch_hooked

torch = pytest.importorskip("torch")


class Squares(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> Any:
        return torch.full((4,), float(i)), torch.tensor(i % 2)


@pytest.fixture
def hooked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hook]:
    """instrument() with torch imported, publishing to tmp_path; torch's classes are put back afterwards."""
    with torch_hooked(tmp_path, monkeypatch) as hook:
        yield hook


def train(loader: Any, epochs: int = 1) -> int:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
    return steps


def test_every_dataloader_is_timed_without_a_wrapper(tmp_path: Path, hooked: Hook) -> None:
    steps = train(torch.utils.data.DataLoader(Squares(), batch_size=4), epochs=2)
    parsed = read(tmp_path, hooked)
    assert value(parsed, "outrider_train_data_wait_seconds_count", rank="") == steps == 12
    assert value(parsed, "outrider_train_steps_total", rank="") == 12
    wait = value(parsed, "outrider_train_loop_seconds_total", rank="", part="data_wait")
    step = value(parsed, "outrider_train_loop_seconds_total", rank="", part="step")
    other = value(parsed, "outrider_train_loop_seconds_total", rank="", part="other")
    assert wait is not None and step is not None and other is not None and wait > 0 and step > 0
    wall = value(parsed, "outrider_train_step_duration_seconds_sum", rank="")
    assert wait + step + other == pytest.approx(wall, rel=1e-6), "the parts add up to the steps' wall time"
    ops = value(parsed, "outrider_train_autograd_ops_total", rank="")
    assert ops is not None and ops >= 12 * 3, "linear, cross_entropy's parts: several operations per step"


class Slow(torch.utils.data.Dataset):  # type: ignore[misc]
    """Each item takes at least SLOW_S to load: a DataLoader wait of a known length."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> Any:
        time.sleep(SLOW_S)
        return torch.full((4,), float(i)), torch.tensor(i % 2)


SLOW_S = 0.05


def test_a_dataloader_wait_is_measured_as_its_length_on_torchs_own_path(tmp_path: Path, hooked: Hook) -> None:
    """A loader of batch 1 whose items take 50 ms each, iterated by torch's own DataLoader with zero configuration,
    and a loop body that takes 50 ms too: every wait is at least the 50 ms the item took (load can only lengthen
    it), and all of them together at most the loop's measured wall time less its bodies' sleeps (a wait stamped
    after the batch arrived measures ~0; one that ran on into the body measures the body too)."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    t0 = time.perf_counter()
    n = 0
    for x, y in torch.utils.data.DataLoader(Slow(), batch_size=1, num_workers=0):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        time.sleep(SLOW_S)
        opt.step()
        n += 1
    wall = time.perf_counter() - t0
    parsed = read(tmp_path, hooked)
    assert value(parsed, "outrider_train_data_wait_seconds_count", rank="") == n == 6
    total = value(parsed, "outrider_train_data_wait_seconds_sum", rank="")
    assert total is not None
    assert value(parsed, "outrider_train_data_wait_seconds_bucket", rank="", le="0.025") == 0, \
        "no wait shorter than half the item's 50 ms"
    assert total >= n * SLOW_S, f"{n} waits of at least {SLOW_S} s each: {total}"
    assert total <= wall - n * SLOW_S, f"the waits ({total} s) fit in the loop's {wall} s less its bodies' sleeps"


def test_the_explicit_wrapper_never_counts_a_wait_twice(tmp_path: Path, hooked: Hook) -> None:
    steps = train(outrider.dataloader(torch.utils.data.DataLoader(Squares(), batch_size=4)))
    parsed = read(tmp_path, hooked)
    assert value(parsed, "outrider_train_data_wait_seconds_count", rank="") == steps == 6
    assert list(outrider.dataloader([1, 2, 3])) == [1, 2, 3], "other iterables are still timed by the wrapper"
    assert value(read(tmp_path, hooked), "outrider_train_data_wait_seconds_count", rank="") == 9


def test_samples_per_second_with_zero_configuration_from_the_batches_the_loaders_yield(tmp_path: Path,
                                                                                        hooked: Hook) -> None:
    """No `samples=` anywhere: the batches' first dimension counts the samples (24 a pass of batch 4, twice)."""
    train(torch.utils.data.DataLoader(Squares(), batch_size=4), epochs=2)
    assert value(read(tmp_path, hooked), "outrider_samples_total", rank="") == 48


def test_samples_the_user_counts_replace_the_batches_and_are_never_added_to_them(tmp_path: Path,
                                                                                hooked: Hook) -> None:
    model = torch.nn.Linear(4, 2)
    for x, _ in torch.utils.data.DataLoader(Squares(), batch_size=4):
        with outrider.step(samples=3):  # the user's own count (3 a step), not the batch's 4
            model(x).sum().backward()
    assert value(read(tmp_path, hooked), "outrider_samples_total", rank="") == 18


@pytest.mark.parametrize(("batch", "size"), [
    (torch.zeros(8, 3), 8),
    ([torch.zeros(5, 3), torch.zeros(5)], 5),  # default_collate of (input, label) pairs
    ((torch.zeros(6, 2), torch.zeros(6)), 6),
    ({"input_ids": torch.zeros(7, 128), "attention_mask": torch.zeros(7, 128)}, 7),
    ({"text": ["a", "b"], "input_ids": torch.zeros(2, 16)}, 2),  # the first tensor, after a list of strings
    ([torch.zeros(5, 3), "a label"], 5),  # the first tensor, not the last item
    ((torch.zeros(3, 2), torch.zeros(7)), 3),
    ([None] * 7 + [torch.zeros(4, 1)], 4),  # the eighth item is looked at (LOOKED_AT)
    ([None] * 8 + [torch.zeros(4, 1)], 0),  # the ninth is not
    (types.SimpleNamespace(shape=("dynamic",)), 0),  # a shape that is no number
    (["a", "b", "c"], 0),  # no tensor: no count
    (torch.tensor(3.0), 0),  # a 0-d tensor has no batch dimension
    (object(), 0),
])
def test_the_batch_size_is_the_first_dimension_of_the_first_tensor(batch: Any, size: int) -> None:
    from outrider.hook.torch_data import batch_size

    assert batch_size(batch) == size


def test_multi_worker_loaders_are_timed_and_their_workers_stay_silent(tmp_path: Path, hooked: Hook) -> None:
    loader = torch.utils.data.DataLoader(Squares(), batch_size=4, num_workers=2)
    steps = train(loader)
    parsed = read(tmp_path, hooked)
    assert value(parsed, "outrider_train_data_wait_seconds_count", rank="") == steps == 6
    shards = list(tmp_path.glob("*.shard"))
    assert len(shards) == 1, f"the forked workers publish nothing of their own: {shards}"
    assert not api.S.waits.starting_workers, "the parent is measuring again once its workers are started"


def our_optimizer_hooks() -> list[Any]:
    import torch.optim.optimizer as optimizer_module

    return [h for h in optimizer_module._global_optimizer_post_hooks.values() if h is api.S.torch.on_optimizer_step]


def test_the_first_explicit_step_takes_the_optimizer_hook_out_of_torchs_step(tmp_path: Path, hooked: Hook) -> None:
    """Counted by the optimizer hook until the user times a step; from then on torch's step no longer calls it (it
    would only return at once), and every step is counted once."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 0, 1])

    def one() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(3):
        one()
    assert len(our_optimizer_hooks()) == 1
    for _ in range(4):
        with outrider.step(samples=4):
            one()
    assert our_optimizer_hooks() == [], "out of torch's step"
    parsed = read(tmp_path, hooked)
    assert value(parsed, "outrider_train_steps_total", rank="") == 7
    assert value(parsed, "outrider_samples_total", rank="") == 16


def test_operations_are_read_at_the_first_step_after_a_flush_asked(tmp_path: Path, hooked: Hook) -> None:
    """The loop runs on a thread of its own; flushes on another thread cannot read its autograd counter (it is the
    loop thread's), so a flush asks, and the loop's next step end reads it: the next flush publishes that."""
    import queue
    import threading

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    go: queue.SimpleQueue[int] = queue.SimpleQueue()
    seen: queue.SimpleQueue[int] = queue.SimpleQueue()

    def loop() -> None:
        while (steps := go.get()) > 0:
            for _ in range(steps):
                opt.zero_grad()
                model(torch.ones(1, 4)).sum().backward()
                opt.step()
            seen.put(torch._C._autograd._get_sequence_nr())

    hooked.stop()  # the publisher thread flushes no more: the test's flushes are the only ones
    hooked.flush()
    t = threading.Thread(target=loop)
    t.start()
    try:
        go.put(5)
        first = seen.get(timeout=60)
        read(tmp_path, hooked)  # asks
        go.put(1)
        after_one = seen.get(timeout=60)
        per_step = after_one - first
        assert per_step > 0
        ops = value(read(tmp_path, hooked), "outrider_train_autograd_ops_total", rank="")  # publishes, asks again
        assert ops == after_one, "the counter as the loop's first step after the ask read it"
        go.put(3)
        assert seen.get(timeout=60) == after_one + 3 * per_step
        assert value(read(tmp_path, hooked), "outrider_train_autograd_ops_total", rank="") == after_one + per_step, \
            "read at the first of the three steps only"
    finally:
        go.put(0)
        t.join()


def test_a_torch_without_dataloader_internals_is_said_once_and_the_hook_runs_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from outrider.hook.torch_integration import TorchIntegration

    future = types.SimpleNamespace(optim=torch.optim, cuda=torch.cuda, get_num_threads=lambda: 4,
                                   utils=types.SimpleNamespace(data=types.SimpleNamespace(dataloader=object())),
                                   distributed=types.SimpleNamespace(is_available=lambda: False))
    state = api.HookState()
    hook = Hook(HookSettings(spool_dir=str(tmp_path), standalone=False))
    integ = TorchIntegration(hook, state, future, timing=True)
    try:
        assert integ.data is None and integ.distributed is None
        assert "outrider: cannot time DataLoader waits automatically in this torch (" in caplog.text
        assert "'object' object has no attribute '_BaseDataLoaderIter'); wrap loaders in outrider.dataloader() to " \
               "measure them" in caplog.text, caplog.text
        assert list(outrider.dataloader([1, 2])) == [1, 2]
    finally:
        integ.detach()


# --- torch.distributed, gloo, one process ------------------------------------------------------------------------

@pytest.fixture
def gloo(hooked: Hook) -> Iterator[Any]:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def collectives(tmp_path: Path, hook: Hook) -> dict[str, float]:
    parsed = read(tmp_path, hook)
    return {dict(labels)["op"]: v for (name, labels), v in parsed.items()
            if name == "outrider_train_collective_seconds_total"}


def test_blocking_collectives_are_timed_async_ones_and_nested_ones_are_not(tmp_path: Path, hooked: Hook,
                                                                          gloo: Any) -> None:
    t = torch.ones(8)
    gloo.all_reduce(t)
    gloo.broadcast(t, src=0)
    work = gloo.all_reduce(t, async_op=True)
    work.wait()
    gloo.all_gather_object([None], {"a": 1})  # calls all_gather inside: timed once, as itself
    with pytest.raises(ValueError):
        gloo.broadcast(t, src=0, group="not a group")  # the collective's own error reaches the caller
    ops = collectives(tmp_path, hooked)
    assert set(ops) == {"all_reduce", "broadcast", "all_gather_object"}, ops
    assert torch.equal(t, torch.ones(8)), "results untouched"


def gil_turn_during(call: Callable[[], None]) -> bool:
    """Whether a thread waiting for the GIL got it during call(), this thread keeping the GIL otherwise (a switch
    interval longer than the test, no blocking call)."""
    ran: list[bool] = []
    started = threading.Event()

    def waiting() -> None:
        started.set()
        time.sleep(0.02)  # then it waits for the GIL, which the busy loop below keeps
        ran.append(True)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    thread = threading.Thread(target=waiting)
    try:
        thread.start()
        started.wait()
        end = time.perf_counter() + 0.1
        while time.perf_counter() < end:
            pass
        before = bool(ran)
        call()
        got = bool(ran)
    finally:
        sys.setswitchinterval(interval)
        thread.join()
    assert not before, "the waiting thread ran before the call: the test cannot tell"
    return got


def test_a_process_that_ran_a_collective_lets_torchs_threads_have_the_gil_before_it_finalises(hooked: Hook,
                                                                                               gloo: Any) -> None:
    """torch's gloo threads free a finished collective's work after the caller has its result, and need the GIL
    for it; at interpreter finalisation that aborts the process (SIGABRT, seen in CI's torchrun tests). The timer's
    atexit pause is their turn; a process without collectives exits without it."""
    timer = api.S.torch.distributed
    timer.ran_collective = False
    assert not gil_turn_during(timer.settle_at_exit), "no collective: no pause"
    gloo.all_reduce(torch.ones(4))
    assert timer.ran_collective
    assert gil_turn_during(timer.settle_at_exit), "a thread waiting for the GIL runs during the exit pause"


def test_ddp_buckets_are_timed_through_a_comm_hook(tmp_path: Path, hooked: Hook, gloo: Any) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    x = torch.randn(8, 4)
    ddp(x).sum().backward()
    reference(x).sum().backward()
    assert torch.allclose(model.weight.grad, reference.weight.grad), "averaged over one rank: the plain gradient"
    assert collectives(tmp_path, hooked).get("ddp_bucket", 0) > 0


def test_a_users_comm_hook_is_wrapped_and_still_runs(tmp_path: Path, hooked: Hook, gloo: Any) -> None:
    called = []

    def halve(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects postponed (string) annotations
        called.append(bucket.index())
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer() / 2)
        return fut

    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, halve)
    ddp(torch.ones(2, 4)).sum().backward()
    assert called, "the user's hook ran"
    assert torch.allclose(model.bias.grad, torch.ones(2)), "its result is what DDP used (2 samples, halved)"
    assert collectives(tmp_path, hooked).get("ddp_bucket", 0) > 0


def test_thread_roles_in_a_training_process(tmp_path: Path, hooked: Hook) -> None:
    train(torch.utils.data.DataLoader(Squares(), batch_size=4, num_workers=1))
    a = torch.randn(384, 384)
    for _ in range(20):
        a = torch.tanh(a @ a)  # the intra-op pool works (when torch has more than one thread)
    parsed = read(tmp_path, hooked)
    cpu = {dict(labels)["role"]: v for (name, labels), v in parsed.items()
           if name == "outrider_thread_cpu_seconds_total"}
    assert set(cpu) == {"main", "intra_op", "data_workers", "other", "outrider"}
    assert cpu["main"] > 0 and cpu["data_workers"] > 0, cpu
    if torch.get_num_threads() > 1:
        assert cpu["intra_op"] > 0, cpu
    assert value(parsed, "outrider_threads", rank="", role="main") == 1
    assert value(parsed, "outrider_torch_intra_op_threads", rank="") == torch.get_num_threads()
    if os.path.exists(f"/proc/{os.getpid()}/schedstat"):
        assert value(parsed, "outrider_thread_run_delay_seconds_total", rank="", role="main") is not None


def test_iterating_a_dataloader_alone_does_not_make_a_training_process(tmp_path: Path, hooked: Hook) -> None:
    """Batch inference iterates DataLoaders too: no first-step-pending (and so no 'no first step' stall) for it."""
    with torch.no_grad():
        for x, _ in torch.utils.data.DataLoader(Squares(), batch_size=4):
            torch.nn.functional.relu(x)
    hooked.flush()
    assert not hooked.progress.training
    assert value(read(tmp_path, hooked), "outrider_train_data_wait_seconds_count", rank="") == 6


# --- samples counted without looking at every batch ----------------------------------------------------------------

class Sized(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return torch.full((4,), float(i)), torch.tensor(i % 2)


class Uneven(torch.utils.data.Sampler):  # type: ignore[misc]
    """A batch sampler of its own: batches of 1, 2, 3, ... indices."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[list[int]]:
        i, k = 0, 1
        while i < self.n:
            yield list(range(i, min(i + k, self.n)))
            i, k = i + k, k + 1


def packed(items: list[Any]) -> Any:
    """A collate whose first dimension is not the samples' count, nor the same from batch to batch: sample i packs
    i % 3 + 1 rows (as sequences packed into one batch do)."""
    rows = [x.repeat(int(x[0]) % 3 + 1, 1) for x, _ in items]
    x = torch.cat(rows)
    return x, torch.zeros(len(x), dtype=torch.long)


@pytest.mark.parametrize(("loader", "per_epoch"), [
    (lambda: torch.utils.data.DataLoader(Sized(100), batch_size=32), 100),  # a short last batch of 4
    (lambda: torch.utils.data.DataLoader(Sized(100), batch_size=32, drop_last=True), 96),
    (lambda: torch.utils.data.DataLoader(Sized(100), batch_size=32, shuffle=True), 100),
    (lambda: torch.utils.data.DataLoader(Sized(100), batch_size=32, num_workers=2, persistent_workers=True), 100),
    (lambda: torch.utils.data.DataLoader(Sized(100), batch_size=32, num_workers=2, in_order=False), 100),
    (lambda: torch.utils.data.DataLoader(Sized(100), batch_sampler=Uneven(100)), 100),
    (lambda: torch.utils.data.DataLoader(Sized(100), batch_size=32, collate_fn=packed), 199),
])
def test_the_samples_of_every_batch_count_exactly_when_only_some_are_looked_at(
        tmp_path: Path, hooked: Hook, loader: Callable[[], Any], per_epoch: int) -> None:
    """An iterator's first and last batches are measured, those between them known from torch's BatchSampler: a
    short last batch, a dropped one, persistent workers across epochs count exactly; a batch sampler of its own,
    out-of-order workers and a collate that changes the first dimension have every batch measured."""
    train(loader(), epochs=3)
    assert value(read(tmp_path, hooked), "outrider_samples_total", rank="") == 3 * per_epoch


def test_only_the_first_and_last_batches_of_a_fixed_size_sampler_are_looked_at(
        hooked: Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    from outrider.hook import torch_data

    looked: list[int] = []
    real = torch_data.batch_size
    monkeypatch.setattr(torch_data, "batch_size", lambda b: looked.append(1) or real(b))
    api.S.torch.data.detach()
    api.S.torch.data = torch_data.attach(api.S.waits, torch)  # __next__ binds the function it calls
    train(torch.utils.data.DataLoader(Sized(100), batch_size=8), epochs=2)
    assert len(looked) == 2 * 2, "the first and the last batch of each of two epochs (13 batches each)"


class SlowMiddle(Sized):
    """Its third batch of 32 (items 64-95) is slow to load, its short last batch fast: out of order, the short one
    arrives before it."""

    def __getitem__(self, i: int) -> Any:
        if 64 <= i < 96:
            time.sleep(0.01)
        return super().__getitem__(i)


def test_out_of_order_workers_have_every_batch_measured(tmp_path: Path, hooked: Hook) -> None:
    """in_order=False: the short batch can come before a full one, so no size is known from the sampler."""
    loader = torch.utils.data.DataLoader(SlowMiddle(100), batch_size=32, num_workers=2, in_order=False)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sizes = []
    for _ in range(2):
        for x, y in loader:
            sizes.append(len(x))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert sizes.index(4) < len(sizes) // 2 - 1, f"the short batch came before the last full one: {sizes}"
    assert value(read(tmp_path, hooked), "outrider_samples_total", rank="") == 200


def test_dataloaders_are_not_timed_twice_and_detach_leaves_a_later_patch(hooked: Hook,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    from outrider.hook import torch_data

    base = torch.utils.data.dataloader._BaseDataLoaderIter
    timed = base.__dict__["__next__"]
    assert torch_data.attach(api.S.waits, torch) is None, "a second timer on the same torch is refused"
    assert "cannot time DataLoader waits automatically in this torch (DataLoader iterators are already timed by " \
           "another Outrider hook); wrap" in caplog.text, caplog.text
    assert base.__dict__["__next__"] is timed
    timer = api.S.torch.data
    assert timer is not None

    def theirs(self: Any) -> Any:  # another library's patch, made after the hook's
        return timed(self)

    base.__next__ = theirs
    try:
        timer.detach()
        assert base.__dict__["__next__"] is theirs, "detach puts torch's back only over its own"
    finally:
        base.__next__ = timer.original_next
