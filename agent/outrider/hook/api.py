"""The public hook API (re-exported by `outrider`): instrument(), step timing, data-loader wait, latency, counters.

Before instrument() the step, loop, latency and request functions do nothing; counter(), gauge() and histogram()
call instrument() themselves (a custom series is asked for to be published), so the first of them sets the hook up
as instrument() would. No function raises into user code. With OUTRIDER_DISABLED=1 every call is a no-op. The
hot-path functions touch one or two series and no lock.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from time import perf_counter, time
from typing import Any, Literal, TypeVar, overload

from outrider.hook.series import (
    DURATION_BOUNDS,
    Counter,
    CounterSeries,
    Gauge,
    GaugeSeries,
    Histogram,
    HistogramSeries,
    NoopSeries,
)
from outrider.hook.state import NOOP, BuiltinSeries, DataWaitState, HookState, LoopAccounting, Ring, StepState
from outrider.hook.torch_data import TIMED_MARK, batch_size
from outrider.kernel import procfs

LOG = logging.getLogger("outrider.hook")
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
Kind = TypeVar("Kind", Counter, Gauge, Histogram)


def _active() -> bool:
    return S.hook is not None


def _disabled() -> bool:
    return os.environ.get("OUTRIDER_DISABLED", "").strip().lower() in ("1", "true", "yes", "on")


LOOP_PARTS = ("data_wait", "step", "other", "checkpoint")
S = HookState()  # the module state, one typed part per concern (hook/state.py says who writes which)


def instrument(spool_dir: str | None = None, standalone: bool | None = None) -> bool:
    """Start publishing this process's metrics. Zero-config: reads OUTRIDER_* (spool directory, limits).

    With an agent on the spool (a sidecar, `outrider run`, or one another process of this job started) it only
    publishes; with none, it starts the agent as a separate process (`outrider standalone`), which serves /metrics
    and exits after the last instrumented process. Hooks into PyTorch, now if it is imported, else once it is.
    Idempotent. Returns whether the hook is active."""
    if S.hook is not None:
        return True
    if _disabled():
        return False
    # Another thread waits for the one setting up; the same thread coming back (a signal handler, __del__ or GC
    # callback that calls outrider.counter(...) mid-setup) gets False, as before instrument(), instead of a second
    # hook or a deadlock.
    with _SETTING_UP:
        if _active():  # set up by the thread this one waited for
            return True
        if S.setting_up:
            return False
        S.setting_up = True
        try:
            return _instrument(spool_dir, standalone)
        finally:
            S.setting_up = False


_SETTING_UP = threading.RLock()


def _renew_setting_up() -> None:
    """A child forked while another thread was setting up would find the lock held forever."""
    global _SETTING_UP
    _SETTING_UP = threading.RLock()
    S.setting_up = False


os.register_at_fork(after_in_child=_renew_setting_up)


def _instrument(spool_dir: str | None, standalone: bool | None) -> bool:
    try:
        import dataclasses

        from outrider.hook import settings as hook_settings
        from outrider.hook.runtime import BUILTIN, Hook, register_exit

        config, problems = hook_settings.read()
        for problem in problems:
            LOG.warning("outrider: %s", problem)
        if spool_dir:
            config = dataclasses.replace(config, spool_dir=spool_dir)
        if standalone is not None:
            config = dataclasses.replace(config, standalone=standalone)
        hook = Hook(config)
        handles = {key: hook.series(kind, name, bounds=bounds or DURATION_BOUNDS, builtin=True)
                   for key, (kind, name, bounds) in BUILTIN.items()}
        series = S.series
        series.step, series.data_wait = _of_kind(handles["step"], Histogram), _of_kind(handles["data_wait"], Histogram)
        series.samples, series.tokens = _of_kind(handles["samples"], Counter), _of_kind(handles["tokens"], Counter)
        series.first_step = _of_kind(handles["first_step"], Gauge)
        series.first_step_at = _of_kind(handles["first_step_at"], Gauge)
        series.batch_size = _of_kind(handles["batch_size"], Histogram)
        S.identity.process_start_s = _process_start_time() or time()
        S.hook = hook
        register_exit(lambda: S.hook)
        os.register_at_fork(after_in_child=_after_fork_in_child)
        hook.samplers.append(_drain)
        from outrider.hook.threads import ThreadCpuAccounting

        threads = ThreadCpuAccounting(hook, lambda: S.steps.loop_tid)
        hook.samplers.append(threads.sample)
        from outrider.hook.profiler import LoopProfiler

        profiler = LoopProfiler(hook, lambda: S.steps.loop_tid, config.profile_hz)
        hook.samplers.append(profiler.sample)
        hook.profiler = profiler
        if "torch" in sys.modules:
            _attach_torch()
        else:  # torch imported later: attach once its import has run, on the importing thread
            sys.meta_path.insert(0, _AfterTorchImport())
        hook.start()
        return True
    except Exception as e:
        LOG.warning("outrider: instrument() failed, continuing without the hook: %s", e)
        return False


def _of_kind(s: Counter | Gauge | Histogram | NoopSeries, kind: type[Kind]) -> Kind | NoopSeries:
    """A built-in handle as the kind its BUILTIN entry names: the registry gives that kind or a refused NoopSeries
    (anything else, which it never gives, is taken as refused rather than failing at the first step)."""
    return s if isinstance(s, (kind, NoopSeries)) else NOOP


def _attach_torch() -> None:
    if S.hook is None or S.torch is not None or S.identity.dormant:
        return
    from outrider.hook.torch_integration import attach

    S.torch = attach(S.hook, S, _optimizer_step_hook)


class _AfterTorchImport:
    """A meta path finder, first on sys.meta_path until torch is imported, so that instrument() called before
    `import torch` still hooks into it: it finds torch's spec with the finders behind it and wraps the loader's
    exec_module to attach the integration once torch's `__init__` has run (so every submodule the integration
    patches is loaded, and the user's thread does the patching: nothing races its first optimizer). Answers for
    "torch" only, once; never raises into the import."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    break
            else:
                return None
            loader = spec.loader
            original = getattr(loader, "exec_module", None)
            if original is None:
                return spec

            def exec_module(module: Any) -> None:
                original(module)
                try:
                    _attach_torch()
                except Exception:  # the import itself succeeded: never fail it over the hook
                    LOG.debug("outrider: attaching to torch after its import failed", exc_info=True)

            loader.exec_module = exec_module
            return spec
        except Exception:
            return None  # the import machinery goes on with the other finders


