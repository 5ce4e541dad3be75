"""What the workload pays for its monitor as its publishing processes multiply: 1, 100 and 1,100 forked workers.

Not a test: it prints figures. Each round runs a real workload under `ulimit -n 1024` (the soft limit set before
instrument(), as a shell's would be) with no agent on its spool: its hook starts the agent (`outrider standalone`,
a process of its own), then the workload forks N workers that each step every second and publish through the hook.
Once the agent reads all N+1 processes, the workload's own descriptors (/proc/PID/fd), RSS and CPU time over a
window are measured, and the agent's beside them. The workload's figures must not grow with N: before decision 9
the agent ran inside the first instrumented process, kept one descriptor per shard, and with 1,100 workers under
ulimit -n 1024 the workload's own next open() failed with EMFILE.

    python benchmarks/workload_footprint.py              # 1, 100, 1,100 workers, a 5 s window each
    python benchmarks/workload_footprint.py --quick      # 1, 10, 50 workers, 2 s: does it run?
    python benchmarks/workload_footprint.py --workers 1 100 400
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
AGENT_LINE = re.compile(r"started one \(pid (\d+)\) serving (\S+)/metrics")


def workload(n: int, control: Path) -> int:
    """The measured process: ulimit -n 1024, instrument(), then N forked publishing workers until released.
    With FOOTPRINT_NO_THREAD_SAMPLER=1 the hook's thread sampler (hook/threads.py: the CPU of threads and of
    up to 256 descendant processes, read from /proc every flush) is taken out, to attribute the CPU it costs."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    import outrider
    from outrider.hook import api
    from outrider.hook.election import agent_serving

    outrider.instrument()
    if os.environ.get("FOOTPRINT_NO_THREAD_SAMPLER") == "1":
        api.S.hook.samplers[:] = [f for f in api.S.hook.samplers if getattr(f, "__name__", "") != "sample"]
    with outrider.step(samples=1):
        pass
    while True:
        try:
            if agent_serving(api.S.hook.spool_dir):
                break
        except OSError:
            pass  # the spool is not made yet
        time.sleep(0.05)
    r, w = os.pipe()
    for _ in range(n):
        if os.fork() == 0:
            os.close(w)
            while not select.select([r], [], [], 1.0)[0]:  # readable at EOF: the workload released us
                with outrider.step(samples=1):
                    pass
            outrider.shutdown()
            os._exit(0)
    os.close(r)
    (control / "forked").touch()
    while not (control / "measure").exists():
        time.sleep(0.05)
    files = [open(__file__, "rb") for _ in range(32)]  # noqa: SIM115 - the point is holding them
    for fh in files:
        fh.close()
    (control / "opened").write_text(str(len(files)))
    while not (control / "release").exists():
        time.sleep(0.05)
    os.close(w)
    for _ in range(n):
        os.wait()
    return 0


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


def cpu_s(pid: int) -> float:
    f = _stat(pid)
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def workload_fds(pid: int, spool: Path) -> tuple[int, int]:
    """(descriptors, of which looks at the spool's locks): every 5 s the publisher opens agent.lock for a few
    microseconds (longer when a loaded machine preempts it there), the same with 1 worker or 1,100."""
    n = looks = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        n += 1
        looks += target in (str(spool / "agent.lock"), str(spool / "spawn.lock"))
    return n, looks


def wait_for(what: str, fn: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got = fn()
            if got:
                return got
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout_s} s waiting for {what}")


