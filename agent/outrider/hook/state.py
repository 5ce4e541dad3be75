"""The hook's module state, one part per concern, each part a small `__slots__` class with one owner.

hook/api.py holds one `HookState` (`api.S`); each part goes to the code that needs it, and only that part:

- `StepState` (`S.steps`): the steps ring and what the step paths keep beside it (the explicit-timing switch, the
  pending begin, the running sample and token totals, the thread that steps, the autograd operation counter, the
  step listeners). Written by the training thread (api.py's step paths, the optimizer hook); drained by the
  publisher thread. The torch integration (hook/torch_integration.py) reads and sets its operation counter and
  listeners; the checkpoint watch (hook/torch_checkpoint.py) reads its thread.
- `DataWaitState` (`S.waits`): the data-wait ring and the DataLoaders' batch sizes. Written by whichever
  iterator's `__next__` runs (hook/torch_data.py, api.dataloader), on the training thread; drained by the
  publisher.
- `LoopAccounting` (`S.loop`): the loop's decomposition (hook/loop.py) and the intervals other threads hand it:
  collectives (hook/torch_distributed.py) and checkpoints (hook/torch_checkpoint.py), in deques whose appends and
  pops are atomic. Only the publisher thread touches the account itself.
- `Identity` (`S.identity`): what this process is: when it started, whether it iterated a data loader (training)
  or served a request (a service), and whether it is a DataLoader worker forked while its parent started them
  (dormant: it measures nothing).
- `HookState.series` (`BuiltinSeries`) and the caches: the built-in series' handles (no-ops until instrument())
  and the label-keyed series caches of api.py's latency, request and custom-metric functions.

`Ring` is the one ring of (begin, end) pairs, for steps and data waits alike: the hot path stores raw numbers and
bumps a count, the publisher drains what is new once a flush. No lock: one thread writes a ring (the training
thread), one reads it (the publisher), and a count that laps the ring loses the oldest durations, never the count.
The hot paths write it inline, with the ring, its slots and its mask bound once as default arguments, because a
method call is one Python frame more right after a torch step, where each is measurable
(benchmarks/step_cpu.py); `put()` is the same write for everything else.

The hot fields of each part are set first in its `__slots__`, so that they share a cache line with the object's
header: right after a torch step, each line the step path touches is a miss.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from outrider.hook.loop import LoopAccount
from outrider.hook.series import CounterSeries, GaugeSeries, HistogramSeries, NoopSeries

if TYPE_CHECKING:  # for the annotations only
    from outrider.hook.runtime import Hook
    from outrider.hook.series import Counter, Gauge, Histogram


class TorchPart(Protocol):
    """What the state asks of the PyTorch integration (hook/torch_integration.TorchIntegration, which imports this
    module: named by what it does, not imported)."""

    def stop_counting(self) -> None: ...
    def detach(self) -> None: ...
    def after_fork_in_child(self) -> None: ...

RING = 4096  # more steps (or batches) than this between two flushes (1 s) lose their durations, never their count
MASK = RING - 1
NOOP = NoopSeries("noop")


class Ring:
    """(begin, end) pairs side by side in one flat list, `slots[2i]` and `slots[2i + 1]` (one cache line for
    both); `n` entries written so far, `drained` of them drained. Sized to a power of two: an entry's place is
    `(n & mask) << 1`."""

    __slots__ = ("drained", "mask", "n", "slots")

    def __init__(self, size: int = RING) -> None:
        if size <= 0 or size & (size - 1):
            raise ValueError(f"a ring's size is a power of two, not {size}")
        self.slots = [0.0] * (2 * size)
        self.n = 0
        self.mask = size - 1
        self.drained = 0

    def put(self, begin: float, end: float) -> None:
        """One entry (what the hot paths write inline)."""
        n = self.n
        j = (n & self.mask) << 1
        self.slots[j] = begin
        self.slots[j + 1] = end
        self.n = n + 1

    def pending(self) -> tuple[int, int]:
        """(first, n): the entries written since the last drain that the ring still holds, range(first, n); first
        is past `drained` when the writer lapped the ring (the older entries were overwritten)."""
        n, first = self.n, self.drained
        if n - first > self.mask + 1:
            first = n - self.mask - 1
        return first, n

    def entries(self, first: int, n: int) -> Iterator[tuple[float, float]]:
        """The (begin, end) of entries first..n-1 (the publisher's drain)."""
        slots, mask = self.slots, self.mask
        for k in range(first, n):
            j = (k & mask) << 1
            yield slots[j], slots[j + 1]

    def end_of(self, k: int) -> float:
        return self.slots[((k & self.mask) << 1) + 1]

    def skip(self) -> None:
        """Everything written so far counts as drained (a forked child: the parent's entries are the parent's)."""
        self.drained = self.n


class StepState:
    """The steps ring and what the step paths keep beside it (the module docstring says who writes what)."""

    __slots__ = (
        "begin",
        "counted_flops",
        "explicit",
        "flop_sum",
        "flops_declared",
        "flops_drained",
        "flops_published",
        "last_end",
        "listeners",
        "loop_tid",
        "ops",
        "ops_reader",
        "ring",
        "sample_sum",
        "samples_drained",
        "samples_given",
        "token_sum",
        "tokens_drained",
        "tokens_given",
        "want_ops",
    )

    def __init__(self) -> None:
        self.explicit = False  # the user times steps: framework hooks stop counting them
        self.ring = Ring()  # a step's begin is 0.0 unless timed explicitly (its duration then runs from the
        # previous step's end)
        self.begin = 0.0
        self.loop_tid = 0  # native id of the thread that completes steps (the training loop's), once one has
        # The training thread's autograd sequence number, read by a C function set by the torch integration at the
        # first step's end after each flush asked for it (want_ops): a C call less on every other step, and called
        # from the step path rather than through a listener, which would be one more Python frame per step
        self.want_ops = False
        self.ops_reader: Callable[[], int] | None = None
        self.ops = 0
        self.sample_sum = 0  # running totals: exact however far the ring laps
        self.token_sum = 0
        self.flop_sum = 0.0  # FLOPs the steps declared (step(flops=), step_end(flops=))
        self.samples_given = False  # the user counts samples (step(samples=), count_samples())
        self.tokens_given = False  # the user counts tokens (step(tokens=), count_tokens())
        self.listeners: list[Callable[[], None]] = []  # called at each step's end (the torch integration's CUDA
        # marker, once CUDA is initialised)
        # the publisher's: what it has published of the totals, and the last drained step's end
        self.samples_drained = 0
        self.tokens_drained = 0
        self.flops_drained = 0.0
        self.flops_declared = False  # a step declared its FLOPs: they replace the count (hook/torch_flops.py)
        # FLOPs of one step by dtype (fp32, bf16, ...), as the last counted step had them (hook/torch_flops.py): a
        # whole dict replaced by the training thread, read by the publisher; None until a step was counted
        self.counted_flops: dict[str, float] | None = None
        self.flops_published: dict[str, float] = {}  # the count the publisher published last
        self.last_end = 0.0

    def after_fork_in_child(self) -> None:
        """The parent's steps are the parent's."""
        self.ring.skip()
        self.samples_drained, self.tokens_drained = self.sample_sum, self.token_sum
        self.flops_drained = self.flop_sum
        self.loop_tid = 0
        self.begin = self.last_end = 0.0


class DataWaitState:
    """When each data wait began and ended (a DataLoader iterator's `__next__` or api.dataloader's), and the samples
    the DataLoaders yielded (hook/torch_data.batch_size), published as the samples counted until the user counts
    them: samples/s with zero configuration."""

    __slots__ = ("batch_drained", "batch_samples", "batch_tokens", "ring", "starting_workers", "tokens_drained")

    def __init__(self) -> None:
        self.ring = Ring()
        self.batch_samples = 0
        self.batch_drained = 0
        self.batch_tokens = 0  # tokens the batches carried (hook/torch_data.batch_tokens: a tokenizer's input_ids)
        self.tokens_drained = 0
        # a multi-worker DataLoader iterator is starting its workers (hook/torch_data.py): a process forked now is
        # a DataLoader worker, which goes dormant (hook/api.py)
        self.starting_workers = False

    def after_fork_in_child(self) -> None:
        self.ring.skip()
        self.batch_drained = self.batch_samples
        self.tokens_drained = self.batch_tokens


class LoopAccounting:
    """The loop's decomposition (hook/loop.py) and the intervals other threads hand it."""

    __slots__ = ("account", "checkpoints", "collectives", "collectives_seen")

    def __init__(self) -> None:
        self.account = LoopAccount()
        # (begin, end, op, blocking), appended by whichever thread saw a collective finish
        # (hook/torch_distributed.py); the publisher pops
        self.collectives: collections.deque[tuple[float, float, str, bool]] = collections.deque(maxlen=RING)
        self.collectives_seen = False
        # recognised checkpoints on the loop's thread (hook/torch_checkpoint.py): (begin, end)
        self.checkpoints: collections.deque[tuple[float, float]] = collections.deque(maxlen=RING)

    def after_fork_in_child(self) -> None:
        self.collectives.clear()
        self.checkpoints.clear()
        self.account = LoopAccount()


class Identity:
    """What this process is, as the hook has seen it."""

    __slots__ = ("dormant", "loader_used", "process_start_s", "served")

    def __init__(self) -> None:
        self.process_start_s = 0.0  # wall-clock start (for time to first step)
        self.loader_used = False  # a data-loader wrapper was iterated: a training process
        self.served = False  # a request was recorded: a service
        # a DataLoader worker forked from an instrumented process (DataWaitState.starting_workers): it measures
        # nothing, and attaches to no torch should instrument() run in it again
        self.dormant = False


class BuiltinSeries:
    """The handles of the hook's built-in series (hook/runtime.BUILTIN): no-ops until instrument()."""

    __slots__ = ("batch_size", "data_wait", "first_step", "first_step_at", "samples", "step", "tokens")

    def __init__(self) -> None:
        self.step: Histogram | NoopSeries = NOOP
        self.samples: Counter | NoopSeries = NOOP
        self.tokens: Counter | NoopSeries = NOOP
        self.data_wait: Histogram | NoopSeries = NOOP
        self.first_step: Gauge | NoopSeries = NOOP
        self.first_step_at: Gauge | NoopSeries = NOOP
        self.batch_size: Histogram | NoopSeries = NOOP


class HookState:
    """hook/api.py's module state: the hook, its torch integration, and the parts."""

    __slots__ = (
        "cached",
        "hook",
        "http",
        "http_in_flight",
        "identity",
        "loop",
        "series",
        "setting_up",
        "steps",
        "torch",
        "waits",
    )

    def __init__(self) -> None:
        self.hook: Hook | None = None  # once instrument() ran; None again in a dormant worker
        self.steps = StepState()
        self.waits = DataWaitState()
        self.loop = LoopAccounting()
        self.identity = Identity()
        self.series = BuiltinSeries()
        self.torch: TorchPart | None = None  # when torch was imported before instrument()
        self.setting_up = False  # instrument() is running (in the thread that holds api._SETTING_UP)
        # api._cached's series by (kind, name, labels, builtin)
        self.cached: dict[tuple[str, str, tuple[tuple[str, str], ...], bool],
                          CounterSeries | GaugeSeries | HistogramSeries] = {}
        # Request series by the caller's raw (route, status, method, scheme): a hit costs one dict lookup; the
        # label normalisation runs once per distinct key (bounded: api.MAX_HTTP_KEYS, then uncached).
        self.http: dict[tuple[str, object, str, str], tuple[HistogramSeries, CounterSeries]] = {}
        self.http_in_flight: dict[tuple[str, str, str], GaugeSeries] = {}