def _after_fork_in_child() -> None:
    if S.torch is not None:  # before anything: a step being counted leaves its dispatch mode in the child
        with contextlib.suppress(Exception):
            S.torch.after_fork_in_child()
    if S.hook is None:
        return
    if S.waits.starting_workers:
        # A DataLoader worker (forked while torch's iterator started its workers): it publishes nothing, so its
        # parent's rank gets no second shard, no first-step-pending and no stall of a process that never steps.
        S.hook.election.after_fork_in_child()
        S.hook = None
        S.identity.dormant = True
        return
    S.steps.after_fork_in_child()  # the parent's steps, waits and intervals are the parent's
    S.waits.after_fork_in_child()
    S.loop.after_fork_in_child()
    S.hook.after_fork_in_child()


def _process_start_time() -> float | None:
    """Wall-clock start of this process (for time to first step), from /proc."""
    try:
        return time() - procfs.age_s("/proc", "self")
    except (OSError, ValueError, IndexError):
        return None


def shutdown() -> None:
    """Final flush (marked closed) now, instead of at interpreter exit."""
    if S.hook is not None:
        S.hook.close()


def flush() -> None:
    """Publish this process's state now (steps, counts, series), without closing: before an exit that skips the
    interpreter's (os._exit), or at a point that must be on record. Never raises."""
    if S.hook is not None:
        try:
            S.hook.flush()
        except Exception:
            S.hook.drop("flush_error")


# --- training steps --------------------------------------------------------------------------------------------

def step_begin() -> None:
    steps = S.steps
    if not steps.explicit:
        _going_explicit()
    steps.begin = perf_counter()


