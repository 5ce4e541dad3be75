"""Labelled CPU training scripts for the confusion matrix: each calls only `outrider.instrument()` (no loader
wrapper, no step timing), the way a new user would, and has one known bottleneck.

    python tests/diagnosis/zero_config.py input|input_io|compute|host|python|sleeping|checkpoint|inference SECONDS
    python -m torch.distributed.run --nproc-per-node N tests/diagnosis/zero_config.py comm|straggler|starved SECONDS

(The inference service wraps its WSGI app in the middleware Outrider ships, as any instrumented service does:
requests are what a service has instead of steps.)

The work is fixed per step (never "run for N ms"), so a neighbour on the machine changes how long it takes, not
what it is.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import torch

import outrider

# The ground truth, measured without Outrider (`--truth`, OUTRIDER_DISABLED=1): seconds of each part of the loop,
# timed around it (data: the loader's next(); python: the tokeniser; sleep: the loop's own sleep; checkpoint:
# torch.save; request: a service's model call; the rest is the step), printed as JSON at the end.
TRUTH: dict[str, float] = {}


def run_delay() -> float:
    """Seconds this thread has waited for a CPU (/proc schedstat; 0 where there is none)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class Timed:
    """`with Timed("data"):` adds the block's wall time to TRUTH[part]; the "loop" block also the thread's CPU time
    and run delay (TRUTH["loop_cpu"], TRUTH["loop_delay"])."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.t0 = self.cpu0 = self.delay0 = 0.0

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()
        if self.part == "loop":
            self.cpu0, self.delay0 = time.thread_time(), run_delay()

    def __exit__(self, *exc: object) -> None:
        TRUTH[self.part] = TRUTH.get(self.part, 0.0) + time.perf_counter() - self.t0
        if self.part == "loop":
            TRUTH["loop_cpu"] = time.thread_time() - self.cpu0
            TRUTH["loop_delay"] = run_delay() - self.delay0


def burn(n: int) -> int:
    """Pure-Python work: what decoding and augmenting a sample costs the worker."""
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1_000_003
    return acc


class SlowDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Samples that take CPU (decode) or time (I/O) to produce."""

    def __init__(self, cpu_work: int = 0, io_s: float = 0.0, n: int = 1_000_000) -> None:
        self.cpu_work, self.io_s, self.n = cpu_work, io_s, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cpu_work:
            burn(self.cpu_work)
        if self.io_s:
            time.sleep(self.io_s)
        return torch.full((32,), float(i % 7)), torch.tensor(i % 4)


def running(end: float, distributed: bool) -> bool:
    """Whether to go on; ranks agree (one stopping alone would leave the others in a collective forever)."""
    go = time.monotonic() < end
    if distributed:
        flag = torch.tensor([1.0 if go else 0.0])
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        go = bool(flag.item())
    return go


def train(model: torch.nn.Module, loader: torch.utils.data.DataLoader, seconds: float,  # type: ignore[type-arg]
          extra: int = 0, loss_fn: str = "cross_entropy", distributed: bool = False) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    heavy = torch.randn(384, 384)
    end = time.monotonic() + seconds
    with Timed("loop"):
        while True:
            batches = iter(loader)
            while True:
                with Timed("data"):
                    batch = next(batches, None)
                if batch is None:
                    break
                x, y = batch
                opt.zero_grad()
                out = model(x)
                if loss_fn == "mse":  # no parallel region: a small step stays small on a busy machine
                    loss = (out - y.unsqueeze(1).float()).pow(2).mean()
                else:
                    loss = torch.nn.functional.cross_entropy(out, y)
                for _ in range(extra):  # a rank with more work per step (a slower node, a heavier shard)
                    loss = loss + torch.tanh(heavy @ heavy).mean() * 0.0
                loss.backward()
                opt.step()
                if not running(end, distributed):
                    return


def small() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def input_bound(seconds: float) -> None:
    """One worker decoding samples in Python; the model takes a fraction of that."""
    loader = torch.utils.data.DataLoader(SlowDataset(cpu_work=60_000), batch_size=8, num_workers=1)
    train(small(), loader, seconds, loss_fn="mse")


