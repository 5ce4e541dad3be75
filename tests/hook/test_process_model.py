"""The process model (decision 9): with no agent on the spool the hook starts the agent as a separate process, and
nothing of the agent runs in the workload. Real workloads, real forks, the real agent; the workload's descriptors,
sockets and session are read from /proc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from outrider.hook.election import agent_serving
from tests.helpers import (
    free_port,
    http_get,
    process_gone,
    samples,
    standalone_agent,
    stop_standalone_agent,
    value,
    wait_until,
)

pytestmark = pytest.mark.integration

# A workload: instrument(), one step, then (once the agent it started holds the spool) lower its own descriptor
# limit if asked and fork N workers that each publish 3 steps and wait on a pipe; on `measure` it opens files
# (proving it still can) and reports; on `release` the workers and then it exit.
FANOUT = r"""
import json, os, pathlib, resource, sys, time
import outrider
from outrider.hook import api
from outrider.hook.election import agent_serving

n, nofile, control = int(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])
outrider.instrument()
with outrider.step(samples=1):
    pass
def serving():
    try:
        return agent_serving(api.S.hook.spool_dir)
    except OSError:  # the spool is not made yet
        return False
while not serving():
    time.sleep(0.05)
if nofile:
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
r, w = os.pipe()
for _ in range(n):
    if os.fork() == 0:
        os.close(w)
        for _ in range(3):
            with outrider.step(samples=1):
                pass
        os.read(r, 1)
        outrider.shutdown()
        os._exit(0)
os.close(r)
(control / "forked").touch()
while not (control / "measure").exists():
    time.sleep(0.05)
opened = [open(__file__, "rb") for _ in range(32)]
for fh in opened:
    fh.close()
mods = sorted(m for m in sys.modules if m == "outrider" or m.startswith("outrider."))
(control / "report.json").write_text(json.dumps({"opened": len(opened), "modules": mods}))
while not (control / "release").exists():
    time.sleep(0.05)
os.close(w)
for _ in range(n):
    os.wait()
"""


def _env(spool: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    return {**base, "OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2",
            "OUTRIDER_INTERVAL_S": "0.3", **extra}


def _fds(pid: int) -> list[str]:
    """What each descriptor of a process points at (a descriptor closed while listing is skipped)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def _listening_inodes(pid: int) -> set[str]:
    """Inodes of the TCP sockets in LISTEN state in the process's network namespace."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A":  # TCP_LISTEN
                inodes.add(f[9])
    return inodes


def _listening_sockets_held(pid: int) -> list[str]:
    listening = _listening_inodes(pid)
    return [t for t in _fds(pid) if t.startswith("socket:[") and t[8:-1] in listening]


def _nice(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[16])


def _ppid(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[1])


def _agents_on(spool: Path) -> list[int]:
    """Live `outrider standalone` processes serving this spool."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"standalone" in argv and str(spool).encode() in argv and not process_gone(int(name)):
            found.append(int(name))
    return found


def _terminate(pid: int) -> None:
    if not process_gone(pid) and b"standalone" in Path(f"/proc/{pid}/cmdline").read_bytes():
        os.kill(pid, signal.SIGTERM)
    stop_standalone_agent(pid, timeout_s=30)