def step_end(samples: int | None = None, tokens: int | None = None, flops: float | None = None) -> None:
    """Marks a step done. Its duration runs from step_begin(), or else from the previous step's end. flops: the
    step's model FLOPs, where the workload knows them (they replace the hook's count: hook/torch_flops.py)."""
    if not S.steps.explicit:
        _going_explicit()
    _step_done(samples, tokens, flops)


def _going_explicit() -> None:
    """The user times steps: framework hooks stop counting them, and the optimizer's hook leaves torch's step (it
    would only return at once). Called on the user's thread, outside any optimizer step, so torch's hook table is
    not being iterated while it changes."""
    S.steps.explicit = True
    if S.torch is not None:
        S.torch.stop_counting()


def _step_done(samples: int | None = None, tokens: int | None = None, flops: float | None = None) -> None:
    """The hot path of a step: the time and the counts into the steps ring (hook/state.py); the publisher does the
    arithmetic. The optimizer hook (_optimizer_step_hook) writes the same in its own frame."""
    end = perf_counter()
    s = S
    if s.hook is None:
        return
    try:
        st = s.steps
        ring = st.ring
        n = ring.n
        j = (n & ring.mask) << 1
        slots = ring.slots
        slots[j] = st.begin
        slots[j + 1] = end
        st.begin = 0.0
        if samples:
            st.sample_sum += samples
            st.samples_given = True
        if tokens:
            st.token_sum += tokens
        if flops:
            st.flop_sum += flops
        ring.n = n + 1
        if not st.loop_tid:
            st.loop_tid = threading.get_native_id()
        if st.want_ops:
            st.want_ops = False
            st.ops = st.ops_reader()  # type: ignore[misc]  # want_ops is only set with a reader
        if st.listeners:
            for listener in st.listeners:
                listener()
    except Exception:
        s.hook.drop("step_error")


def _optimizer_step_hook(state: HookState, first: list[Any], claim: Callable[[Any], bool]) \
        -> Callable[[Any, Any, Any], None]:
    """The optimizer step post hook (hook/torch_integration.py registers it; first[0] is a weak reference to the
    optimizer whose steps count, claim(optimizer) the integration's decision when that is unset or gone): a step
    recorded as _step_done records one, in this one frame, with everything it touches bound as a default argument.
    It runs right after every optimizer step, when the caches hold torch's work: each Python frame or module
    lookup less is measurable there (the steps ring: hook/state.py; benchmarks/step_cpu.py)."""
    steps = state.steps

    def on_optimizer_step(optimizer: Any, args: Any, kwargs: Any, _s: HookState = state, _steps: StepState = steps,
                          _first: list[Any] = first, _claim: Callable[[Any], bool] = claim,
                          _ring: Ring = steps.ring, _slots: list[float] = steps.ring.slots,
                          _mask: int = steps.ring.mask,
                          _listeners: list[Callable[[], None]] = steps.listeners,
                          _clock: Callable[[], float] = perf_counter,
                          _native_id: Callable[[], int] = threading.get_native_id) -> None:
        end = _clock()
        if _steps.explicit or _s.hook is None:
            return
        try:
            ref = _first[0]
            if (ref is None or ref() is not optimizer) and not _claim(optimizer):
                return  # another optimizer (a GAN's second): one step is counted once
            n = _ring.n
            # the end only: the begin stays 0.0 (not timed explicitly: from the previous step's end; a process
            # that times steps explicitly has this hook taken out of torch's step)
            _slots[((n & _mask) << 1) + 1] = end
            _ring.n = n + 1
            if not _steps.loop_tid:
                _steps.loop_tid = _native_id()
            if _steps.want_ops:
                _steps.want_ops = False
                _steps.ops = _steps.ops_reader()  # type: ignore[misc]  # want_ops is only set with a reader
            if _listeners:
                for listener in _listeners:
                    listener()
        except Exception:
            _s.hook.drop("torch_hook_error")

    return on_optimizer_step


