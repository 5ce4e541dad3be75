"""The loop profiler's cost (hook/profiler.py) and its agreement with py-spy on the same workload.

1. Cost per sample: the CPU time of one sample as the profiler's thread takes it, but for its sleep: the count of
   its voluntary context switches before and after the sleep (getrusage RUSAGE_THREAD, the GIL signal) and one
   LoopProfiler.tick() (sys._current_frames(), the walk of the loop thread's stack, the classification, the
   table), with the loop thread DEPTH frames deep, running Python (the sampler waits for the GIL: that wait is not
   CPU) and sleeping; as a share of one core at the default rate.
2. Agreement: a workload of tests/diagnosis/zero_config.py runs instrumented (its profiler at the default rate);
   py-spy samples the same process, once with --idle (every sample) and then once with --gil (only samples whose
   thread holds the GIL). py-spy's stacks are classed with the profiler's own file rules; its python share is the
   GIL holders among the stacks whose innermost frame is not torch's. Ours are counted over the same seconds: the
   profiler's counts are read when each py-spy run starts and ends, the places over the --idle run and the python
   share over the --gil run. The shares per class of both, side by side.

    python benchmarks/profiler_overhead.py            # both (py-spy from the dev extra; root, or ptrace allowed)
    python benchmarks/profiler_overhead.py --quick    # a short check that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "agent"))
sys.path.insert(0, str(ROOT))

from outrider.hook.profiler import SPECIAL, WHERE, LoopProfiler, _thread_switches, file_kind  # noqa: E402
from outrider.hook.runtime import Hook  # noqa: E402
from outrider.hook.settings import KEYS, HookSettings  # noqa: E402

DEPTH = 40
WARM_STEPS = 20
WORKLOAD = str(ROOT / "tests" / "diagnosis" / "zero_config.py")


def nested(depth: int, work: Any) -> Any:
    return work() if depth <= 1 else nested(depth - 1, work)


def cost_per_sample(ticks: int, running: bool) -> float:
    """CPU seconds of one tick, the loop thread DEPTH frames deep (running Python, or sleeping)."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            acc = 0
            for i in range(1000):
                acc = (acc * 31 + i) % 1_000_003

    def rest() -> None:
        while not stop.is_set():
            time.sleep(0.01)

    loop = threading.Thread(target=nested, args=(DEPTH, spin if running else rest), daemon=True)
    loop.start()
    time.sleep(0.05)
    with tempfile.TemporaryDirectory() as tmp:
        hook = Hook(HookSettings(spool_dir=tmp, standalone=False))
        p = LoopProfiler(hook, lambda: loop.native_id or 0, 50.0)
        cpu = 0.0
        for _ in range(ticks):
            c0 = time.thread_time()
            s0 = _thread_switches()
            c1 = time.thread_time()
            time.sleep(0.001)  # let the loop thread run (and take the GIL back) between samples
            c2 = time.thread_time()
            s1 = _thread_switches()
            assert s0 is not None and s1 is not None
            p.tick(held=running)
            cpu += (c1 - c0) + time.thread_time() - c2
        stop.set()
        loop.join()
        assert sum(p.counts.values()) == ticks, p.counts
    return cpu / ticks


# --- agreement with py-spy ---------------------------------------------------------------------------------------

def child(workload: str, seconds: float, out: str) -> None:
    """Run a workload instrumented; once it has taken WARM_STEPS steps (imports done: constructing the first
    optimizer imports torch._dynamo, seconds on a busy machine) `out`.ready is written; for each `out`.mark.N that
    appears its profiler's counts so far go to `out`.N; once `out`.stop exists the process exits."""
    import torch  # noqa: F401 - the hook attaches to the torch the workload imports
    from tests.diagnosis import zero_config

    import outrider
    from outrider.hook import api

    outrider.instrument()
    prof: list[LoopProfiler] = []

    def reset() -> None:
        while api.S.steps.ring.n < WARM_STEPS:
            time.sleep(0.05)
        time.sleep(1.5)  # the publisher starts the profiler at its next flush
        for s in api.S.hook.samplers:
            owner = getattr(s, "__self__", None)
            if isinstance(owner, LoopProfiler):
                owner.counts = dict.fromkeys(WHERE, 0)
                prof.append(owner)
        Path(out + ".ready").write_text("")

    def marks() -> None:  # the counts when the parent's py-spy runs start and end; exit once told
        n = 0
        while not os.path.exists(out + ".stop"):
            if os.path.exists(f"{out}.mark.{n}"):
                Path(f"{out}.{n}").write_text(json.dumps(dict(prof[0].counts) if prof else {}))
                n += 1
            time.sleep(0.01)
        os._exit(0)

    threading.Thread(target=reset, daemon=True).start()
    threading.Thread(target=marks, daemon=True).start()
    fn = {"python": zero_config.python_bound, "host": zero_config.host, "input_io": zero_config.input_io,
          "compute": zero_config.compute}[workload]
    fn(seconds)


