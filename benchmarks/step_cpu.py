"""The hook's added CPU per training step, as CPU time of the training thread, with and without the hook
interleaved block by block in one process, so that the machine's other jobs move every variant alike.

A real CPU PyTorch loop (a small MLP, a real single-process DataLoader, SGD; torch.set_num_threads(1), so the
training thread does all of the step's work; small, since the noise a shared machine adds grows with the step,
while torch's Python and dispatcher code, what evicts the hook's from the caches, is the same at any size) runs
in blocks of --block steps; the variants take turns, in a rotating order:

- bare: torch untouched (no optimizer post hook, DataLoader's own __next__);
- data: the patched DataLoader __next__ alone (it times the batch's wait);
- data_unsized: the same __next__ with its batch_size() (the count of the batch's samples) swapped for a function
  that returns 0 (every batch then goes through that function: a first batch of 0 samples fixes no size): what
  counting the samples costs;
- zero configuration: what instrument() installs: the patched __next__, and the optimizer step post hook that
  counts the step (reading the autograd operation counter at the first step after each flush asks);
- explicit: the patched __next__, and the step timed with `with outrider.step(samples=...)` (the first explicit
  step takes the optimizer hook out of torch's step);
- and the floors, what the least Python at the same places costs: an empty_next (a __next__ that only calls
  torch's), an empty_hook (an optimizer post hook that returns, beside the patched __next__) and an empty_with
  (`with` over a class whose __enter__ and __exit__ return, beside the patched __next__), and a clock_hook (a post
  hook that reads time.perf_counter() and returns: one clock read right after a step);
- previous_hook: the optimizer hook as it was before the step path was cut (Outrider at 70e45bd: the hook method
  called the step path, a second frame, which read the autograd counter at every step), beside the patched
  __next__, writing rings of its own.

Each block's CPU time of the training thread (time.thread_time_ns) divided by its steps is one reading. The cost of
a part is the median over rounds of the difference between two variants' blocks of the same round (PARTS), with
the interquartile range of those differences as the noise and the standard error of the median (1.25 x IQR / 1.35
/ sqrt(rounds)); and, as a check that holds when neighbours only ever add time, the difference of the two
variants' 10th percentiles.

Not a test: it prints figures (and writes them as JSON with --json).

    python benchmarks/step_cpu.py [--rounds 6000] [--block 10] [--hog] [--json out.json]

About 13 minutes on 2 quiet cores at the default 6,000 rounds (10 variants x 10 steps of about 0.4 ms each); with 9
variants it took 17 minutes on 2 cores whose other jobs took the load average from 4 to 190.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import threading
import time
import types
import weakref
from typing import Any

os.environ.setdefault("OUTRIDER_SPOOL_DIR", tempfile.mkdtemp(prefix="outrider-bench-"))
os.environ.setdefault("OUTRIDER_STANDALONE", "false")

import outrider  # after the spool is chosen

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import beside_hog, save_json, with_hog_and_json

VARIANTS = ("bare", "empty_next", "data", "data_unsized", "empty_hook", "clock_hook", "zero_config", "previous_hook",
            "empty_with", "explicit")
# (name, variant, less variant): what each figure is the difference of
PARTS = (("dataloader_timing", "data", "bare"), ("  of which a wrapper's frame", "empty_next", "bare"),
         ("  of which counting its samples", "data", "data_unsized"),
         ("optimizer_hook", "zero_config", "data"), ("  of which a post hook's call", "empty_hook", "data"),
         ("  a post hook that reads the clock", "clock_hook", "data"),
         ("  the previous optimizer hook", "previous_hook", "data"),
         ("explicit_step", "explicit", "data"), ("  of which a with statement", "empty_with", "data"),
         ("zero_config_total", "zero_config", "bare"))


def _empty_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    pass


def _no_size(batch: Any) -> int:
    return 0


def _unsized(timed_next: Any) -> Any:
    """The patched __next__ itself (its code, bound state and rings), with its batch_size default swapped for
    _no_size."""
    defaults = timed_next.__defaults__
    names = timed_next.__code__.co_varnames[1:1 + len(defaults)]
    swapped = tuple(_no_size if name == "_size" else d for name, d in zip(names, defaults, strict=True))
    assert _no_size in swapped, names
    f = types.FunctionType(timed_next.__code__, timed_next.__globals__, timed_next.__name__, swapped,
                           timed_next.__closure__)
    f.__dict__.update(timed_next.__dict__)
    return f


def _clock_hook(optimizer: Any, args: Any, kwargs: Any, _clock: Any = time.perf_counter) -> None:
    _clock()


class PreviousHook:
    """The optimizer hook and step path as they were at 70e45bd, over rings of their own (the comparison); the
    step state's fields are where hook/state.py keeps them now."""

    def __init__(self, state: Any, mask: int) -> None:
        self.s, self.steps, self.mask = state, state.steps, mask
        self.first: Any = None
        self.ends, self.begins = [0.0] * (mask + 1), [0.0] * (mask + 1)

    def _step_done(self, samples: int | None = None, tokens: int | None = None) -> None:
        if self.s.hook is None:
            return
        s = self.steps
        try:
            i = s.ring.n & self.mask
            self.ends[i] = time.perf_counter()
            if not s.loop_tid:
                s.loop_tid = threading.get_native_id()
            self.begins[i] = s.begin
            if samples:
                s.sample_sum += samples
            if tokens:
                s.token_sum += tokens
            s.begin = 0.0
            s.ring.n += 1
            if s.ops_reader is not None:
                s.ops = s.ops_reader()
            for listener in s.listeners:
                listener()
        except Exception:
            self.s.hook.drop("step_error")

    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if self.steps.explicit:
                return
            first = self.first() if self.first is not None else None
            if first is None:
                self.first = weakref.ref(optimizer)
            elif first is not optimizer:
                return
            self._step_done()
        except Exception:
            self.s.hook.drop("torch_hook_error")