def input_io(seconds: float) -> None:
    """Two workers waiting 10 ms a sample off CPU (a sleep standing for a remote read: no storage read, so storage
    is not what the verdict names; behaviours.py's disk_loader reads a disk)."""
    loader = torch.utils.data.DataLoader(SlowDataset(io_s=0.01), batch_size=8, num_workers=2)
    train(small(), loader, seconds, loss_fn="mse")


def compute(seconds: float) -> None:
    """Large matrix products on data in memory: torch's intra-op pool does the work."""
    data = torch.utils.data.TensorDataset(torch.randn(4096, 1024), torch.randint(0, 4, (4096,)))
    loader = torch.utils.data.DataLoader(data, batch_size=512, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                                torch.nn.ReLU(), torch.nn.Linear(2048, 4))
    train(model, loader, seconds)


def host(seconds: float) -> None:
    """Hundreds of tiny operations per step: Python and dispatch are the work."""
    data = torch.utils.data.TensorDataset(torch.randn(4096, 32), torch.randint(0, 4, (4096,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    layers: list[torch.nn.Module] = [torch.nn.Linear(32, 8)]
    for _ in range(60):
        layers += [torch.nn.Linear(8, 8), torch.nn.Tanh()]
    train(torch.nn.Sequential(*layers, torch.nn.Linear(8, 4)), loader, seconds)


TEXT = ("the quick brown fox jumps over the lazy dog while a tokeniser written in pure python splits every "
        "sentence into words lowercases them strips punctuation and looks each one up in a vocabulary")
WORDS = TEXT.split(" ")


def tokenize(texts: list[str], vocab: dict[str, int]) -> list[list[int]]:
    """A tokeniser in pure Python, run in the loop: what many NLP scripts do before each step."""
    out = []
    for text in texts:
        ids = []
        for word in text.split():
            w = word.lower().strip(".,;:!?")
            if w not in vocab:
                vocab[w] = len(vocab) % 1000
            ids.append(vocab[w])
        out.append((ids + [0] * 64)[:64])
    return out


def python_bound(seconds: float) -> None:
    """Each step tokenises its batch of texts in Python, then a small model trains on the ids: the Python is the
    work (the intra-op pool idles, the main thread is saturated)."""
    # One intra-op thread, as CPU jobs that run a process per core do. (With two on a crowded 2-core machine, every
    # parallel region of this tiny model waits at libgomp's barrier for a thread that waits for a CPU: measured
    # here, 100 ms a step instead of 2.5 ms, and the job is no longer Python-bound.)
    torch.set_num_threads(1)
    texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(60)) for i in range(64)]
    vocab: dict[str, int] = {}
    model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end = time.monotonic() + seconds
    with Timed("loop"):
        while time.monotonic() < end:
            python_step(texts, vocab, model, opt)


def python_step(texts: list[str], vocab: dict[str, int], model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for _ in range(2):  # two passes over the batch (an augmentation): the Python dominates the step
        with Timed("python"):  # the tokeniser, and building a tensor from its lists (Python objects, one by one)
            tokens = torch.tensor(tokenize(texts, vocab), dtype=torch.float32)
        ids = tokens / 1000.0
    opt.zero_grad()
    loss = model(ids).pow(2).mean()
    loss.backward()
    opt.step()


def at_rest(seconds: float) -> None:
    """A loop that sleeps 0.66 s a step (polling for work, rate-limited): it waits on nothing of its own: waiting."""
    model = small()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
    end = time.monotonic() + seconds
    with Timed("loop"):
        while time.monotonic() < end:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            with Timed("sleep"):
                time.sleep(0.66)


def checkpoint_heavy(seconds: float) -> None:
    """A small model trained on data in memory, saved with torch.save every few steps with a large state beside
    it (an EMA copy and the optimizer's): the saves, not the steps, are most of the loop."""
    import tempfile

    torch.set_num_threads(1)  # as python_bound: a tiny model's parallel regions wait at libgomp's barrier for a CPU

    data = torch.utils.data.TensorDataset(torch.randn(4096, 256), torch.randint(0, 4, (4096,)))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    extra = {"ema": torch.randn(2_000_000), "history": [torch.randn(64, 1024) for _ in range(16)]}
    end = time.monotonic() + seconds
    with tempfile.TemporaryDirectory(prefix="outrider-ckpt-") as where, Timed("loop"):
        step = 0
        while time.monotonic() < end:
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                step += 1
                if step % 4 == 0:
                    with Timed("checkpoint"):
                        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), **extra},
                                   f"{where}/checkpoint.pt")
                if time.monotonic() >= end:
                    break