def publishing(url: str) -> int:
    """Processes the agent reads, in any state (on a loaded machine the workload, which stepped once, may be
    judged stalled before its 1,100 workers are all read)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return sum(int(float(v)) for v in re.findall(r'^outrider_hook_processes\{state="\w+"\} (\S+)$', text, re.M))


def gone(pid: int) -> bool:
    try:
        return _stat(pid)[0] in ("Z", "X")
    except OSError:
        return True


def round_(n: int, window_s: float, work: Path, no_thread_sampler: bool = False) -> dict[str, Any]:
    control, sp, err = work / f"control-{n}", work / f"spool-{n}", work / f"stderr-{n}"
    control.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    env.update({"OUTRIDER_SPOOL_DIR": str(sp), "OUTRIDER_INTERVAL_S": "1", "OUTRIDER_LISTEN": "127.0.0.1:0",
                "PYTHONPATH": os.pathsep.join([str(REPO / "agent"), env.get("PYTHONPATH", "")])})
    if no_thread_sampler:
        env["FOOTPRINT_NO_THREAD_SAMPLER"] = "1"
    with err.open("wb") as fh:
        p = subprocess.Popen([sys.executable, __file__, "--role-workload", str(n), str(control)], env=env,
                             stderr=fh)
    agent_pid = 0
    try:
        m = wait_for("the agent's start line", lambda: AGENT_LINE.search(err.read_text()), 60)
        agent_pid, url = int(m.group(1)), m.group(2)
        t0 = time.monotonic()
        wait_for(f"{n} workers forked", lambda: (control / "forked").exists(), 600)
        wait_for(f"the agent reading {n + 1} processes", lambda: publishing(url) == n + 1, 600)
        seen_s = time.monotonic() - t0
        w0, a0 = cpu_s(p.pid), cpu_s(agent_pid)
        time.sleep(window_s)
        w1, a1 = cpu_s(p.pid), cpu_s(agent_pid)
        counted = []
        for _ in range(5):
            counted.append(workload_fds(p.pid, sp))
            time.sleep(0.05)
        out = {"workers": n, "workload_fds": min(c - looks for c, looks in counted),
               "workload_lock_looks": max(looks for _, looks in counted), "workload_rss_mib": rss_mib(p.pid),
               "workload_cpu_pct": 100 * (w1 - w0) / window_s, "workload_threads": int(_stat(p.pid)[17]),
               "agent_fds": fds(agent_pid), "agent_rss_mib": rss_mib(agent_pid),
               "agent_cpu_pct": 100 * (a1 - a0) / window_s, "all_read_after_s": seen_s}
        (control / "measure").touch()
        out["workload_opened_files"] = int(wait_for("the workload's open()", lambda: (control / "opened").exists()
                                                    and (control / "opened").read_text(), 60))
        (control / "release").touch()
        out["workload_exit"] = p.wait(timeout=600)
        return out
    finally:
        (control / "release").touch()
        if p.poll() is None:
            p.kill()
            p.wait()
        if agent_pid and not gone(agent_pid):
            os.kill(agent_pid, signal.SIGTERM)
            wait_for("the agent's exit", lambda: gone(agent_pid), 60)


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--role-workload":
        return workload(int(sys.argv[2]), Path(sys.argv[3]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 100, 1100])
    ap.add_argument("--window", type=float, default=5.0, help="seconds of CPU measured per round")
    ap.add_argument("--quick", action="store_true", help="1, 10 and 50 workers, 2 s windows")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--no-thread-sampler", action="store_true",
                    help="take the hook's thread sampler out of the workload, to attribute its CPU")
    args = ap.parse_args()
    if args.quick:
        args.workers, args.window = [1, 10, 50], 2.0
    work = Path(tempfile.mkdtemp(prefix="outrider-footprint-"))
    try:
        rows = [round_(n, args.window, work, args.no_thread_sampler) for n in args.workers]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = rows[0]
    print("wl fds: the workload's descriptors, less a look at the spool's lock open at that moment\n")
    print(f"{'workers':>8} {'wl fds':>7} {'wl RSS MiB':>11} {'wl CPU %':>9} {'opened':>7} | "
          f"{'agent fds':>9} {'agent RSS MiB':>13} {'agent CPU %':>11} {'read in s':>9}")
    for r in rows:
        print(f"{r['workers']:>8} {r['workload_fds']:>7} {r['workload_rss_mib']:>11.1f} {r['workload_cpu_pct']:>9.1f} "
              f"{r['workload_opened_files']:>7} | {r['agent_fds']:>9} {r['agent_rss_mib']:>13.1f} "
              f"{r['agent_cpu_pct']:>11.1f} {r['all_read_after_s']:>9.1f}")
    last = rows[-1]
    print(f"\nworkload with {last['workers']} workers vs 1: "
          f"descriptors x{last['workload_fds'] / base['workload_fds']:.2f}, "
          f"RSS x{last['workload_rss_mib'] / base['workload_rss_mib']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
