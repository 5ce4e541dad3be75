"""One simulated GPU node's workload for benchmarks/fleet_sizing.py: training ranks and an inference server, each
a separate process publishing through the hook to the node's spool, until a file appears or SIGTERM arrives.

The launcher (this process, like torchrun) imports the hook but never instruments itself; it forks one process per
rank and one inference server, writes their pids (one `role index pid` line each) to --pids, and waits. The CUDA
allocator and GPU step-time series a real GPU job publishes are published through the hook's series API: they stand
in for CUDA, which this machine lacks.

    python benchmarks/fleet_workload.py --ranks 8 --job JOB --first-rank 0 --world 32 --pids FILE --hold FILE
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import random
import signal
import sys
import time

import outrider

_stop = False
_launcher = os.getpid()
_children: list[tuple[str, int, int]] = []


def _on_term(signum: int, frame: object) -> None:
    """In a child: leave the loop. In the launcher: pass it on to the children (os.wait resumes after a handler)."""
    global _stop
    _stop = True
    if os.getpid() == _launcher:
        for _, _, pid in _children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def _running(hold: pathlib.Path) -> bool:
    return not _stop and not hold.exists()


def train(local_rank: int, step_s: float, hold: pathlib.Path) -> None:
    from outrider.hook import api

    outrider.instrument()
    hook = api.S.hook
    device = {"device": str(local_rank)}
    memory = {kind: hook.series("gauge", "outrider_torch_cuda_memory_bytes", {**device, "kind": kind}, builtin=True)
              for kind in ("allocated", "reserved", "active", "inactive_split")}
    peak = hook.series("gauge", "outrider_torch_cuda_memory_peak_bytes", device, builtin=True)
    retries = hook.series("counter", "outrider_torch_cuda_alloc_retries_total", device, builtin=True)
    ooms = hook.series("counter", "outrider_torch_cuda_ooms_total", device, builtin=True)
    gpu_step = hook.series("histogram", "outrider_train_gpu_step_duration_seconds", builtin=True)
    rng = random.Random(os.getpid())
    retries.inc(0)
    ooms.inc(0)
    for i, _ in enumerate(outrider.dataloader(iter(range(10**12)))):
        if not _running(hold):
            break
        duration = step_s * rng.uniform(0.9, 1.1)
        with outrider.step(samples=32, tokens=32 * 2048):
            time.sleep(duration)
        gpu_step.observe(duration * 0.8)
        if i % 16 == 0:
            allocated = (40 << 30) + rng.randrange(1 << 30)
            for kind, value in (("allocated", allocated), ("reserved", allocated + (2 << 30)),
                                ("active", allocated), ("inactive_split", 64 << 20)):
                memory[kind].set(value)
            peak.set(allocated + (3 << 30))


def serve(request_s: float, hold: pathlib.Path) -> None:
    outrider.instrument()
    rng = random.Random(os.getpid())
    routes = ("/v1/chat/completions", "/v1/embeddings")
    in_flight = {route: outrider.in_flight(route) for route in routes}
    i = 0
    while _running(hold):
        route = routes[i % 2]
        in_flight[route].add(1)
        queue, compute = rng.uniform(0.001, 0.02), rng.uniform(0.02, 0.4)
        time.sleep(request_s)
        outrider.record_phase("queue", queue)
        outrider.record_phase("compute", compute)
        outrider.record_batch_size(rng.randint(1, 32))
        outrider.record_request(queue + compute, route=route, status=500 if i % 50 == 0 else 200)
        if route == routes[0]:
            outrider.record_time_to_first_token(queue + compute / 4, route=route)
            outrider.record_inter_token_latency(rng.uniform(0.01, 0.03), route=route)
        in_flight[route].add(-1)
        i += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8, help="training ranks on this node (one per GPU)")
    ap.add_argument("--job", required=True, help="the training job these ranks belong to (training_job)")
    ap.add_argument("--first-rank", type=int, default=0, help="global rank of this node's local rank 0")
    ap.add_argument("--world", type=int, default=8, help="the job's world size")
    ap.add_argument("--step-s", type=float, default=0.5, help="seconds per training step")
    ap.add_argument("--request-s", type=float, default=0.1, help="seconds between inference requests")
    ap.add_argument("--pids", required=True, help="write `role index pid` lines here once all are started")
    ap.add_argument("--hold", required=True, help="every process stops once this file exists")
    args = ap.parse_args()
    hold = pathlib.Path(args.hold)
    signal.signal(signal.SIGTERM, _on_term)
    for role, index in [("rank", r) for r in range(args.ranks)] + [("inference", 0)]:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                if role == "rank":
                    os.environ.update(RANK=str(args.first_rank + index), LOCAL_RANK=str(index),
                                      WORLD_SIZE=str(args.world), OUTRIDER_TRAINING_JOB=args.job)
                    train(index, args.step_s, hold)
                else:
                    os.environ["OUTRIDER_ROLE"] = "inference"
                    serve(args.request_s, hold)
                outrider.shutdown()
            except BaseException as e:  # a child never returns into the launcher's loop
                print(f"{role} {index}: {e!r}", file=sys.stderr)
                code = 1
            os._exit(code)
        _children.append((role, index, pid))
    tmp = pathlib.Path(args.pids + ".tmp")
    tmp.write_text("".join(f"{role} {index} {pid}\n" for role, index, pid in _children))
    os.replace(tmp, args.pids)
    while True:
        try:
            os.wait()
        except ChildProcessError:  # all of them are gone
            return 0


if __name__ == "__main__":
    raise SystemExit(main())
