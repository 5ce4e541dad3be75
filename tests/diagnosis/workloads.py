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
    xs = [torch.ones(4) for _ in range(64)]
    end = time.time() + seconds
    while time.time() < end:
        with outrider.step(samples=64):
            acc = torch.zeros(4)
            for x in xs:  # many tiny operations: the Python and dispatch overhead is the work
                acc = acc + x * 0.5
            acc.sum().item()


if __name__ == "__main__":
    outrider.instrument()
    {"starved": starved, "compute": compute, "host": host}[sys.argv[1]](float(sys.argv[2]))
    outrider.shutdown()