def _drain() -> None:
    """Publisher thread: turns the rings' new entries into step durations, counts, data waits, and the loop's
    decomposition (hook/loop.py). Steps are read before waits: every wait of a drained step is then visible."""
    hook, steps, waits, series = S.hook, S.steps, S.waits, S.series
    if hook is None:  # a dormant worker's state, or a state replaced under a running publisher
        return
    done = steps.ring.drained
    start, n = steps.ring.pending()
    loop = S.loop.account
    lost = loop.lost
    wait_ring = waits.ring
    start_w, nw = wait_ring.pending()
    if start_w > wait_ring.drained:
        hook.drop("wait_ring_overflow")
    for b, e in wait_ring.entries(start_w, nw):
        series.data_wait.observe(e - b)
        loop.add_wait(b, e)
    wait_ring.drained = nw  # (a DataLoader alone does not make a training process: batch inference iterates them)
    _drain_intervals(hook, S.loop)
    if loop.lost > lost:  # intervals that waited for a step past MAX_PENDING (a loader iterated outside training)
        hook.drop("loop_backlog", loop.lost - lost)
    if n > done:
        if start > done:
            hook.drop("step_ring_overflow")  # the oldest durations were overwritten; the count stays exact
            loop.restart()
        prev = steps.last_end if start == done else 0.0
        durations: list[float] = []
        parts = [0.0, 0.0, 0.0, 0.0, 0.0]  # data wait, step, other, checkpoint; collective wait
        for marked, end in steps.ring.entries(start, n):
            begin = marked or prev
            if begin:
                durations.append(end - begin)
                series.step.observe(end - begin)
            it = loop.step(marked, end)
            if it is not None:
                parts[0] += it.data_wait
                parts[1] += it.step
                parts[2] += it.other
                parts[3] += it.checkpoint
                parts[4] += it.collective_wait
            prev = end
        if done == 0:
            first_end = time() - (perf_counter() - steps.ring.end_of(start))
            series.first_step.set(first_end - S.identity.process_start_s)
            series.first_step_at.set(first_end)
        hook.progress.record_steps(n - done, prev, durations)
        _drain_flops(hook, steps, n - done)
        steps.last_end = prev
        steps.ring.drained = n
        if any(parts):
            for part, seconds in zip(LOOP_PARTS, parts):
                if seconds or part != "checkpoint":  # the checkpoint part appears with the first checkpoint
                    hook.series("counter", "outrider_train_loop_seconds_total", {"part": part},
                                builtin=True).inc(seconds)
        if parts[4] or S.loop.collectives_seen:
            hook.series("counter", "outrider_train_collective_wait_seconds_total", builtin=True).inc(parts[4])
    _drain_counts(steps, waits, series)
    progress = hook.progress
    if steps.explicit or S.identity.loader_used:
        progress.training_seen = True
    if S.identity.served:
        progress.serving_seen = True


def _drain_counts(steps: StepState, waits: DataWaitState, series: BuiltinSeries) -> None:
    """The running totals' growth since the last flush into the samples and tokens counters."""
    sample_sum, token_sum = steps.sample_sum, steps.token_sum
    if sample_sum != steps.samples_drained:
        series.samples.inc(sample_sum - steps.samples_drained)
        steps.samples_drained = sample_sum
    batched = waits.batch_samples
    if steps.ring.n and not steps.samples_given and batched != waits.batch_drained:
        # steps are completed and none counts its samples: the DataLoaders' batches say how many (once the first
        # step ended, so a first step that counts them itself is never counted twice)
        series.samples.inc(batched - waits.batch_drained)
        waits.batch_drained = batched
    if token_sum != steps.tokens_drained:
        series.tokens.inc(token_sum - steps.tokens_drained)
        steps.tokens_drained = token_sum
    carried = waits.batch_tokens
    if steps.ring.n and not steps.tokens_given and not token_sum and carried != waits.tokens_drained:
        # as the samples: the tokens the batches carried, until the user counts them
        series.tokens.inc(carried - waits.tokens_drained)
        waits.tokens_drained = carried


FLOPS, STEP_FLOPS = "outrider_train_flops_total", "outrider_train_step_flops"
DECLARED = "declared"  # the dtype label of FLOPs the steps declared (no dtype: priced at the device's usual one)


