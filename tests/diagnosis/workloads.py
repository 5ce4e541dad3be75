"""CPU workloads with a known bottleneck, instrumented with the hook, for the diagnosis tests.

    python tests/diagnosis/workloads.py starved|compute|host SECONDS
"""

from __future__ import annotations

import sys
import time

import torch

import outrider


def starved(seconds: float) -> None:
    def loader():  # type: ignore[no-untyped-def]
        while True:
            time.sleep(0.03)  # a slow loader: reads and decodes take longer than the step
            yield torch.randn(32, 64)

    model = torch.nn.Linear(64, 64)
    end = time.time() + seconds
    for x in outrider.dataloader(loader()):
        with outrider.step(samples=len(x)):
            model(x).sum().backward()
        if time.time() > end:
            break


def compute(seconds: float) -> None:
    torch.set_num_threads(torch.get_num_threads())
    a = torch.randn(1024, 1024)
    end = time.time() + seconds
    while time.time() < end:
        with outrider.step(samples=1024):
            for _ in range(4):
                a = torch.tanh(a @ a) * 0.5


def host(seconds: float) -> None:
    # Many tiny layers: the per-operation launch and dispatch are the work, not the math and not the user's Python
    # (a Python loop of tiny operations would be as much the interpreter's: python_bound, which the profiler sees)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(60)])
    x = torch.ones(4, 8)
    end = time.time() + seconds
    while time.time() < end:
        with outrider.step(samples=4):
            model(x).sum().item()


if __name__ == "__main__":
    outrider.instrument()
    {"starved": starved, "compute": compute, "host": host}[sys.argv[1]](float(sys.argv[2]))
    outrider.shutdown()