def test_the_agent_runs_in_a_session_of_its_own_at_the_lowest_priority_and_ends_after_the_workload(
        tmp_path: Path) -> None:
    spool, control, err = tmp_path / "spool", tmp_path / "control", tmp_path / "stderr"
    control.mkdir()
    script = tmp_path / "fanout.py"
    script.write_text(FANOUT)
    port = free_port()
    with err.open("wb") as stderr:
        p = subprocess.Popen([sys.executable, str(script), "2", "0", str(control)], stderr=stderr,
                             env=_env(spool, OUTRIDER_LISTEN=f"127.0.0.1:{port}"))
    agent = None
    try:
        agent = wait_until(lambda: standalone_agent(err.read_text()), timeout_s=60, what="the agent's start line")
        pid = agent[0]
        assert pid != p.pid and agent[1] == f"http://127.0.0.1:{port}"
        assert os.getsid(pid) != os.getsid(p.pid), "a session of its own: the terminal's Ctrl-C is the workload's"
        assert _ppid(pid) != p.pid, "detached: never a child for the workload to reap"
        assert _nice(pid) == 19
        if hasattr(os, "SCHED_IDLE"):
            assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        wait_until(lambda: (control / "forked").exists(), timeout_s=60, what="the workers forked")

        def publishing() -> bool:
            parsed = samples(http_get(f"{agent[1]}/metrics")[2].decode())
            return (value(parsed, "outrider_hook_processes", state="running") == 3
                    and value(parsed, "outrider_train_steps_total", rank="") == 1 + 2 * 3)
        wait_until(publishing, timeout_s=60, what="the workload and its 2 workers through the agent")
        assert _listening_sockets_held(p.pid) == [], "the workload holds no listening socket"
        assert [t for t in _fds(p.pid) if t.startswith("socket:")] == [], "nor any socket (no HTTP client)"
        for child in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split():
            assert _listening_sockets_held(int(child)) == [], "nor does a forked worker"
        assert _listening_sockets_held(pid), "the agent does"
        (control / "measure").touch()
        modules = _report(control)["modules"]
        assert isinstance(modules, list) and modules
        hook_side = ("outrider.hook", "outrider.shared", "outrider.kernel")
        assert all(m == "outrider" or m.startswith(hook_side) for m in modules), modules
        (control / "release").touch()
        assert p.wait(timeout=60) == 0
        assert stop_standalone_agent(pid, timeout_s=60), "the agent exits by itself after the last publisher"
        assert not agent_serving(str(spool)), "and lets the spool's lock go"
    finally:
        (control / "release").touch()
        p.kill()
        p.wait()
        if agent is not None:
            _terminate(agent[0])


def _report(control: Path) -> dict[str, object]:
    path = control / "report.json"
    return json.loads(wait_until(lambda: path.exists() and path.read_text(), timeout_s=60, what="the report"))


def _descriptors_with_workers(tmp_path: Path, n: int, nofile: int) -> int:
    """The workload's descriptors while its n forked workers publish (all read by the agent it started)."""
    spool, control, err = tmp_path / f"spool-{n}", tmp_path / f"control-{n}", tmp_path / f"stderr-{n}"
    control.mkdir()
    script = tmp_path / "fanout.py"
    script.write_text(FANOUT)
    with err.open("wb") as stderr:
        p = subprocess.Popen([sys.executable, str(script), str(n), str(nofile), str(control)], stderr=stderr,
                             env=_env(spool, OUTRIDER_LISTEN=f"127.0.0.1:{free_port()}"))
    agent = None
    try:
        agent = wait_until(lambda: standalone_agent(err.read_text()), timeout_s=60, what="the agent")
        wait_until(lambda: (control / "forked").exists(), timeout_s=120, what=f"{n} workers forked")
        url = agent[1]

        def all_publishing() -> bool:
            parsed = samples(http_get(f"{url}/metrics")[2].decode())
            return value(parsed, "outrider_hook_processes", state="running") == n + 1
        wait_until(all_publishing, timeout_s=120, what=f"{n} workers read by the agent")
        # Momentary descriptors are left out of the count, one at a time at most: every 5 s the publisher opens
        # the spool's agent.lock for a few microseconds, and every flush the thread sampler (hook/threads.py)
        # reads /proc files one after the other (longer when a loaded machine preempts it there).
        locks = (str(spool / "agent.lock"), str(spool / "spawn.lock"))
        looks = []
        for _ in range(5):
            targets = _fds(p.pid)
            momentary = [t for t in targets if t in locks or t.startswith("/proc/")]
            assert len(momentary) <= 2, momentary
            looks.append(len(targets) - len(momentary))
            time.sleep(0.05)
        assert [t for t in _fds(p.pid) if t.startswith("socket:")] == []
        (control / "measure").touch()
        assert _report(control)["opened"] == 32, "the workload can still open files"
        (control / "release").touch()
        assert p.wait(timeout=120) == 0, err.read_text()[-2000:]
        return min(looks)
    finally:
        (control / "release").touch()
        p.kill()
        p.wait()
        if agent is not None:
            _terminate(agent[0])


def test_the_workloads_descriptors_do_not_grow_with_its_publishing_workers(tmp_path: Path) -> None:
    """The failure this replaces: with the agent inside the workload, 1,100 forked publishers under ulimit -n 1024
    cost the workload one descriptor per shard, and its own next open() failed with EMFILE. Here the workload
    forks 300 publishers under a limit of 64 descriptors and still opens 32 files."""
    counts = {n: _descriptors_with_workers(tmp_path, n, nofile) for n, nofile in ((1, 0), (100, 0), (300, 64))}
    assert counts[100] == counts[1] and counts[300] == counts[1], counts