def pyspy(pid: int, seconds: float, *flags: str) -> dict[str, int]:
    """py-spy's samples of the process's main thread, classed with the profiler's file rules."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as fh:
        subprocess.run(["py-spy", "record", "--format", "raw", "-r", "50", "-d", str(int(seconds)), "--threads",
                        "--nonblocking", "-o", fh.name, "--pid", str(pid), *flags], capture_output=True, timeout=120,
                       check=True)
        text = Path(fh.name).read_text()
    out = dict.fromkeys((*SPECIAL, "torch", "user"), 0)
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if "MainThread" not in stack.split(";", 1)[0]:
            continue
        # `function (path:line)`, the path relative to its sys.path entry (torch/optim/sgd.py)
        frames = ["/" + f.rsplit("(", 1)[-1].rstrip(")").rsplit(":", 1)[0].lstrip("/") for f in stack.split(";")[1:]]
        kinds = [file_kind(f) for f in frames if f]
        special = next((k for k in kinds if k in SPECIAL), None)
        innermost = kinds[-1] if kinds else "user"
        out[special or ("torch" if innermost == "torch" else "user")] += int(count)
    return out


def agreement(workload: str, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "counts.json")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")},
               "OUTRIDER_SPOOL_DIR": os.path.join(tmp, "spool"), "OUTRIDER_STANDALONE": "false",
               "PYTHONPATH": f"{ROOT / 'agent'}:{ROOT}"}
        proc = subprocess.Popen([sys.executable, __file__, "--child", workload, "600", out], env=env)
        counts: list[dict[str, int]] = []

        def mark() -> None:
            n = len(counts)
            Path(f"{out}.mark.{n}").write_text("")
            deadline = time.monotonic() + 30
            while not os.path.exists(f"{out}.{n}") and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.05)  # written whole
            counts.append(json.loads(Path(f"{out}.{n}").read_text()))

        try:
            deadline = time.monotonic() + 300
            while not os.path.exists(out + ".ready") and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            mark()
            every = pyspy(proc.pid, seconds, "--idle")
            mark()
            holding = pyspy(proc.pid, seconds, "--gil")
            mark()
            Path(out + ".stop").write_text("")
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()

    def between(a: int, b: int) -> dict[str, int]:
        return {k: counts[b].get(k, 0) - counts[a].get(k, 0) for k in WHERE}

    total = sum(every.values()) or 1
    theirs = {k: every[k] / total for k in SPECIAL}
    # stacks outside torch and the special places: the GIL holders are Python, the rest native or waiting
    python = min(holding["user"], every["user"]) / total
    theirs["python"] = python
    theirs["native+waiting"] = (every["torch"] + every["user"]) / total - python
    idle, gil = between(0, 1), between(1, 2)
    n, n_gil = sum(idle.values()) or 1, sum(gil.values()) or 1
    mine = {k: idle[k] / n for k in SPECIAL}
    mine["python"] = gil["python"] / n_gil
    mine["native+waiting"] = (idle["native"] + idle["waiting"] + idle["python"]) / n - mine["python"]
    return {"workload": workload, "ours": mine, "py-spy": theirs, "samples": {"ours": n, "py-spy": total}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", nargs=3)
    ap.add_argument("--no-pyspy", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args.child[0], float(args.child[1]), args.child[2])
        return
    hz = KEYS["profile_hz"]
    ticks = 200 if args.quick else 2000
    for running in (True, False):
        per = cost_per_sample(ticks, running)
        print(f"one sample, loop thread {DEPTH} frames deep, {'running Python' if running else 'sleeping'}: "
              f"{per * 1e6:.1f} us of CPU; at the default {hz:g} Hz {per * hz:.3%} of one core")
    if args.no_pyspy:
        return
    seconds = 2.0 if args.quick else 10.0
    for workload in (("python",) if args.quick else ("python", "host", "input_io", "compute")):
        r = agreement(workload, seconds)
        print(f"\n{workload}: samples ours {r['samples']['ours']}, py-spy {r['samples']['py-spy']}")
        for k in ("python", "native+waiting", *SPECIAL):
            print(f"  {k:15} ours {r['ours'][k]:6.1%}   py-spy {r['py-spy'][k]:6.1%}   "
                  f"difference {abs(r['ours'][k] - r['py-spy'][k]) * 100:4.1f} points")


if __name__ == "__main__":
    main()