def inference(seconds: float) -> None:
    """A model service: a WSGI server (the standard library's, one request at a time, on the main thread) with
    Outrider's middleware, answering two client threads that send requests back to back; each request is a batch of
    512 rows through an MLP under no_grad (at 64 rows, HTTP and the clients' Python took a third of the loop on a
    2-core CI machine). The model's math is the work: compute_bound."""
    import threading
    import urllib.request
    from wsgiref.simple_server import make_server

    from outrider.commands.demo.workload import QuietHandler
    from outrider.hook.wsgi import OutriderWSGIMiddleware

    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 4)).eval()

    def app(environ: dict[str, object], start_response: Callable[..., object]) -> list[bytes]:
        environ["outrider.route"] = "/predict"
        size = int(str(environ.get("CONTENT_LENGTH") or 0))
        rows = int(environ["wsgi.input"].read(size) or b"32")  # type: ignore[attr-defined]
        with Timed("request"), torch.no_grad():
            label = int(model(torch.randn(rows, 512)).argmax(dim=1).sum())
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [f"{label}\n".encode()]

    server = make_server("127.0.0.1", 0, OutriderWSGIMiddleware(app), handler_class=QuietHandler)
    url = f"http://127.0.0.1:{server.server_port}/predict"
    end = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < end:
            urllib.request.urlopen(urllib.request.Request(url, data=b"512"), timeout=60).read()

    clients = [threading.Thread(target=client) for _ in range(2)]
    for c in clients:
        c.start()
    with Timed("loop"):
        server.timeout = 0.5
        while any(c.is_alive() for c in clients):  # they stop sending at the end; their last requests answered
            server.handle_request()
    server.server_close()


def starved(seconds: float) -> None:
    """DDP over gloo; rank 1 reads its samples from slow storage (10 ms each, one worker), the others have theirs in
    memory and wait for it in the gradient all_reduce."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    if rank == 1:
        loader = torch.utils.data.DataLoader(SlowDataset(io_s=0.01), batch_size=8, num_workers=1)
    else:
        data = torch.utils.data.TensorDataset(torch.randn(4096, 32), torch.randint(0, 4, (4096,)))
        loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    ddp = torch.nn.parallel.DistributedDataParallel(small())
    train(ddp, loader, seconds, loss_fn="mse", distributed=True)
    dist.barrier()
    dist.destroy_process_group()


def distributed(seconds: float, straggler: bool) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    data = torch.utils.data.TensorDataset(torch.randn(2048, 256), torch.randint(0, 4, (2048,)))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True)
    if straggler:  # DDP, one rank with four times the work per step
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        train(ddp, loader, seconds, extra=6 if rank == 2 else 0, distributed=True)
    else:  # little compute, a large all_reduce every step: the interconnect (here loopback TCP) is the limit
        model = torch.nn.Linear(256, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        buffer = torch.zeros(4_000_000)
        end = time.monotonic() + seconds
        go = True
        while go:
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                dist.all_reduce(buffer)
                opt.step()
                go = running(end, distributed=True)
                if not go:
                    break
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    outrider.instrument()
    what, secs = sys.argv[1], float(sys.argv[2])
    if what in ("comm", "straggler"):
        distributed(secs, what == "straggler")
    elif what == "starved":
        starved(secs)
    else:
        {"input": input_bound, "input_io": input_io, "compute": compute, "host": host, "python": python_bound,
         "sleeping": at_rest, "checkpoint": checkpoint_heavy, "inference": inference}[what](secs)
    if "--truth" in sys.argv:
        print(json.dumps(TRUTH))
