"""A training step's FLOPs with zero configuration (hook/torch_flops.py): one sampled step counted with PyTorch's
FLOP formulas, against models whose FLOPs are known analytically, never raising into the loop, and replaced by the
FLOPs a step declares."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import outrider
from outrider.hook import api
from outrider.hook.runtime import Hook
from tests.helpers import value
from tests.hook.torch_hook import read, torch_hooked

torch = pytest.importorskip("torch")
nn = torch.nn


@pytest.fixture
def hooked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hook]:
    """The hook's own flushes an hour apart, so the test says when a count is asked for. The counts here need this
    thread's dispatch-mode stack empty (a mode on it defers a count, which test_a_dispatch_mode_... checks): a mode
    an earlier test of the same pytest process left on it is taken off first, and named."""
    from torch.utils import _python_dispatch as dispatch

    left = []
    while dispatch._len_torch_dispatch_stack():
        left.append(type(dispatch._pop_mode()).__qualname__)
    if left:
        warnings.warn(f"dispatch modes an earlier test left on the stack, taken off: {left}", stacklevel=1)
    with torch_hooked(tmp_path, monkeypatch, OUTRIDER_FLUSH_INTERVAL_S="3600") as hook:
        yield hook


def counted_step(hook: Hook, step: Callable[[], None]) -> None:
    """Two steps (the first count comes after two), a flush (which asks for it), then the counted step and the
    one after it (whose end ends the count)."""
    for _ in range(2):
        step()
    hook.flush()
    for _ in range(2):
        step()


def sgd_step(model: Any, x: Any) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    return step


def test_a_stack_of_linear_layers_counts_its_analytic_flops(tmp_path: Path, hooked: Hook) -> None:
    """L layers of D x D on a batch of B: 2BD^2 FLOPs per layer forward, as much again for each weight's gradient
    and each input's but the first's (the input needs none): 2BD^2 (3L - 1) a step."""
    torch.manual_seed(0)
    b, d, layers = 32, 128, 4
    counted_step(hooked, sgd_step(nn.Sequential(*[nn.Linear(d, d) for _ in range(layers)]), torch.randn(b, d)))
    parsed = read(tmp_path, hooked)
    analytic = 2 * b * d * d * (3 * layers - 1)
    counted = value(parsed, "outrider_train_step_flops", rank="", dtype="fp32")
    assert counted == pytest.approx(analytic, rel=0.01)
    assert api.S.torch.flops.counted == 1, "one step counted, not every step"
    # the flush that published the count multiplied it by the steps it drained (the two after the first flush)
    assert value(parsed, "outrider_train_flops_total", rank="", dtype="fp32") == pytest.approx(2 * counted)


class Block(nn.Module):  # type: ignore[misc]
    """A pre-norm transformer block with its attention written out (products that are bmm's): every product's
    FLOPs known analytically."""

    def __init__(self, d: int, heads: int, sdpa: bool = False) -> None:
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: Any) -> Any:
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            a = torch.softmax(q @ k.transpose(-2, -1) / (d // h) ** 0.5, dim=-1) @ v
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


def test_a_transformer_block_counts_its_analytic_flops(tmp_path: Path, hooked: Hook) -> None:
    """Forward: the projections 2BT(3D^2 + D^2 + 8D^2) and the attention's two products 2 x 2BT^2D; the backward
    twice that (every product's operands need gradients: the block's input passes through a LayerNorm with
    weights)."""
    torch.manual_seed(0)
    b, t, d, h = 4, 32, 64, 4
    counted_step(hooked, sgd_step(Block(d, h), torch.randn(b, t, d)))
    parsed = read(tmp_path, hooked)
    forward = 2 * b * t * 12 * d * d + 4 * b * t * t * d
    assert value(parsed, "outrider_train_step_flops", rank="", dtype="fp32") == pytest.approx(3 * forward, rel=0.01)


def test_cpu_attention_kernels_are_counted_as_the_flash_kernels_are(tmp_path: Path, hooked: Hook) -> None:
    """scaled_dot_product_attention on the CPU runs a kernel torch's formulas lack: counted with the flash kernels'
    (forward 4BT^2D, backward 10BT^2D: it recomputes the scores), not left out."""
    torch.manual_seed(0)
    b, t, d, h = 4, 32, 64, 4
    counted_step(hooked, sgd_step(Block(d, h, sdpa=True), torch.randn(b, t, d)))
    parsed = read(tmp_path, hooked)
    projections = 3 * 2 * b * t * 12 * d * d
    assert value(parsed, "outrider_train_step_flops", rank="", dtype="fp32") == \
        pytest.approx(projections + 14 * b * t * t * d, rel=0.01)


def test_the_flops_a_step_declares_replace_the_count(tmp_path: Path, hooked: Hook) -> None:
    model = nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 16)
    for i in range(6):
        with outrider.step(flops=1e9):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        if i == 2:
            hooked.flush()
    parsed = read(tmp_path, hooked)
    assert value(parsed, "outrider_train_flops_total", rank="", dtype="declared") == 6e9
    assert value(parsed, "outrider_train_step_flops", rank="", dtype="declared") == 1e9
    assert value(parsed, "outrider_train_flops_total", rank="", dtype="fp32") is None
    assert api.S.torch.flops.counted == 0, "a workload that declares its FLOPs is never counted"


def test_a_model_without_products_publishes_no_flops_and_says_why(tmp_path: Path, hooked: Hook) -> None:
    """Elementwise work only: nothing the formulas count. No FLOPs are published (so no MFU is made of zero), and
    the drop is counted."""
    w = nn.Parameter(torch.ones(16))
    opt = torch.optim.SGD([w], lr=1e-3)
    x = torch.randn(4, 16)

    def step() -> None:
        opt.zero_grad()
        (x * w).sum().backward()
        opt.step()

    counted_step(hooked, step)
    parsed = read(tmp_path, hooked)
    assert value(parsed, "outrider_hook_dropped_total", rank="", reason="flops_uncounted") == 1
    assert not [k for k in parsed if k[0] in ("outrider_train_flops_total", "outrider_train_step_flops")]


def test_a_formula_that_fails_never_reaches_the_loop(tmp_path: Path, hooked: Hook,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    flop_counter = pytest.importorskip("torch.utils.flop_counter")

    def broken(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("a formula that fails")

    monkeypatch.setitem(flop_counter.flop_registry, torch.ops.aten.addmm, broken)
    model = nn.Linear(16, 16)
    step = sgd_step(model, torch.randn(4, 16))
    counted_step(hooked, step)
    step()  # the loop goes on
    parsed = read(tmp_path, hooked)
    assert value(parsed, "outrider_hook_dropped_total", rank="", reason="flops_error") == 1
    assert value(parsed, "outrider_train_steps_total", rank="") == 5
    assert value(parsed, "outrider_train_step_flops", rank="", dtype="fp32") is None


def test_a_new_batch_shape_is_counted_again_at_most_once_a_minute(tmp_path: Path, hooked: Hook) -> None:
    """The samples per step (from the DataLoader's batches) double: a count that finds twice the FLOPs, once the
    new shape has held for three flushes and a minute has passed since the last count; an epoch's short last batch
    is no new shape."""
    torch.manual_seed(0)
    model = nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    now = [0.0]
    api.S.torch.flops.clock = lambda: now[0]

    def epoch(batch: int, samples: int = 128) -> None:
        for (x,) in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(samples, 32)),
                                                batch_size=batch):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            hooked.flush()

    epoch(8)
    first = api.S.steps.counted_flops
    assert first is not None and api.S.torch.flops.counted == 1
    now[0] = 100.0
    for _ in range(3):
        epoch(8, samples=100)  # 12 batches of 8 and one of 4
    assert api.S.torch.flops.counted == 1, "a short last batch is not a new shape"
    epoch(16)
    assert api.S.torch.flops.counted == 2
    assert api.S.steps.counted_flops == {"fp32": pytest.approx(2 * first["fp32"])}
    epoch(32)
    assert api.S.torch.flops.counted == 2, "not within a minute of the last count"
    now[0] = 200.0
    epoch(32)
    assert api.S.torch.flops.counted == 3


def test_a_dispatch_mode_of_the_workloads_puts_the_count_off(tmp_path: Path, hooked: Hook) -> None:
    """A mode the workload holds over its steps: the count is never taken under it (its stack is the workload's),
    and is taken at the first flush after it is gone."""
    dispatch = pytest.importorskip("torch.utils._python_dispatch")

    class Passing(dispatch.TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    step = sgd_step(nn.Linear(16, 16), torch.randn(4, 16))
    with Passing():
        counted_step(hooked, step)
    assert api.S.torch.flops.counted == 0
    assert api.S.torch.flops.mode is None
    counted_step(hooked, step)
    parsed = read(tmp_path, hooked)
    assert value(parsed, "outrider_hook_dropped_total", rank="", reason="flops_mode_busy") == 1
    assert value(parsed, "outrider_train_step_flops", rank="", dtype="fp32") == 2 * 4 * 16 * 16 * 2


def test_a_process_forked_during_a_counted_step_runs_without_the_counting_mode(tmp_path: Path, hooked: Hook) -> None:
    """A DataLoader's workers are forked by a new epoch's iterator, which may be inside the counted step: they
    inherit the forking thread's dispatch modes, and ours must leave them (every operation through Python, for the
    workers' whole life, otherwise)."""
    import os

    dispatch = pytest.importorskip("torch.utils._python_dispatch")
    step = sgd_step(nn.Linear(16, 16), torch.randn(4, 16))
    for _ in range(2):
        step()
    hooked.flush()
    step()  # its end begins the count
    assert api.S.torch.flops.mode is not None
    pid = os.fork()
    if pid == 0:
        os._exit(0 if dispatch._len_torch_dispatch_stack() == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child still had the counting mode"
    step()  # the parent's count goes on and ends
    assert api.S.torch.flops.counted == 1


def test_a_count_no_step_end_ends_in_time_stops_counting_and_is_dropped(
        tmp_path: Path, hooked: Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop that stops right after a count began: what its thread runs later (an evaluation) is not one step, is
    not counted (its operations pass through uncounted), and the count is dropped at the next step end, which
    takes the mode off; the next count is a normal one."""
    import time

    from outrider.hook import torch_flops

    monkeypatch.setattr(torch_flops, "COUNT_BOUND_S", 0.3)
    model, x = nn.Linear(16, 16), torch.randn(4, 16)
    step = sgd_step(model, x)
    for _ in range(2):
        step()
    hooked.flush()
    step()  # its end begins the count
    mode = api.S.torch.flops.mode
    assert mode is not None and mode.counting
    time.sleep(0.5)  # the loop has stopped; later, an evaluation on the same thread
    with torch.no_grad():
        model(x)
    assert mode.expired and not mode.counting and not mode.totals, "the evaluation counted as the step's"
    step()  # a step end, at last: the mode leaves, the count is dropped
    assert api.S.torch.flops.mode is None and api.S.torch.flops.counted == 0
    parsed = read(tmp_path, hooked)
    assert value(parsed, "outrider_hook_dropped_total", rank="", reason="flops_expired") == 1
    assert value(parsed, "outrider_train_step_flops", rank="", dtype="fp32") is None
    monkeypatch.setattr(torch_flops, "COUNT_BOUND_S", 60.0)
    api.S.torch.flops.last_at = None  # due again at once
    counted_step(hooked, step)
    assert value(read(tmp_path, hooked), "outrider_train_step_flops", rank="", dtype="fp32") == 2 * 4 * 16 * 16 * 2
