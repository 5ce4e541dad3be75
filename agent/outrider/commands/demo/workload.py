"""The demo's workload, instrumented with the Outrider hook, on synthetic data (no downloads):

1. training: a small PyTorch MLP (pure Python arithmetic where torch is not installed) fed by a DataLoader with two
   worker processes, writing a checkpoint every few seconds;
2. inference: the trained model behind a small WSGI service (route /predict/{model}), queried by client threads.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import threading
import time
import urllib.request
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import outrider
from outrider.hook.wsgi import OutriderWSGIMiddleware


def slowdown(started: float, seconds: float) -> float:
    """Extra seconds per step while the demo degrades on purpose: from 10% to 75% of the training time, as a
    throttled GPU or a noisy neighbour would; the demo's alert fires during it and resolves after."""
    elapsed = (time.time() - started) / seconds
    return 0.1 if 0.1 <= elapsed < 0.75 else 0.0


def train_torch(seconds: float, checkpoint_dir: str) -> Any:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Synthetic(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 1_000_000

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            g = torch.Generator().manual_seed(i)
            x = torch.randn(128, generator=g)
            return x, (x[:4].sum() > 0).long()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Synthetic(), batch_size=256, num_workers=2)
    started = time.time()
    end, last_ckpt = started + seconds, started
    for x, y in outrider.dataloader(loader):
        with outrider.step(samples=len(x), tokens=len(x) * 128):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            time.sleep(slowdown(started, seconds))
        if time.time() - last_ckpt > 3:
            torch.save(model.state_dict(), os.path.join(checkpoint_dir, "checkpoint.pt"))
            last_ckpt = time.time()
        if time.time() > end:
            break

    def predict(features: list[float]) -> int:
        with torch.no_grad():
            return int(model(torch.tensor([features])).argmax())

    return predict


def train_pure_python(seconds: float, checkpoint_dir: str) -> Any:
    rng = random.Random(0)
    weights = [0.0] * 32

    def batches() -> Any:
        while True:
            time.sleep(0.002)  # a slow loader
            yield [[rng.random() for _ in range(32)] for _ in range(16)]

    started = time.time()
    end, last_ckpt = started + seconds, started
    for batch in outrider.dataloader(batches()):
        with outrider.step(samples=len(batch)):
            for row in batch:
                err = sum(w * v for w, v in zip(weights, row)) - 1.0
                for i, v in enumerate(row):
                    weights[i] -= 1e-3 * err * v
            time.sleep(slowdown(started, seconds))
        if time.time() - last_ckpt > 3:
            with open(os.path.join(checkpoint_dir, "checkpoint.bin"), "wb") as fh:
                fh.write(os.urandom(1 << 20))
            last_ckpt = time.time()
        if time.time() > end:
            break
    return lambda features: int(sum(w * v for w, v in zip(weights, features)) > 0.5)


class QuietHandler(WSGIRequestHandler):
    """wsgiref's request handler without its line per request on stderr."""

    def log_message(self, *args: object) -> None:
        pass


def serve(predict: Any, seconds: float, width: int, clients: int = 4) -> None:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        environ["outrider.route"] = "/predict/{model}"
        size = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(size).decode()
        features = [float(v) for v in body.split(",") if v]
        if len(features) not in (32, 128):
            start_response("400 Bad Request", [("Content-Type", "text/plain")])
            return [b"bad input\n"]
        with outrider.latency("model"):
            label = predict(features)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [f"{label}\n".encode()]

    server = make_server("127.0.0.1", 0, OutriderWSGIMiddleware(app), handler_class=QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/predict/mlp"
    end = time.time() + seconds

    def client(seed: int) -> None:
        rng = random.Random(seed)
        while time.time() < end:
            n = width if rng.random() > 0.02 else 3  # a few malformed requests: 4xx
            data = ",".join(f"{rng.random():.3f}" for _ in range(n)).encode()
            with contextlib.suppress(Exception):
                urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5).read()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-seconds", type=float, default=10.0)
    ap.add_argument("--serve-seconds", type=float, default=5.0)
    ap.add_argument("--checkpoint-dir", default=".")
    args = ap.parse_args()
    outrider.instrument()
    try:
        import torch  # noqa: F401

        predict = train_torch(args.train_seconds, args.checkpoint_dir)
        width = 128
    except ImportError:
        predict = train_pure_python(args.train_seconds, args.checkpoint_dir)
        width = 32
    serve(predict, args.serve_seconds, width)
    outrider.shutdown()


if __name__ == "__main__":
    main()