def test_racing_processes_and_hundreds_of_forked_workers_start_one_agent(tmp_path: Path) -> None:
    """Eight independent processes start together with no agent, and one of them forks workers before its first
    look at the spool: all of them find the spool without an agent, and exactly one agent is started."""
    spool, control = tmp_path / "spool", tmp_path / "control"
    control.mkdir()
    racer = tmp_path / "racer.py"
    racer.write_text(r"""
import os, pathlib, sys, time
import outrider
from outrider.hook import api
forks, control = int(sys.argv[1]), pathlib.Path(sys.argv[2])
outrider.instrument()
r, w = os.pipe()
kids = []
for _ in range(forks):
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        (control / f"started-{os.getpid()}").write_text(str(api.S.hook.election.started))
        os._exit(0)
    kids.append(pid)
os.close(r)
while not (control / "release").exists():
    time.sleep(0.05)
os.close(w)
for pid in kids:
    os.waitpid(pid, 0)
(control / f"started-{os.getpid()}").write_text(str(api.S.hook.election.started))
""")
    env = _env(spool, OUTRIDER_LISTEN=f"127.0.0.1:{free_port()}")
    procs = [subprocess.Popen([sys.executable, str(racer), "200" if i == 0 else "0", str(control)], env=env,
                              stderr=subprocess.DEVNULL) for i in range(8)]
    agents: list[int] = []
    try:
        wait_until(lambda: agent_serving(str(spool)), timeout_s=60, what="an agent on the spool")
        # Every process looks at the spool within one retry period (5 s, spread up to 20% more); children
        # forked before the first look spread theirs over the same period. Wait two periods, then count.
        time.sleep(2 * 6.0)
        agents = _agents_on(spool)
        assert len(agents) == 1, agents
        (control / "release").touch()
        for p in procs:
            assert p.wait(timeout=120) == 0
        started = [int(f.read_text()) for f in control.glob("started-*")]
        assert len(started) == 8 + 200 and sum(started) == 1, sum(started)
    finally:
        (control / "release").touch()
        for p in procs:
            p.kill()
            p.wait()
        for pid in agents or _agents_on(spool):
            _terminate(pid)


def test_scrapes_answer_after_the_parent_exits_while_its_forked_child_publishes_on(tmp_path: Path) -> None:
    """Once a forked child inherited the in-process agent's listening socket: after the parent exited nobody
    accepted on it and scrapes hung. Now the agent outlives the parent while the child publishes."""
    spool, control, err = tmp_path / "spool", tmp_path / "control", tmp_path / "stderr"
    control.mkdir()
    script = tmp_path / "orphan.py"
    script.write_text(r"""
import os, pathlib, sys, time
import outrider
control = pathlib.Path(sys.argv[1])
outrider.instrument()
with outrider.step():
    pass
if os.fork() == 0:
    n = 0
    while not (control / "release").exists():
        with outrider.step():
            time.sleep(0.01)
        n += 1
        if n == 5:
            (control / "child").write_text(str(os.getpid()))
    sys.exit(0)
while not (control / "child").exists():
    time.sleep(0.02)
""")
    port = free_port()
    with err.open("wb") as stderr:
        p = subprocess.Popen([sys.executable, str(script), str(control)], stderr=stderr,
                             env=_env(spool, OUTRIDER_LISTEN=f"127.0.0.1:{port}"))
    agent = None
    child = 0
    try:
        assert p.wait(timeout=60) == 0, "the parent exits, its child steps on"
        child = int((control / "child").read_text())
        agent = wait_until(lambda: standalone_agent(err.read_text()), timeout_s=60, what="the agent")
        assert _listening_sockets_held(child) == []

        def steps() -> float:
            status, _, body = http_get(f"{agent[1]}/metrics", timeout_s=10)
            assert status == 200
            return value(samples(body.decode()), "outrider_train_steps_total", rank="") or 0.0
        first = wait_until(lambda: steps() > 5 and steps(), timeout_s=60, what="the child's steps")
        wait_until(lambda: steps() > first, timeout_s=60, what="more of the child's steps, after the parent left")
        (control / "release").touch()
        assert stop_standalone_agent(agent[0], timeout_s=60), "and the agent ends after the child"
    finally:
        (control / "release").touch()
        p.kill()
        p.wait()
        if child and not process_gone(child):
            os.kill(child, signal.SIGKILL)
        if agent is not None:
            _terminate(agent[0])