def _drain_flops(hook: Any, steps: StepState, new_steps: int) -> None:
    """The model FLOPs of the steps drained: those the steps declared (step(flops=)), else the last counted step's
    by dtype times the steps (hook/torch_flops.py: one step counted now and then stands for the steps around it)."""
    declared = steps.flop_sum
    if declared != steps.flops_drained:
        grown, steps.flops_drained = declared - steps.flops_drained, declared
        steps.flops_declared = True
        hook.series("counter", FLOPS, {"dtype": DECLARED}, builtin=True).inc(grown)
        if new_steps > 0:
            hook.series("gauge", STEP_FLOPS, {"dtype": DECLARED}, builtin=True).set(grown / new_steps)
        return
    counted = steps.counted_flops
    if counted is None or steps.flops_declared or new_steps <= 0:
        return
    if counted is not steps.flops_published:  # a new count: a dtype it no longer has does no more FLOPs a step
        for dtype in steps.flops_published.keys() - counted.keys():
            hook.series("gauge", STEP_FLOPS, {"dtype": dtype}, builtin=True).set(0.0)
        steps.flops_published = counted
    for dtype, flops in counted.items():
        hook.series("counter", FLOPS, {"dtype": dtype}, builtin=True).inc(flops * new_steps)
        hook.series("gauge", STEP_FLOPS, {"dtype": dtype}, builtin=True).set(flops)


def _drain_intervals(hook: Any, intervals: LoopAccounting) -> None:
    """Collectives finished since the last flush (their time by operation) and checkpoints, into the loop's
    accounting."""
    loop, queue = intervals.account, intervals.collectives
    if queue:
        intervals.collectives_seen = True
        totals: dict[str, float] = {}
        while queue:
            try:
                begin, end, op, blocking = queue.popleft()
            except IndexError:
                break
            totals[op] = totals.get(op, 0.0) + (end - begin)
            loop.add_collective(begin, end, blocking)
        for op, seconds in totals.items():
            hook.series("counter", "outrider_train_collective_seconds_total", {"op": op}, builtin=True).inc(seconds)
    while intervals.checkpoints:
        try:
            loop.add_checkpoint(*intervals.checkpoints.popleft())
        except IndexError:
            break


class step:
    """Times one training step: `with outrider.step(samples=len(batch)): ...`. A step that raises is not counted.
    flops: the step's model FLOPs, where the workload knows them (6 x parameters x tokens, say); they replace the
    hook's own count of a sampled step (hook/torch_flops.py) for the model FLOPs utilisation."""

    __slots__ = ("flops", "samples", "tokens")

    def __init__(self, samples: int | None = None, tokens: int | None = None, flops: float | None = None) -> None:
        self.samples = samples
        self.tokens = tokens
        self.flops = flops

    def __enter__(self) -> step:
        steps = S.steps
        if not steps.explicit:
            _going_explicit()
        steps.begin = perf_counter()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            _step_done(self.samples, self.tokens, self.flops)
        else:
            S.steps.begin = 0.0


class dataloader:
    """Wraps an iterable of batches and measures how long each `next()` waits: the data-loader wait. With torch
    imported, instrument() already times every DataLoader; wrapping one then adds nothing and counts nothing twice.
    """

    def __init__(self, iterable: Iterable[T]) -> None:
        self._iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        it = iter(self._iterable)
        S.identity.loader_used = True
        if getattr(getattr(type(it), "__next__", None), TIMED_MARK, False):
            yield from it  # a DataLoader iterator the torch integration already times: never count a wait twice
            return
        waits = S.waits
        ring, slots, mask = waits.ring, waits.ring.slots, waits.ring.mask
        while True:
            t0 = perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            n = ring.n
            j = (n & mask) << 1
            slots[j] = t0
            slots[j + 1] = perf_counter()
            ring.n = n + 1
            waits.batch_samples += batch_size(batch)
            yield batch

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:  # loader.dataset, loader.sampler.set_epoch(...) keep working
        return getattr(self._iterable, name)


# --- declared phases ---------------------------------------------------------------------------------------------

