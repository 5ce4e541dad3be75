"""A hooked workload for the end-to-end tests: steps, samples, a data-loader, forked children that record too.

    python tests/hook/workload.py --steps 50 --forks 2 --hold FILE
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import outrider


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--forks", type=int, default=0, help="children forked after the steps, each counting 7 samples")
    ap.add_argument("--hold", help="after the work, wait until this file exists")
    ap.add_argument("--step-sleep", type=float, default=0.001)
    ap.add_argument("--hang-after", type=int, default=0, help="stop stepping after this many steps and sleep")
    ap.add_argument("--hang-seconds", type=float, default=3600.0, help="how long the hang lasts")
    ap.add_argument("--torch", action="store_true", help="a real CPU torch training loop counted by the optimizer")
    ap.add_argument("--pause", help="after the steps, wait until this file exists, then grow: --grow more series "
                                    "and as many steps again (the spool may have filled up meanwhile)")
    ap.add_argument("--grow", type=int, default=0)
    ap.add_argument("--grown", help="touched once the growth and its steps are done")
    args = ap.parse_args()
    if args.torch:
        import torch  # before instrument(): the hook attaches to PyTorch only when it is imported
    outrider.instrument()
    if args.torch:
        model = torch.nn.Linear(16, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = [(torch.randn(8, 16), torch.randn(8, 1)) for _ in range(args.steps)]
        for x, y in outrider.dataloader(data):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            outrider.count_samples(len(x))
    else:
        for i, _ in enumerate(outrider.dataloader(range(args.steps))):
            if args.hang_after and i == args.hang_after:
                time.sleep(args.hang_seconds)
            with outrider.step(samples=4, tokens=64):
                time.sleep(args.step_sleep)
    if args.pause:
        while not pathlib.Path(args.pause).exists():
            time.sleep(0.05)
        for i in range(args.grow):  # new pages of the shard's directory and data area
            outrider.histogram("workload_grown_seconds", {"series": str(i)}).observe(0.01)
        for _ in range(args.steps):
            with outrider.step(samples=4, tokens=64):
                time.sleep(args.step_sleep)
        time.sleep(0.5)  # a few flushes onto the (maybe full) spool
        if args.grown:
            pathlib.Path(args.grown).touch()
    outrider.histogram("workload_phase_seconds", {"phase": "main"}).observe(0.5)
    children = []
    for _ in range(args.forks):
        pid = os.fork()
        if pid == 0:
            outrider.count_samples(7)
            if args.hold:
                while not pathlib.Path(args.hold).exists():
                    time.sleep(0.05)
            outrider.shutdown()
            os._exit(0)
        children.append(pid)
    if args.hold:
        while not pathlib.Path(args.hold).exists():
            time.sleep(0.05)
    for pid in children:
        os.waitpid(pid, 0)
    print("done", os.getpid(), file=sys.stderr)


if __name__ == "__main__":
    main()
