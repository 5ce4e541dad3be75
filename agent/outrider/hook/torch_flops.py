"""A training step's model FLOPs with zero configuration: one step counted now and then, never every step.

Which steps: the first step to end after two have completed (past a first step's compilation and warm-up), then
one every `flops_every_s` (600 s by default; 0: never), and one soon after the steps' shape changes, as far as the
publisher can see it without looking at a batch: the samples or tokens per step (from their counters, over a flush)
moving by more than SHAPE_CHANGE from those of the last count, for SHAPE_FLUSHES flushes in a row (an epoch's short
last batch is no new shape), at most one such count every SHAPE_MIN_S (a job whose batches vary all the time is
counted once a minute at most, never every flush). A step that declares its FLOPs (`outrider.step(flops=...)`)
turns the counting off for good: the workload knows better.

How: the publisher thread asks (`plan()`); the training thread counts, at the step ends the hot path already calls
back at once a flush (`StepState.want_ops`, which the torch integration's step-end reader answers): at one step's
end it enters a counting dispatch mode, and asks to be called at the next step's end too, where it leaves it. So
exactly one iteration is counted, the step's forward, backward and optimizer work and whatever the loop does
between two step ends (a DataLoader's collation has no FLOPs; an evaluation run between them would be counted), on
the training thread and on the autograd threads its backward runs on (the mode travels with autograd's thread-local
state). The hot path is unchanged: no check, no call more than before.

The count: PyTorch's own FLOP formulas (torch.utils.flop_counter's registry, FlopCounterMode's: matrix products,
convolutions, attention kernels), in a dispatch mode of our own that keeps them by the dtype of each operation's
first input (fp32 products on CUDA with TF32 allowed count as tf32), which FlopCounterMode does not, and without the
module hooks FlopCounterMode installs for its per-module table. Operations without a formula are decomposed as
FlopCounterMode decomposes them; the CPU's attention kernels, which the registry lacks, get the formulas of the
flash kernels. Counted FLOPs are what ran: an activation-checkpointed step's recomputation is counted (declare
`flops=` for the model FLOPs of the PaLM convention, which leaves it out). Where the accelerator and the CPU both
ran counted work in the step, the device that ran the most is the step's.

Its cost: the counted step runs every operation through a Python dispatch handler (tens of microseconds each), once
per `flops_every_s`; benchmarks/flop_count.py measures it. It never raises into the workload: a formula that fails
is counted (`flops_error`) and leaves that step uncounted; a step that counted no FLOPs at all (a model of custom
kernels, a CUDA graph replay) is counted (`flops_uncounted`) and publishes none, so no MFU is made of it; a dispatch
mode of the workload's own on the stack at the step's end defers the count to a later step (`flops_mode_busy`). A
count that no step end ends within COUNT_BOUND_S (or STEPS_BOUND times the last step's time) stops counting and is
dropped at the next step end (`flops_expired`): a loop that stopped right after a count began would otherwise
count whatever its thread runs next, an evaluation, at the counting's cost. The mode itself can only leave the
stack at a step end (or a fork, or detach); until then it passes every operation on uncounted.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any

from outrider.hook.state import StepState

LOG = logging.getLogger("outrider.hook")
AFTER_STEPS = 2  # the first count: the first step to end after this many
SHAPE_CHANGE = 0.01  # samples or tokens per step moving by more than this share asks for a new count
SHAPE_FLUSHES = 3  # flushes in a row with another shape
SHAPE_MIN_S = 60.0  # the least time between two counts
# A count not ended by a step end within this long (or STEPS_BOUND of the last step's time, if longer) stops
# counting: a loop that stopped right after a count began (its last step, or a break) has no step end to leave
# the mode at, so whatever runs after (an evaluation, a save) would be counted as one step at the counting's cost
COUNT_BOUND_S = 60.0
STEPS_BOUND = 10
BURIED_TRIES = 8  # step ends at which a mode of the workload's sits over ours before we wait for flushes instead
# dtype names as the FLOPs' label has them (and the peak table: outrider/ground/peaks.py)
DTYPES = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8",
          "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8", "float8_e8m0fnu": "fp8"}
CONVOLUTIONS = ("convolution", "_convolution", "cudnn_convolution", "convolution_overrideable",
                "_slow_conv2d_forward", "convolution_backward")
# The CPU's attention kernels, which torch's registry has no formula for: (CPU op, the CUDA op whose formula fits
# its arguments: query, key, value; grad_out, query, key, value)
CPU_ATTENTION = (("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention"),
                 ("_scaled_dot_product_flash_attention_for_cpu_backward",
                  "_scaled_dot_product_flash_attention_backward"))
# The operations FlopCounterMode leaves to the next handler (size and stride queries of tensor subclasses)
PASSED_ON = ("sym_is_contiguous.default", "is_contiguous.default", "is_contiguous.memory_format",
             "is_strides_like_format.default", "is_non_overlapping_and_dense.default", "size.default",
             "sym_size.default", "stride.default", "sym_stride.default", "storage_offset.default",
             "sym_storage_offset.default", "numel.default", "sym_numel.default", "dim.default")


class FlopCounter:
    """Counts one step's FLOPs when due (see the module's docstring). plan() is the publisher's; at_step_end() the
    training thread's; `steps.counted_flops` is where a count lands."""

    def __init__(self, torch: Any, steps: StepState, drop: Callable[[str], None], every_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.torch = torch
        self.steps = steps
        self.drop = drop
        self.every_s = every_s
        self.clock = clock
        self.wanted = False  # the publisher asked for a count: the next step end begins one
        self.mode: Any = None  # the counting mode, from one step end to the next
        self.tries = 0  # step ends at which our mode was not the top of the dispatch stack
        self.last_at: float | None = None  # when the last count was asked for (the clock's)
        self.shape: tuple[float, float] | None = None  # samples and tokens per step at the last count
        self.reshaped = 0  # flushes in a row whose shape was not the last count's
        self.counted = 0  # steps counted
        self.counted_s = 0.0  # their wall time, the counting's overhead included
        self._mode_class: Any = None
        self._stack: Any = None  # torch.utils._python_dispatch
        self.unavailable = every_s <= 0

    # --- the publisher thread ------------------------------------------------------------------------------------
    def plan(self, shape: tuple[float, float] | None) -> None:
        """Asks for a count when one is due. shape: samples and tokens per step over the last flush (None: no step
        in it). The counting mode is built here, so torch.utils.flop_counter is imported on this thread, not the
        loop's."""
        if self.unavailable or self.wanted or self.mode is not None or self.steps.flops_declared:
            return
        if self.steps.ring.n < AFTER_STEPS:
            return
        now = self.clock()
        if shape is not None and self.shape is not None:
            self.reshaped = self.reshaped + 1 if _moved(shape, self.shape) else 0
        reshaped = self.reshaped >= SHAPE_FLUSHES and now - (self.last_at or 0.0) >= SHAPE_MIN_S
        due = self.last_at is None or now - self.last_at >= self.every_s or reshaped
        if not due or not self._prepare():
            return
        self.last_at = now
        self.reshaped = 0
        if shape is not None:
            self.shape = shape
        self.wanted = True

    def _prepare(self) -> bool:
        if self._mode_class is not None:
            return True
        try:
            self._mode_class, self._stack = _counting_mode(self.torch)
            return True
        except Exception as e:  # a torch without the registry or dispatch modes (older, or a future one)
            self.unavailable = True
            LOG.info("outrider: this torch cannot count FLOPs (%s): no MFU unless steps declare their FLOPs", e)
            return False

    # --- the training thread, at a step's end --------------------------------------------------------------------
    def at_step_end(self) -> None:
        try:
            if self.mode is not None:
                self._finish()
            elif self.wanted:
                self.wanted = False
                self._begin()
        except Exception:
            self.drop("flops_error")

    def after_fork_in_child(self) -> None:
        """A process forked during a counted step (a DataLoader's workers, started by a new epoch's iterator)
        inherits the forking thread's dispatch modes: ours leaves the child at once, so its work runs at full
        speed and is never counted as the parent's."""
        self.leave()

    def leave(self) -> None:
        """Our counting mode off this thread's stack where it is on top, uncounted: in a forked child, and when the
        integration is detached (a count begun at a loop's last step stays on the stack until a step ends)."""
        mode, self.mode, self.wanted = self.mode, None, False
        if mode is None:
            return
        try:
            if self._stack._get_current_dispatch_mode() is mode:
                mode.__exit__(None, None, None)
        except Exception:
            self.drop("flops_error")

    def _begin(self) -> None:
        torch = self.torch
        cuda = torch.cuda
        if self._stack._len_torch_dispatch_stack() or (cuda.is_initialized() and cuda.is_current_stream_capturing()):
            # a mode of the workload's (or a CUDA graph being captured): never counted under it; the next flush asks
            # again
            self.drop("flops_mode_busy")
            self.last_at = None
            return
        backends = torch.backends
        mode = self._mode_class(bool(backends.cuda.matmul.allow_tf32), bool(backends.cudnn.allow_tf32))
        mode.began = perf_counter()
        ring = self.steps.ring
        last_step_s = ring.end_of(ring.n - 1) - ring.end_of(ring.n - 2) if ring.n >= 2 else 0.0
        mode.until = mode.began + max(COUNT_BOUND_S, STEPS_BOUND * last_step_s)
        mode.__enter__()
        self.mode = mode
        self.tries = 0
        self.steps.want_ops = True  # called back at the next step's end, which ends the count

    def _finish(self) -> None:
        mode = self.mode
        if self._stack._get_current_dispatch_mode() is not mode:
            # a mode the workload entered during the step sits over ours: ours leaves when it is on top again
            self.tries += 1
            if self.tries == 1:
                self.drop("flops_mode_busy")
            mode.counting = False
            if self.tries < BURIED_TRIES:
                self.steps.want_ops = True  # else at the step ends the flushes ask for (want_ops, once a flush)
            return
        mode.__exit__(None, None, None)
        self.mode = None
        if mode.expired:
            self.drop("flops_expired")
            return
        if not mode.counting:
            return  # buried for a while: its count is not one step's
        self.counted += 1
        self.counted_s += perf_counter() - mode.began
        if mode.errors:
            self.drop("flops_error")
            return
        totals: dict[tuple[str, str], float] = mode.totals
        if not totals:
            self.drop("flops_uncounted")
            return
        by_device: dict[str, float] = {}
        for (device, _), flops in totals.items():
            by_device[device] = by_device.get(device, 0.0) + flops
        device = max(by_device, key=lambda d: by_device[d])
        self.steps.counted_flops = {dtype: flops for (where, dtype), flops in totals.items() if where == device}


def _moved(now: tuple[float, float], then: tuple[float, float]) -> bool:
    """Whether samples or tokens per step moved (where both flushes counted them: a count that stops is no shape)."""
    return any(abs(a - b) > SHAPE_CHANGE * b for a, b in zip(now, then) if a > 0 and b > 0)


def _counting_mode(torch: Any) -> tuple[Any, Any]:
    """The counting dispatch mode's class for this torch (torch is the user's: its submodules are imported here,
    once torch itself is loaded), and torch.utils._python_dispatch."""
    flop_counter = importlib.import_module("torch.utils.flop_counter")
    dispatch = importlib.import_module("torch.utils._python_dispatch")
    aten = torch.ops.aten
    registry: dict[Any, Callable[..., int]] = dict(flop_counter.flop_registry)
    for cpu_name, like in CPU_ATTENTION:
        op, formula = getattr(aten, cpu_name, None), registry.get(getattr(aten, like, None))
        if op is not None and formula is not None:
            registry.setdefault(op, formula)
    convolutions = frozenset(getattr(aten, name) for name in CONVOLUTIONS if hasattr(aten, name))
    passed_on = frozenset(_op(aten, name) for name in PASSED_ON) | {torch.ops.prim.layout.default}
    passed_on = frozenset(op for op in passed_on if op is not None)
    higher_order = torch._ops.HigherOrderOperator
    device_op = torch.ops.prim.device.default
    tensor = torch.Tensor
    dtype_names = {getattr(torch, name): label for name, label in DTYPES.items() if hasattr(torch, name)}

    class CountingMode(dispatch.TorchDispatchMode):  # type: ignore[misc, name-defined]
        supports_higher_order_operators = True

        def __init__(self, tf32_matmul: bool, tf32_conv: bool) -> None:
            super().__init__()
            self.tf32_matmul, self.tf32_conv = tf32_matmul, tf32_conv
            self.totals: dict[tuple[str, str], float] = {}  # (device type, dtype) -> FLOPs
            self.errors = 0
            self.counting = True  # False: buried under a mode of the workload's, or expired: passing all on
            self.began = 0.0
            self.until = float("inf")  # perf_counter's time past which the count stops (COUNT_BOUND_S)
            self.expired = False

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func in passed_on or isinstance(func, higher_order):
                return NotImplemented
            if self.counting and perf_counter() > self.until:
                # no step end came to end the count: what runs now is no longer that step (the mode cannot leave
                # the stack from inside its own handler, so it stays until a step end, passing everything on)
                self.counting, self.expired = False, True
            packet = func._overloadpacket
            formula = registry.get(packet)
            if formula is None and func is not device_op and self.counting:
                with self:
                    decomposed = func.decompose(*args, **kwargs)
                if decomposed is not NotImplemented:
                    return decomposed
            out = func(*args, **kwargs)  # the workload's own error, if any, reaches it unchanged
            if formula is not None and self.counting:
                try:
                    flops = formula(*args, **kwargs, out_val=out)
                    key = self._kind(args, packet)
                    self.totals[key] = self.totals.get(key, 0.0) + float(flops)
                except Exception:
                    self.errors += 1
            return out

        def _kind(self, args: Any, packet: Any) -> tuple[str, str]:
            first = next((a for a in args if isinstance(a, tensor)), None)
            if first is None:
                return "cpu", "other"
            device = first.device.type
            dtype = dtype_names.get(first.dtype, "other")
            if dtype == "fp32" and device == "cuda" and (self.tf32_conv if packet in convolutions
                                                         else self.tf32_matmul):
                dtype = "tf32"
            return device, dtype

    return CountingMode, dispatch


def _op(aten: Any, dotted: str) -> Any:
    name, overload = dotted.split(".")
    return getattr(getattr(aten, name, None), overload, None)