class phase:
    """A long, expected phase of a training loop: `with outrider.phase("checkpoint"): save(...)`.

    Its time is exported (outrider_train_phase_seconds_total{phase}, outrider_train_phase_active{phase}) and does
    not count as a stall, unless the phase itself stays open longer than phase_timeout_s (1 h by default). Also a
    decorator. Not for the hot path: a phase is opened a few times per epoch, not per step."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name if isinstance(name, str) else str(name)

    def __enter__(self) -> phase:
        hook = S.hook
        if hook is not None:
            try:
                hook.progress.open_phase(self.name)
            except Exception:
                hook.drop("phase_error")
        return self

    def __exit__(self, *exc: object) -> None:
        hook = S.hook
        if hook is not None:
            try:
                hook.progress.close_phase(self.name)
            except Exception:
                hook.drop("phase_error")

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)
        return wrapper  # type: ignore[return-value]


# --- counters ----------------------------------------------------------------------------------------------------

def count_samples(n: int = 1) -> None:
    S.steps.samples_given = True
    S.series.samples.inc(n)


def count_tokens(n: int = 1) -> None:
    S.steps.tokens_given = True
    S.series.tokens.inc(n)


def record_batch_size(n: int) -> None:
    S.series.batch_size.observe(n)


# --- latency -----------------------------------------------------------------------------------------------------

@overload
def _cached(kind: Literal["counter"], name: str, labels: dict[str, str], bounds: tuple[float, ...] = ...,
            builtin: bool = ...) -> CounterSeries: ...
@overload
def _cached(kind: Literal["gauge"], name: str, labels: dict[str, str], bounds: tuple[float, ...] = ...,
            builtin: bool = ...) -> GaugeSeries: ...
@overload
def _cached(kind: Literal["histogram"], name: str, labels: dict[str, str], bounds: tuple[float, ...] = ...,
            builtin: bool = ...) -> HistogramSeries: ...
def _cached(kind: str, name: str, labels: dict[str, str], bounds: tuple[float, ...] = DURATION_BOUNDS,
            builtin: bool = True) -> CounterSeries | GaugeSeries | HistogramSeries:
    """builtin: one of the hook's own names (record_latency, record_request, ...); the custom-metric functions pass
    False, so a workload cannot publish a name the agent owns (outrider_hook_stalled 0 once hid a real stall). The
    series is typed by its kind (a refused one is a NoopSeries, which has every kind's methods)."""
    key = (kind, name, tuple(labels.items()), builtin)
    hit = S.cached.get(key)
    if hit is None:
        if S.hook is None:
            return NOOP
        hit = S.hook.series(kind, name, labels, bounds=bounds, builtin=builtin)
        if len(S.cached) < 10_000:
            S.cached[key] = hit
    return hit


def record_latency(seconds: float, name: str = "request") -> None:
    """One latency observation into outrider_latency_seconds{name}."""
    _cached("histogram", "outrider_latency_seconds", {"name": name}).observe(seconds)


class latency:
    """A block's duration into outrider_latency_seconds{name}. An exit without its enter records nothing (there
    is no start to measure from), and each enter is recorded at most once."""

    __slots__ = ("_t0", "name")

    def __init__(self, name: str = "request") -> None:
        self.name = name
        self._t0: float | None = None

    def __enter__(self) -> latency:
        self._t0 = perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        t0, self._t0 = self._t0, None
        if t0 is not None:
            record_latency(perf_counter() - t0, self.name)


def timed(name: str | None = None) -> Callable[[F], F]:
    """Decorator: each call's duration goes to outrider_latency_seconds{name} (default: the function's name)."""
    def wrap(fn: F) -> F:
        label = str(name or getattr(fn, "__qualname__", "function"))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                record_latency(perf_counter() - t0, label)
        return wrapper  # type: ignore[return-value]
    return wrap


# http.request.method's known values (OpenTelemetry semantic conventions); any other method is "_OTHER", so the
# label has at most ten values whatever clients send.
HTTP_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})
HTTP_SCHEMES = frozenset({"http", "https"})
MAX_HTTP_KEYS = 4096


def http_method(method: str) -> str:
    return method if method in HTTP_METHODS else "_OTHER"


def http_scheme(scheme: str) -> str:
    return scheme if scheme in HTTP_SCHEMES else ""


