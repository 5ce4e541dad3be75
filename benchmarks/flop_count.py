"""What counting a step's FLOPs costs (hook/torch_flops.py), and what measuring the CPU's peak costs (ground/peaks.py).

1. A counted step against the steps around it, on CPU torch, for the models the tests know analytically (a stack of
   Linear layers, a small transformer block) and one of many small operations (a deep stack of narrow layers, where
   the Python dispatch handler's cost per operation shows most): the wall time of a step run under the counting mode
   (as the hook runs it: entered at one step's end, left at the next) over the median of uncounted steps around it,
   interleaved, the median of the ratios over rounds. The hook counts one step per `flops_every_s` (600 s): the
   share of the loop's time it costs is (ratio - 1) x step time / 600 s.
2. The CPU peak's measurement in its child process (torch's import, one warm-up and CPU_REPEATS products), as
   `outrider run` pays it once per machine and torch: its wall time and the figure, a few times.

Not a test: it prints figures (and writes them as JSON with --json).

    python benchmarks/flop_count.py [--rounds 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import save_json


def models(torch: Any) -> dict[str, tuple[Any, Any]]:
    from tests.hook.test_flops import Block

    nn = torch.nn
    torch.manual_seed(0)
    return {
        "linear stack (4 x 512, batch 256)": (nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)]),
                                              torch.randn(256, 512)),
        "transformer block (d 256, 8 heads, 4 x 128 tokens)": (Block(256, 8), torch.randn(4, 128, 256)),
        "many small operations (64 x 32 Linear, batch 8)": (nn.Sequential(*[nn.Linear(32, 32) for _ in range(64)]),
                                                            torch.randn(8, 32)),
    }


def counted_step_ratio(torch: Any, model: Any, x: Any, rounds: int, around: int = 5) -> dict[str, float]:
    from outrider.hook.torch_flops import _counting_mode

    mode_class, _ = _counting_mode(torch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        return time.perf_counter() - t0

    for _ in range(3):
        step()
    ratios, plain_s, counted_s = [], [], []
    for _ in range(rounds):
        before = [step() for _ in range(around)]
        mode = mode_class(False, False)
        mode.__enter__()
        try:
            counted = step()
        finally:
            mode.__exit__(None, None, None)
        after = [step() for _ in range(around)]
        usual = statistics.median(before + after)
        ratios.append(counted / usual)
        plain_s.append(usual)
        counted_s.append(counted)
    return {"step_s": statistics.median(plain_s), "counted_step_s": statistics.median(counted_s),
            "ratio": statistics.median(ratios), "flops": sum(mode.totals.values())}


def cpu_peak(times: int) -> list[dict[str, float]]:
    from outrider.ground import peaks

    out = []
    for _ in range(times):
        t0 = time.perf_counter()
        got = peaks.measure_cpu_in_child()
        wall = time.perf_counter() - t0
        if got is not None:
            out.append({"wall_s": wall, "flops": got.flops, "threads": got.threads})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--peaks", type=int, default=3, help="CPU peak measurements in a child process")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    import torch

    results: dict[str, Any] = {"threads": torch.get_num_threads(), "models": {}}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds")
    for name, (model, x) in models(torch).items():
        r = counted_step_ratio(torch, model, x, args.rounds)
        results["models"][name] = r
        share = (r["ratio"] - 1.0) * r["step_s"] / 600.0
        print(f"{name}: step {r['step_s'] * 1e3:.2f} ms, counted {r['counted_step_s'] * 1e3:.2f} ms "
              f"({r['ratio']:.2f}x); {r['flops'] / 1e9:.3f} GFLOP; once per 600 s: {share:.2e} of the loop's time")
    results["cpu_peak"] = cpu_peak(args.peaks)
    for p in results["cpu_peak"]:
        print(f"CPU peak in a child: {p['flops'] / 1e9:.1f} GFLOP/s with {p['threads']:.0f} threads, "
              f"{p['wall_s']:.2f} s")
    if args.json:
        save_json(args.json, results)


if __name__ == "__main__":
    main()