class _Empty:
    """A context manager that does nothing: what `with` alone costs."""

    __slots__ = ("samples",)

    def __init__(self, samples: int | None = None) -> None:
        self.samples = samples

    def __enter__(self) -> _Empty:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        pass


class Loop:
    """The training loop and the switches between the variants (outside the timed blocks)."""

    def __init__(self, torch: Any, batch: int, width: int) -> None:
        from outrider.hook import api
        from outrider.hook.torch_integration import ACTIVE

        self.torch, self.api, self.batch = torch, api, batch
        self.integ = ACTIVE[-1]
        self.optimizer_module = sys.modules["torch.optim.optimizer"]
        base = torch.utils.data.dataloader._BaseDataLoaderIter
        self.base, self.timed_next, self.plain_next = base, base.__dict__["__next__"], self.integ.data.original_next

        @functools.wraps(self.plain_next)
        def empty_next(self: Any, _original: Any = self.plain_next) -> Any:
            return _original(self)

        self.empty_next = empty_next
        self.unsized_next = _unsized(self.timed_next)
        self.previous = PreviousHook(api.S, api.S.steps.ring.mask)
        self.extra: tuple[str, Any] | None = None  # (variant, handle) of a comparison hook registered now
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.ReLU(),
                                         torch.nn.Linear(2 * width, 10))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        data = torch.utils.data.TensorDataset(torch.randn(batch * 64, width), torch.randint(0, 10, (batch * 64,)))
        self.loader = torch.utils.data.DataLoader(data, batch_size=batch)
        self.it = iter(())

    def set(self, variant: str) -> None:
        if variant == "zero_config" and self.integ.handle is None:
            self.integ.handle = self.optimizer_module.register_optimizer_step_post_hook(self.integ.on_optimizer_step)
        elif variant != "zero_config":
            self.integ.stop_counting()
        if self.extra is not None and self.extra[0] != variant:
            self.extra[1].remove()
            self.extra = None
        comparison = {"empty_hook": _empty_hook, "clock_hook": _clock_hook,
                      "previous_hook": self.previous.on_optimizer_step}.get(variant)
        if comparison is not None and self.extra is None:
            self.extra = (variant, self.optimizer_module.register_optimizer_step_post_hook(comparison))
        self.base.__next__ = {"bare": self.plain_next, "empty_next": self.empty_next,
                              "data_unsized": self.unsized_next}.get(variant, self.timed_next)
        self.api.S.steps.explicit = variant == "explicit"
        self.it = iter(self.loader)  # a fresh epoch's iterator under the variant's __next__

    def batch_(self) -> Any:
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            return next(self.it)

    def train(self, x: Any, y: Any) -> None:
        self.opt.zero_grad()
        self.torch.nn.functional.cross_entropy(self.model(x), y).backward()
        self.opt.step()

    def block(self, variant: str, steps: int) -> float:
        """CPU ns of this thread per step over `steps` steps of the variant."""
        self.set(variant)
        batch_, train, n = self.batch_, self.train, self.batch
        context = {"explicit": outrider.step, "empty_with": _Empty}.get(variant)
        t = time.thread_time_ns()
        if context is not None:
            for _ in range(steps):
                x, y = batch_()
                with context(samples=n):
                    train(x, y)
        else:
            for _ in range(steps):
                x, y = batch_()
                train(x, y)
        return (time.thread_time_ns() - t) / steps


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6000)
    ap.add_argument("--block", type=int, default=10, help="steps per timed block (short: the variants take turns "
                    "faster than the machine's load changes)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--width", type=int, default=16, help="the MLP's input width (its hidden layer: twice that); "
                    "small, since the step's own noise grows with its size")
    args = with_hog_and_json(ap).parse_args()
    return beside_hog(args.hog, lambda: run(args))


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    outrider.instrument()
    loop = Loop(torch, args.batch, args.width)
    for variant in VARIANTS:  # warm-up: first calls, allocator, caches
        loop.block(variant, args.block)
    per_step: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        k = r % len(VARIANTS)
        for variant in VARIANTS[k:] + VARIANTS[:k]:
            per_step[variant].append(loop.block(variant, args.block))
    loop.set("zero_config")
    bare = quartiles(per_step["bare"])
    figures: dict[str, Any] = {
        "cpu_hog_beside": bool(args.hog), "rounds": args.rounds, "block_steps": args.block,
        "step_cpu_us_bare": {"q1": bare[0] / 1e3, "median": bare[1] / 1e3, "q3": bare[2] / 1e3},
        "steps_counted": loop.api.S.steps.ring.n, "added_cpu_us": {},
    }
    low = {v: statistics.quantiles(per_step[v], n=10)[0] for v in VARIANTS}  # each variant's 10th percentile
    for name, variant, less in PARTS:
        diffs = [a - b for a, b in zip(per_step[variant], per_step[less], strict=True)]
        q1, med, q3 = quartiles(diffs)
        figures["added_cpu_us"][name.strip()] = {
            "variant": variant, "less": less, "median": med / 1e3, "q1": q1 / 1e3, "q3": q3 / 1e3,
            "standard_error": 1.25 * (q3 - q1) / 1.35 / len(diffs) ** 0.5 / 1e3,
            "p10_difference": (low[variant] - low[less]) / 1e3}
    save_json(args.json, figures)
    report(figures)
    return 0


def report(figures: dict[str, Any]) -> None:
    bare = figures["step_cpu_us_bare"]
    if figures["cpu_hog_beside"]:
        print("with another process keeping a core busy beside it")
    print(f"{figures['rounds']} rounds x {figures['block_steps']} steps per variant, interleaved; training thread "
          f"CPU per step, bare: median {bare['median']:.1f} us (IQR {bare['q1']:.1f}-{bare['q3']:.1f})")
    for name, variant, less in PARTS:
        a = figures["added_cpu_us"][name.strip()]
        print(f"{name + ' (' + variant + ' - ' + less + ')':56} {a['median']:+6.2f} us per step "
              f"(+-{a['standard_error']:.2f}; IQR {a['q1']:+.1f} to {a['q3']:+.1f}; 10th percentiles "
              f"{a['p10_difference']:+.2f})")


if __name__ == "__main__":
    raise SystemExit(main())
