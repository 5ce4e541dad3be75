"""The hook's added CPU per training step, as CPU time of the training thread, with and without the hook
interleaved block by block in one process, so that the machine's other jobs move every variant alike.

A real CPU PyTorch loop (a small MLP, a real single-process DataLoader, SGD; torch.set_num_threads(1), so the
training thread does all of the step's work; small, since the noise a shared machine adds grows with the step,
while torch's Python and dispatcher code, what evicts the hook's from the caches, is the same at any size) runs
in blocks of --block steps; the variants take turns, in a rotating order:

- bare: torch untouched (no optimizer post hook, DataLoader's own __next__);
- data: the patched DataLoader __next__ alone (it times the batch's wait);
- zero configuration: what instrument() installs: the patched __next__, and the optimizer step post hook that
  counts the step (reading the autograd operation counter at the first step after each flush asks);
- explicit: the patched __next__, and the step timed with `with outrider.step(samples=...)` (the first explicit
  step takes the optimizer hook out of torch's step).

Each block's CPU time of the training thread (time.thread_time_ns) divided by its steps is one reading. The cost of
a part is the median over rounds of the difference between two variants' blocks of the same round (the DataLoader
timing: data - bare; the optimizer hook: zero configuration - data; outrider.step(): explicit - data; all of zero
configuration: zero configuration - bare), with the interquartile range of those differences as the noise and
the standard error of the median (1.25 x IQR / 1.35 / sqrt(rounds)); and, as a check that holds when neighbours
only ever add time, the difference of the two variants' 10th percentiles. Where the time goes is timed in place as
well: thread CPU time around each instrumentation call in the loop, less an empty pair of clock reads at the same
place (a clock read is a system call: the pair inflates what follows it, so these are for comparing parts).

Not a test: it prints figures (and writes them as JSON with --json).

    python benchmarks/step_cpu.py [--rounds 3000] [--block 10] [--hog] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("OUTRIDER_SPOOL_DIR", tempfile.mkdtemp(prefix="outrider-bench-"))
os.environ.setdefault("OUTRIDER_STANDALONE", "false")

import outrider  # after the spool is chosen

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import beside_hog, save_json, with_hog_and_json

VARIANTS = ("bare", "data", "zero_config", "explicit")
# (name, variant, less variant): what each figure is the difference of
PARTS = (("dataloader_timing", "data", "bare"), ("optimizer_hook", "zero_config", "data"),
         ("explicit_step", "explicit", "data"), ("zero_config_total", "zero_config", "bare"))


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
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.ReLU(),
                                         torch.nn.Linear(2 * width, 10))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        data = torch.utils.data.TensorDataset(torch.randn(batch * 64, width), torch.randint(0, 10, (batch * 64,)))
        self.loader = torch.utils.data.DataLoader(data, batch_size=batch)
        self.it = iter(())

    def set(self, variant: str) -> None:
        counting = variant == "zero_config"
        if counting and self.integ.handle is None:
            self.integ.handle = self.optimizer_module.register_optimizer_step_post_hook(self.integ.on_optimizer_step)
        elif not counting:
            self.integ.stop_counting()
        self.base.__next__ = self.plain_next if variant == "bare" else self.timed_next
        self.api.S.explicit = variant == "explicit"
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
        t = time.thread_time_ns()
        if variant == "explicit":
            for _ in range(steps):
                x, y = batch_()
                with outrider.step(samples=n):
                    train(x, y)
        else:
            for _ in range(steps):
                x, y = batch_()
                train(x, y)
        return (time.thread_time_ns() - t) / steps

    def in_place(self, steps: int) -> dict[str, float]:
        """Thread CPU ns around each instrumentation call where it runs in the loop, less an empty pair there."""
        clock, api, integ = time.thread_time_ns, self.api, self.integ
        self.set("data")  # the optimizer hook is called by hand below, where torch calls it
        parts: dict[str, list[int]] = {"empty_pair": [], "data_next": [], "plain_next": [], "optimizer_hook": [],
                                       "step_enter_exit": []}
        it = iter(self.loader)
        for i in range(steps):
            if i % (len(self.loader) - 1) == 0:
                it = iter(self.loader)
            timed = (i // 3) % 2 == 0  # the batch's __next__, timed or torch's own, after the same train step
            self.base.__next__ = self.timed_next if timed else self.plain_next
            a = clock()
            x, y = next(it)
            b = clock()
            parts["data_next" if timed else "plain_next"].append(b - a)
            mode = i % 3
            if mode == 0:
                api.S.explicit = False
                self.train(x, y)
                h0 = clock()
                integ.on_optimizer_step(self.opt, (), {})
                h1 = clock()
                parts["optimizer_hook"].append(h1 - h0)
            elif mode == 1:
                api.S.explicit = True
                s0 = clock()
                ctx = outrider.step(samples=self.batch)
                ctx.__enter__()
                s1 = clock()
                self.train(x, y)
                s2 = clock()
                ctx.__exit__(None, None, None)
                s3 = clock()
                parts["step_enter_exit"].append((s1 - s0) + (s3 - s2))
            else:
                self.train(x, y)
                e0 = clock()
                e1 = clock()
                parts["empty_pair"].append(e1 - e0)
        api.S.explicit = False
        med = {k: statistics.median(v) for k, v in parts.items()}
        empty = med["empty_pair"]
        return {"empty_pair_ns": empty, "data_next_added_ns": med["data_next"] - med["plain_next"],
                "optimizer_hook_ns": med["optimizer_hook"] - empty,
                "step_enter_exit_ns": med["step_enter_exit"] - 2 * empty}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3000)
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
    place = loop.in_place(max(300, args.block * 3))
    bare = quartiles(per_step["bare"])
    figures: dict[str, Any] = {
        "cpu_hog_beside": bool(args.hog), "rounds": args.rounds, "block_steps": args.block,
        "step_cpu_us_bare": {"q1": bare[0] / 1e3, "median": bare[1] / 1e3, "q3": bare[2] / 1e3},
        "in_place": place, "added_cpu_us": {},
    }
    low = {v: statistics.quantiles(per_step[v], n=10)[0] for v in VARIANTS}  # each variant's 10th percentile
    for name, variant, less in PARTS:
        diffs = [a - b for a, b in zip(per_step[variant], per_step[less], strict=True)]
        q1, med, q3 = quartiles(diffs)
        figures["added_cpu_us"][name] = {"median": med / 1e3, "q1": q1 / 1e3, "q3": q3 / 1e3,
                                         "standard_error": 1.25 * (q3 - q1) / 1.35 / len(diffs) ** 0.5 / 1e3,
                                         "p10_difference": (low[variant] - low[less]) / 1e3}
    save_json(args.json, figures)
    report(figures)
    return 0


def report(figures: dict[str, Any]) -> None:
    bare, place = figures["step_cpu_us_bare"], figures["in_place"]
    if figures["cpu_hog_beside"]:
        print("with another process keeping a core busy beside it")
    print(f"{figures['rounds']} rounds x {figures['block_steps']} steps per variant, interleaved; training thread "
          f"CPU per step, bare: median {bare['median']:.1f} us (IQR {bare['q1']:.1f}-{bare['q3']:.1f})")
    for name, variant, less in PARTS:
        a = figures["added_cpu_us"][name]
        print(f"{name + ' (' + variant + ' - ' + less + ')':44} {a['median']:+6.2f} us per step "
              f"(+-{a['standard_error']:.2f} standard error; IQR {a['q1']:+.1f} to {a['q3']:+.1f}; "
              f"10th percentiles' difference {a['p10_difference']:+.2f})")
    print(f"in place (thread CPU, less an empty pair of {place['empty_pair_ns']:.0f} ns): DataLoader __next__ "
          f"+{place['data_next_added_ns']:.0f} ns, optimizer hook {place['optimizer_hook_ns']:.0f} ns, "
          f"outrider.step() enter+exit {place['step_enter_exit_ns']:.0f} ns")

if __name__ == "__main__":
    raise SystemExit(main())