def _stat_line(pid: int, state: str, start_ticks: int) -> str:
    """A /proc/PID/stat line: this process's own, with the pid, state and start time replaced."""
    text = Path("/proc/self/stat").read_text()
    rest = text[text.rindex(")") + 2:].split()
    rest[0], rest[19] = state, str(start_ticks)
    return f"{pid} (python3) {' '.join(rest)}\n"


def test_the_agent_outlives_its_starting_process_by_identity_not_by_a_reused_pid(tmp_path: Path) -> None:
    from outrider.commands.standalone import workload_watch
    from outrider.ground.config import Config
    from outrider.metrics.family import Family

    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    stat = proc / "4242" / "stat"
    stat.write_text(_stat_line(4242, "S", 1000))
    clock = [0.0]
    gone: list[bool] = []
    watch = workload_watch(Config(proc_root=str(proc), interval_s=1.0), 4242, clock=lambda: clock[0])
    watch.on_gone = lambda: gone.append(True)
    publishers = [Family("outrider_hook_processes").add(0, "running")]
    watch.on_sweep(publishers)
    clock[0] = 60.0
    watch.on_sweep(publishers)
    assert not gone, "the starting process is alive: the agent stays"
    stat.write_text(_stat_line(4242, "S", 5000))  # it exited and another process got its pid
    watch.on_sweep(publishers)
    clock[0] = 60.0 + watch.grace_s
    watch.on_sweep(publishers)
    assert gone == [True], "a reused pid keeps nothing alive"


def test_an_agent_that_cannot_start_is_said_once_and_the_workload_runs_on(tmp_path: Path) -> None:
    """A setting the agent refuses (the hook ignores agent keys, the agent validates them): the started process
    exits 2 saying why, the hook says once that no agent could start and backs off, the workload finishes."""
    spool = tmp_path / "spool"
    script = tmp_path / "steady.py"
    script.write_text(r"""
import time
import outrider
from outrider.hook import api
outrider.instrument()
for _ in range(40):
    with outrider.step():
        time.sleep(0.1)
print(api.S.hook.election.started)
""")
    r = subprocess.run([sys.executable, str(script)], env=_env(spool, OUTRIDER_NOT_A_KEY="x"), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("unknown key 'not_a_key'") == 1, r.stderr
    assert r.stderr.count("could not start an agent") == 1, r.stderr
    assert r.stdout.strip() == "1", "one start in 4 s: the next waits at least 10 s"
    assert not agent_serving(str(spool)) and _agents_on(spool) == []


def test_no_hook_module_names_an_agent_module_even_as_a_string() -> None:
    """import-linter sees imports, not `importlib.import_module("outrider.commands.standalone")`, which is how the hook
    once reached the agent. No module of the hook side names an agent module at all now; the agent is a command."""
    import re

    import outrider

    root = Path(outrider.__file__).parent
    agent_modules = {"outrider." + ".".join(p.relative_to(root).with_suffix("").parts) for p in root.rglob("*.py")
                     if p.parts[len(root.parts)] not in ("hook", "shared", "__init__.py")}
    agent_modules |= {m.rsplit(".", 1)[0] for m in agent_modules if m.endswith(".__init__")}
    assert "outrider.commands.standalone" in agent_modules and "outrider.wiring.agent" in agent_modules
    hook_side = [root / "__init__.py", *sorted((root / "shared").glob("*.py")),
                 *sorted((root / "hook").glob("*.py"))]
    named = {(p.name, m) for p in hook_side
             for m in re.findall(r"""["'](outrider\.[\w.]+)["']""", p.read_text()) if m in agent_modules}
    assert named == set(), named


def test_a_second_agent_for_a_spool_exits_at_once_and_quietly(tmp_path: Path) -> None:
    from outrider.shared import spool as spool_mod

    sp = tmp_path / "spool"
    spool_mod.prepare_dir(str(sp), private=False)
    held = spool_mod.try_lock(str(sp))  # this test is the agent that serves the spool
    assert held is not None
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
        r = subprocess.run([sys.executable, "-m", "outrider", "standalone", "--spool-dir", str(sp), "--detach",
                            "--listen", f"127.0.0.1:{free_port()}"], env=env, capture_output=True, text=True,
                           timeout=120)
    finally:
        os.close(held)
    assert (r.returncode, r.stdout, r.stderr) == (spool_mod.EXIT_ANOTHER_AGENT, "", "")
