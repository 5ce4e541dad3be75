"""Re-entrancy: recording or registering from a signal handler, a __del__, a GC callback, or a thread started by one
of those while the interrupted thread registers, never deadlocks and loses no update (hook/registry.py's try-lock
and parked registrations; hook/series.py's slow path).

Each workload runs in a real process (a deadlock would hang it: the subprocess timeout, generous, catches that) and
counts what it recorded in plain Python integers; the agent's view of its shard must show exactly those counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.ground.config import Config
from outrider.metrics.exposition import render
from tests.helpers import samples, value

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600  # a deadlock is forever; a slow machine is not

COMMON = textwrap.dedent("""
    import dataclasses, gc, json, os, signal, sys, threading
    import outrider
    from outrider.hook import api

    assert outrider.instrument()
    hook = api.S.hook
    ROUNDS, METRICS, PER_METRIC = int(os.environ["ROUNDS"]), int(os.environ["METRICS"]), 90
    MAIN = [0]
    # SIDE[k]: the side path's records into its k-th new series; SIDE[300]: its events. Plain list items, updated
    # with `+=` and no call in between, so a nested handler (or another thread) cannot interleave the update.
    SIDE = [0] * 301

    def side(where):
        # what a handler / finalizer / callback does: a counter it has used before, and a brand-new series
        SIDE[300] += 1
        k = SIDE[300] % 150
        outrider.counter("side_events", {"where": where}).inc()
        outrider.counter(f"side_new_{k // PER_METRIC}", {"k": str(k % PER_METRIC)}).inc()
        SIDE[k] += 1

    main_counter = outrider.counter

    def main_loop():
        for r in range(ROUNDS):
            for i in range(METRICS * PER_METRIC):  # the first round registers them all, the others record
                main_counter(f"main_{i // PER_METRIC}", {"i": str(i % PER_METRIC)}).inc()
                MAIN[0] += 1

    def report():
        outrider.shutdown()  # the final flush
        entries, values, _ = hook.registry.layout()  # what that flush published (no shard size limit in the way)
        totals = {e[0] + "|" + ",".join(e[2].values()): values[e[3]] for e in entries}
        print(json.dumps({"main": MAIN[0], "side": SIDE[300], "side_series": SIDE[:300], "totals": totals,
                          "dropped": hook.drop.counts}))
""")

SIGNALS = COMMON + textwrap.dedent("""
    DEPTH = [0]
    def handler(signum, frame):
        # Handlers nest (a signal arriving inside one runs at its next bytecode); on a slow machine a 0.2 ms storm
        # outruns them and the nesting would only end in RecursionError, the storm's, not the hook's: a few levels
        # deep are enough to prove the hook re-entrant.
        if DEPTH[0] >= 8:
            return
        DEPTH[0] += 1
        try:
            side("signal")
        finally:
            DEPTH[0] -= 1
    signal.signal(signal.SIGUSR1, handler)
    signal.signal(signal.SIGALRM, handler)
    print("ready", flush=True)
    sys.stdin.readline()  # the sender runs
    signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
    main_loop()
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    report()
""")

FINALIZERS = COMMON + textwrap.dedent("""
    class Finalized:
        def __init__(self):
            self.cycle = self  # freed by the collector, which runs in the middle of whatever allocates

        def __del__(self):
            side("del")

    def callback(phase, info):
        if phase != "stop":
            return
        side("gc")
        if SIDE[300] % 50 == 0:  # a thread started (and waited for) by the callback, which registers too
            t = threading.Thread(target=side, args=("thread",))
            t.start()
            t.join()

    gc.callbacks.append(callback)
    gc.set_threshold(5, 1, 1)  # collections all the time: inside registrations, and inside the publisher's flush
    hook.settings = dataclasses.replace(hook.settings, flush_interval_s=0.01)

    def main_counter(*a, **kw):  # the main thread's registrations and records, with some garbage
        Finalized()
        return outrider.counter(*a, **kw)

    main_loop()
    gc.callbacks.remove(callback)
    gc.collect()
    report()
""")


def run(tmp_path: Path, script: str, rounds: int, metrics: int, sender: bool = False) -> dict:  # type: ignore[type-arg]
    path = tmp_path / "workload.py"
    path.write_text(script)
    spool = tmp_path / "spool"
    env = {**os.environ, "OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_STANDALONE": "false", "ROUNDS": str(rounds),
           "METRICS": str(metrics), "PYTHONPATH": os.pathsep.join([str(REPO / "agent"), str(REPO)])}
    proc = subprocess.Popen([sys.executable, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    kill = None
    try:
        if sender:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline().strip() == "ready"
            # another process sends SIGUSR1 as fast as it can while the workload registers and records
            kill = subprocess.Popen([sys.executable, "-c", f"import os, signal\nwhile True: os.kill({proc.pid}, "
                                                           "signal.SIGUSR1)"])
            proc.stdin.write("go\n")
            proc.stdin.flush()
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the workload hung (a deadlock): {err[-3000:]}")
    finally:
        if kill is not None:
            kill.kill()
            kill.wait()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    collector = HookCollector(CollectorContext(Config(spool_dir=str(spool))))
    # the shard is closed: the collector keeps its totals as retired after the first read, and exposes them
    got["parsed"] = samples(render(collector.collect()).decode())
    return got


def check_exact(got: dict, metrics: int, rounds: int, through_agent: bool) -> None:  # type: ignore[type-arg]
    """Every series holds exactly what the workload recorded into it: in the process's final layout, and (where the
    shard's directory holds them all) in the agent's view of the shard."""
    totals = got["totals"]
    views = [lambda name, label, v: totals.get(f"{name}|{v}")]
    if through_agent:
        parsed = got["parsed"]
        views.append(lambda name, label, v: value(parsed, name, rank="", **{label: v}))
    for view in views:
        for m in range(metrics):
            for i in range(90):
                assert view(f"main_{m}_total", "i", str(i)) == rounds, f"main_{m} {i}"
        assert sum(view("side_events_total", "where", w) or 0 for w in ("signal", "del", "gc", "thread")) == \
            got["side"]
        for k, n in enumerate(got["side_series"]):
            assert view(f"side_new_{k // 90}_total", "k", str(k % 90)) == (n or None), k
    refused = {k: v for k, v in got["dropped"].items() if through_agent or k != "shard_full"}
    assert refused == {}, "nothing refused, nothing lost"


def test_signal_storm_while_registering_never_deadlocks_and_counts_exactly(tmp_path: Path) -> None:
    """SIGUSR1 from another process as fast as it can send, and SIGALRM every 0.2 ms, whose handler records and
    registers, while the main thread registers 1,800 new series and records (4 times each). Checked in the
    process's final layout: 2,000 series outgrow today's shard directory, which another issue item grows."""
    metrics, rounds = 20, 4
    got = run(tmp_path, SIGNALS, rounds, metrics, sender=True)
    assert got["side"] > 100, f"the storm hit the workload: {got['side']} signals handled"
    assert got["main"] == metrics * 90 * rounds
    check_exact(got, metrics, rounds, through_agent=False)


def test_finalizers_gc_callbacks_and_their_threads_never_deadlock_and_count_exactly(tmp_path: Path) -> None:
    """__del__ of cyclic garbage and a gc.callbacks callback (some starting and joining a thread) record and
    register while the main thread registers and while the publisher flushes every 10 ms; the collector runs
    every few allocations, so inside both."""
    metrics, rounds = 6, 3
    got = run(tmp_path, FINALIZERS, rounds, metrics)
    assert got["side"] > 100
    check_exact(got, metrics, rounds, through_agent=True)
