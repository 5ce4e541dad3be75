"""Workloads whose behaviour is known, for the verdict-against-the-numbers tests (test_verdicts_fit.py): services
that wait downstream, a loop that waits on the network, a loader starved of CPU and one that reads from the disk.
Each calls only what a user would (`outrider.instrument()`, a middleware), and runs for SECONDS of work.

    python tests/diagnosis/behaviours.py wsgi_wait SECONDS PORT_FILE DOWNSTREAM_URL
    python tests/diagnosis/behaviours.py asgi_wait SECONDS PORT_FILE DOWNSTREAM_URL
    python tests/diagnosis/behaviours.py loop_wait SECONDS DOWNSTREAM_URL
    python tests/diagnosis/behaviours.py starved_loader SECONDS
    python tests/diagnosis/behaviours.py disk_loader SECONDS DATA_DIR

The services write the port they listen on to PORT_FILE and serve for SECONDS; the test drives them from its own
process (outside the watched tree: a client's CPU is not the service's) and runs the downstream they call. Nothing
here reads a clock against a threshold: each workload's work is fixed, a neighbour changes how long it takes.
"""

from __future__ import annotations

import mmap
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import outrider


def burn(n: int) -> int:
    """Pure-Python work: what decoding and augmenting a sample costs a DataLoader worker."""
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1_000_003
    return acc


def wsgi_wait(seconds: float, port_file: str, downstream: str) -> None:
    """A threaded WSGI service (the standard library's server, a thread per request) behind Outrider's middleware;
    each request asks a downstream service, which takes 50 ms to answer, and returns its answer."""
    import threading
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIServer, make_server

    from outrider.commands.demo.workload import QuietHandler
    from outrider.hook.wsgi import OutriderWSGIMiddleware

    class Threaded(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        environ["outrider.route"] = "/lookup"
        with urllib.request.urlopen(f"{downstream}?ms=50", timeout=30) as r:
            body = r.read()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [body]

    server = make_server("127.0.0.1", 0, OutriderWSGIMiddleware(app), server_class=Threaded,
                         handler_class=QuietHandler)
    Path(port_file).write_text(str(server.server_port))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(seconds)
    server.shutdown()


def asgi_wait(seconds: float, port_file: str, downstream: str) -> None:
    """A FastAPI service under uvicorn (one event loop) behind Outrider's ASGI middleware; each request awaits a
    downstream service that takes 200 ms to answer."""
    import asyncio
    import urllib.parse

    import uvicorn
    from fastapi import FastAPI

    from outrider import OutriderMiddleware

    app = FastAPI()
    app.add_middleware(OutriderMiddleware)
    target = urllib.parse.urlsplit(downstream)

    @app.get("/lookup")
    async def lookup() -> dict[str, str]:
        reader, writer = await asyncio.open_connection(target.hostname, target.port)
        writer.write(f"GET {target.path}?ms=200 HTTP/1.0\r\nHost: {target.hostname}\r\n\r\n".encode())
        await writer.drain()
        answer = await reader.read()
        writer.close()
        return {"answer": answer.rsplit(b"\r\n\r\n", 1)[-1].decode()}

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)

    async def main() -> None:
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.05)
        Path(port_file).write_text(str(server.servers[0].sockets[0].getsockname()[1]))
        await asyncio.sleep(seconds)
        server.should_exit = True
        await serving

    asyncio.run(main())


def loop_wait(seconds: float, downstream: str) -> None:
    """A training loop whose every step, after a small model's forward and backward, fetches from a remote service
    (a parameter server, a feature store) that takes 30 ms to answer: the loop waits on the network."""
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        with urllib.request.urlopen(f"{downstream}?ms=30", timeout=30) as r:
            r.read()


def starved_loader(seconds: float) -> None:
    """Four DataLoader workers decoding samples in Python (CPU work, no I/O) for a tiny model: beside CPU hogs on
    a small machine they wait for a CPU far longer than they use one."""
    import torch

    class Decoded(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
        def __len__(self) -> int:
            return 1_000_000

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            burn(20_000)
            return torch.full((32,), float(i % 7)), torch.tensor(i % 4)

    train(torch.utils.data.DataLoader(Decoded(), batch_size=8, num_workers=4), seconds)


BLOCK = 4 << 20  # one read: 4 MiB, aligned for O_DIRECT (large reads: few wake-ups, little CPU per byte)
FILE_BYTES = 256 << 20


def disk_loader(seconds: float, data_dir: str) -> None:
    """Two DataLoader workers reading each sample (8 MiB in two random 4 MiB blocks) from a 256 MiB file on disk,
    bypassing the page cache (O_DIRECT: where the filesystem refuses it, the test does not run this), for a tiny
    model: the loop waits for storage."""
    import torch

    path = Path(data_dir) / "samples.bin"
    with open(path, "wb") as fh:
        chunk = bytes(range(256)) * (BLOCK // 256)
        for _ in range(FILE_BYTES // BLOCK):
            fh.write(chunk)
        fh.flush()
        os.fsync(fh.fileno())

    class OnDisk(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
        def __init__(self) -> None:
            self.fd = -1
            self.buf = mmap.mmap(-1, 1)

        def __len__(self) -> int:
            return 1_000_000

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            if self.fd < 0:  # opened in the worker: the descriptor and the buffer are the worker's own
                self.fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                self.buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
            total = 0
            for j in range(2):
                offset = ((i * 7919 + j * 104729) % (FILE_BYTES // BLOCK)) * BLOCK
                total += os.preadv(self.fd, [self.buf], offset)
            return torch.full((32,), float(total % 7)), torch.tensor(i % 4)

    train(torch.utils.data.DataLoader(OnDisk(), batch_size=8, num_workers=2), seconds)


def train(loader: Any, seconds: float) -> None:
    """A tiny model's steps on what the loader yields, for `seconds`."""
    import torch

    torch.set_num_threads(1)  # a tiny model: its parallel regions would only spin at libgomp's barriers
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end = time.monotonic() + seconds
    for x, y in loader:
        opt.zero_grad()
        out = model(x)
        (out - y.unsqueeze(1).float()).pow(2).mean().backward()
        opt.step()
        if time.monotonic() >= end:
            break


if __name__ == "__main__":
    outrider.instrument()
    what, secs, rest = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    {"wsgi_wait": wsgi_wait, "asgi_wait": asgi_wait, "loop_wait": loop_wait, "starved_loader": starved_loader,
     "disk_loader": disk_loader}[what](secs, *rest)
