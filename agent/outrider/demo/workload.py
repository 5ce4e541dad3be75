"""The demo's synthetic training job: data-loader worker processes feed batches through a queue to a "training"
loop of pure-Python arithmetic, which writes a checkpoint every few seconds. Stdlib only; no downloads."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import time


def loader(queue: mp.Queue, seed: int, stop: float) -> None:  # type: ignore[type-arg]
    rng = random.Random(seed)
    while time.time() < stop:
        batch = [[rng.random() for _ in range(64)] for _ in range(32)]
        try:
            queue.put(batch, timeout=0.5)
        except Exception:  # queue full: the trainer is the bottleneck
            continue


def train_step(batch: list[list[float]], weights: list[float]) -> float:
    loss = 0.0
    for row in batch:
        pred = sum(w * x for w, x in zip(weights, row))
        err = pred - 1.0
        loss += err * err
        for i, x in enumerate(row):
            weights[i] -= 1e-4 * err * x
    return loss / len(batch)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=12.0)
    ap.add_argument("--checkpoint-dir", default=".")
    args = ap.parse_args()
    stop = time.time() + args.duration
    queue: mp.Queue = mp.Queue(maxsize=16)  # type: ignore[type-arg]
    workers = [mp.Process(target=loader, args=(queue, seed, stop), daemon=True) for seed in range(2)]
    for w in workers:
        w.start()
    weights = [0.0] * 64
    step, last_ckpt, ballast = 0, time.time(), []
    while time.time() < stop:
        try:
            batch = queue.get(timeout=1.0)
        except Exception:
            continue
        train_step(batch, weights)
        step += 1
        if step % 1000 == 0:
            ballast.append(bytearray(2 << 20))  # the job's memory grows, as caches do
        if time.time() - last_ckpt > 3:
            path = os.path.join(args.checkpoint_dir, "checkpoint.bin")
            with open(path, "wb") as fh:
                fh.write(os.urandom(4 << 20))
                fh.flush()
                os.fsync(fh.fileno())
            last_ckpt = time.time()
    for w in workers:
        w.terminate()
        w.join(timeout=2)
    print(f"workload: {step} steps", flush=True)


if __name__ == "__main__":
    main()