def http_status(status: int | str) -> tuple[str, str]:
    """(status code, status class) of a response: a code outside 100-599 is no code (left out) and class "other"."""
    text = str(status).strip()
    if text.isdigit() and 100 <= int(text) <= 599:
        return str(int(text)), f"{int(text) // 100}xx"
    return "", "other"


def _request_series(route: str, status: int | str, method: str, scheme: str) \
        -> tuple[HistogramSeries, CounterSeries]:
    code, status_class = http_status(status)
    labels = {"route": route, "method": http_method(method), "scheme": http_scheme(scheme), "status_code": code,
              "status_class": status_class}
    return (_cached("histogram", "outrider_request_duration_seconds", labels),
            _cached("counter", "outrider_requests_total", labels))


def record_request(seconds: float, route: str = "", status: int | str = 200, method: str = "_OTHER",
                   scheme: str = "") -> None:
    """One finished request: its duration and the request count, by route template, method (GET, POST, ... else
    _OTHER), scheme (http, https), status code and status class."""
    S.identity.served = True
    key = (route, status, method, scheme)
    series = S.http.get(key)
    if series is None:
        series = _request_series(route, status, method, scheme)
        if S.hook is not None and len(S.http) < MAX_HTTP_KEYS:
            S.http[key] = series
    series[0].observe(seconds)
    series[1].inc()


def record_phase(phase: str, seconds: float) -> None:
    """Time a request spent in one phase (queue, compute, ...), as the server reports it."""
    _cached("histogram", "outrider_request_phase_duration_seconds", {"phase": phase}).observe(seconds)


GEN_AI_OPERATION = "chat"  # gen_ai.operation.name: what a streamed completion usually is
GEN_AI_PROVIDER = "self_hosted"  # gen_ai.provider.name: name your server (vllm, tgi, ...) where it matters


def record_time_to_first_token(seconds: float, route: str = "", operation: str = GEN_AI_OPERATION,
                               provider: str = GEN_AI_PROVIDER) -> None:
    labels = {"route": route, "operation": operation, "provider": provider}
    _cached("histogram", "outrider_inference_time_to_first_token_seconds", labels).observe(seconds)


def record_inter_token_latency(seconds: float, route: str = "", operation: str = GEN_AI_OPERATION,
                               provider: str = GEN_AI_PROVIDER) -> None:
    labels = {"route": route, "operation": operation, "provider": provider}
    _cached("histogram", "outrider_inference_inter_token_latency_seconds", labels).observe(seconds)


def in_flight(route: str = "", method: str = "_OTHER", scheme: str = "") -> GaugeSeries:
    """The in-flight gauge of a route: .add(1) when a request starts, .add(-1) when it ends."""
    key = (route, method, scheme)
    gauge = S.http_in_flight.get(key)
    if gauge is None:
        labels = {"route": route, "method": http_method(method), "scheme": http_scheme(scheme)}
        gauge = _cached("gauge", "outrider_requests_in_flight", labels)
        if S.hook is not None and len(S.http_in_flight) < MAX_HTTP_KEYS:
            S.http_in_flight[key] = gauge
    return gauge


# --- custom metrics ----------------------------------------------------------------------------------------------

def histogram(name: str, labels: dict[str, str] | None = None,
              bounds: tuple[float, ...] | None = None) -> HistogramSeries:
    """A custom histogram series (`.observe(v)`); bounds default to durations in seconds."""
    instrument()
    return _cached("histogram", name, dict(labels or {}), tuple(bounds) if bounds else DURATION_BOUNDS,
                   builtin=False)


def counter(name: str, labels: dict[str, str] | None = None) -> CounterSeries:
    """A custom counter series (`.inc(n)`); exported as NAME_total."""
    instrument()
    if isinstance(name, str) and not name.endswith("_total"):
        name += "_total"
    return _cached("counter", name, dict(labels or {}), builtin=False)


def gauge(name: str, labels: dict[str, str] | None = None) -> GaugeSeries:
    """A custom gauge series (`.set(v)`, `.add(d)`)."""
    instrument()
    return _cached("gauge", name, dict(labels or {}), builtin=False)
