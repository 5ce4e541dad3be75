"""A real OOM kill under `outrider run`: the run is put in a memory cgroup of its own with a 1 GiB limit (created and
removed by the test, as a container runtime would for a 1 GiB container), and its command, a training loop under the
hook, leaks memory from its first step at about 6 MiB/s, paced to reach the limit 135 s (2 min 15 s) after it
starts, until the kernel's OOM killer kills it.

Before the kill, the agent's own rules page a real webhook receiver with ContainerMemoryFillingFast, read from the
cgroup's own counters (the working set and the limit), with the shipped rules and defaults: nothing shortened, no
tunable set. The warm-up ends when the loop has stepped for a minute (its steps counter above 0 a minute ago and
since): the rule is pending from then (the store's samples and the memory group's evaluations come every 15 s:
about 75 s in), fires after its 30 s `for` (about 105 s in), some 30 s before the kill. With the warm-up guard of
before (the series 5 minutes old) the page came after the kill, never. ContainerMemoryExhaustionPredicted needs 30
minutes of history and 10 of `for`: too long for a test run; alerts/tests/memory.test.yaml covers it.

After the kill, the run exits 137 and its summary and verdict say OOM-killed, with the counter that says so (the
run's cgroup's) and, where the kernel log is readable, the killed process by name and pid.

Needs root and a memory controller this process may create a child cgroup in (cgroup v1's memory hierarchy under
its own cgroup, or v2's root with memory in cgroup.subtree_control); skipped otherwise, saying which step failed.
Long: about 2 min 30 s.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrider.kernel import cgroupfs
from tests.helpers import outrider_cmd, wait_until
from tests.servers import WebhookReceiver

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LIMIT = 1 << 30
LEAK_S = 135  # from the command's start to the limit: 2 min 15 s, at about 6 MiB/s

LEAK = """
    import os, pathlib, sys, time
    import outrider
    outrider.instrument()
    limit, seconds, usage_file, pid_file = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
    pathlib.Path(pid_file).write_text(str(os.getpid()))
    start, t0 = int(open(usage_file).read()), time.monotonic()
    rate = (limit - start) / seconds  # paced by the clock, whatever the machine's load: the kill comes on time
    held = []
    while True:  # a training loop that leaks from its first step
        with outrider.step(samples=32):
            while len(held) << 20 < rate * (time.monotonic() - t0):
                held.append(b"\\x01" * (1 << 20))  # written, so charged to the cgroup
            time.sleep(0.05)
"""


def _write(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _memory_cgroup(name: str) -> tuple[Path, str, str]:
    """A new memory cgroup with LIMIT and no swap: (its directory, the file of its usage, the file that counts its
    OOM kills). Raises pytest's skip with the step that failed where this machine does not allow it."""
    if os.geteuid() != 0:
        pytest.skip("creating a memory cgroup needs root")
    own = cgroupfs.find_memory_cgroup("/proc", "/sys")
    hierarchy = cgroupfs.memory_hierarchy("/sys")
    if own is None or hierarchy is None:
        pytest.skip("no memory cgroup controller mounted under /sys/fs/cgroup")
    try:
        if own.version == 1:
            path = Path(own.path) / name
            path.mkdir()
            _write(path / "memory.limit_in_bytes", str(LIMIT))
            with contextlib.suppress(OSError):  # no swap accounting on this kernel: no swap to limit
                _write(path / "memory.memsw.limit_in_bytes", str(LIMIT))
            with contextlib.suppress(OSError):
                _write(path / "memory.swappiness", "0")
            return path, "memory.usage_in_bytes", "memory.oom_control"
        # v2: a cgroup with processes cannot delegate controllers, so the test's cgroup goes under the root
        root = Path(hierarchy.path)
        if "memory" not in (root / "cgroup.subtree_control").read_text().split():
            pytest.skip(f"cgroup v2: the memory controller is not enabled in {root}/cgroup.subtree_control")
        path = root / name
        path.mkdir()
        _write(path / "memory.max", str(LIMIT))
        with contextlib.suppress(OSError):
            _write(path / "memory.swap.max", "0")
        return path, "memory.current", "memory.events"
    except OSError as e:
        pytest.skip(f"this machine does not let the test make a memory cgroup with a limit: {e}")


@contextlib.contextmanager
def memory_cgroup(name: str) -> Iterator[tuple[Path, str, str]]:
    path, usage, counter = _memory_cgroup(name)
    procs = "cgroup.procs"
    try:
        probe = subprocess.Popen(["sh", "-c", f"echo $$ > {shlex.quote(str(path / procs))} && exec sleep 60"])
        try:
            joined = wait_until(lambda: f"/{name}" in Path(f"/proc/{probe.pid}/cgroup").read_text(), timeout_s=10,
                                what="a process moved into the test's memory cgroup")
        except AssertionError:
            joined = False
        finally:
            probe.kill()
            probe.wait()
        if not joined:
            pytest.skip(f"a process could not be moved into {path} (cgroup.procs)")
        yield path, usage, counter
    finally:
        _remove(path, procs)


def _remove(path: Path, procs: str) -> None:
    """Kill what is left in the cgroup (by pid) and remove it; rmdir fails with EBUSY while a process is exiting."""
    for _ in range(100):
        with contextlib.suppress(FileNotFoundError):
            for pid in (path / procs).read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
        time.sleep(0.1)
    raise AssertionError(f"could not remove {path}")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_leak_in_a_memory_limited_run_is_paged_before_the_kernel_oom_kills_it(tmp_path: Path) -> None:
    kmsg_readable = os.access("/dev/kmsg", os.R_OK)
    with memory_cgroup(f"outrider-oom-test-{os.getpid()}") as (cgroup, usage, counter), WebhookReceiver() as webhook:
        prog, pid_file, summary = tmp_path / "leak.py", tmp_path / "leak.pid", tmp_path / "summary.json"
        prog.write_text(textwrap.dedent(LEAK))
        receivers = tmp_path / "receivers.yaml"
        receivers.write_text(f"receivers:\n  - name: oncall\n    type: webhook\n    url: {webhook.url}\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "TORCHELASTIC_", "OTEL_"))}
        env.update({"OUTRIDER_RECEIVERS_FILE": str(receivers), "OUTRIDER_ALERT_INSTANCE": "trainer-0",
                    "OUTRIDER_STATE_DIR": str(tmp_path / "state"), "OUTRIDER_RUNS_DIR": str(tmp_path / "runs")})
        run = outrider_cmd("run", "--listen", "127.0.0.1:0", "--interval", "1", "--summary-json", str(summary), "--",
                           sys.executable, str(prog), str(LIMIT), str(LEAK_S), str(cgroup / usage), str(pid_file))
        # `outrider run` joins the cgroup before it starts, as it would start inside a container with that limit
        proc = subprocess.Popen(["sh", "-c", f"echo $$ > {shlex.quote(str(cgroup / 'cgroup.procs'))} && exec "
                                 + shlex.join(run)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            leak_pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), timeout_s=60,
                                      what="the leaking command's start"))

            def paged_while_alive() -> tuple[dict[str, object], bool] | None:
                page = webhook.alert("ContainerMemoryFillingFast", "firing")
                return (page, _alive(leak_pid)) if page else None

            page, alive_at_page = wait_until(paged_while_alive, timeout_s=LEAK_S + 120, interval_s=0.2,
                                             what="the ContainerMemoryFillingFast page at the webhook")
            _, err = proc.communicate(timeout=LEAK_S + 120)
        finally:
            proc.kill()
            proc.wait()
    assert alive_at_page, "the page came before the kernel killed the leak"
    assert page["labels"]["instance"] == "trainer-0" and page["labels"]["severity"] == "critical"  # type: ignore[index]
    assert "within 2 minutes, beyond its memory limit" in page["annotations"]["description"]  # type: ignore[index]
    assert proc.returncode == 137, err[-3000:]
    data = json.loads(summary.read_text())
    assert data["signal"] == "SIGKILL" and data["oom_kills"] >= 1 and data["oom_scope"] == "cgroup", data
    assert data["oom_counter"] == counter
    first = next(line for line in err.splitlines() if line.startswith(f"outrider: {sys.executable} {prog}"))
    assert "ended by signal SIGKILL (exit code 137): OOM-killed (oom_kill +" in first, first
    assert f"in this cgroup's {counter}" in first
    assert "OOM-killed by the kernel" in err.split("verdict:")[1], "the verdict says it too"
    if kmsg_readable:
        assert any(f"(pid {leak_pid})" in v for v in data["oom_victims"]), data["oom_victims"]
        assert f"(pid {leak_pid})" in first
    fired = [a for a in data["alerts"] if a["name"] == "ContainerMemoryFillingFast"]
    assert fired and fired[0]["fired"] - data["started"] < data["wall_s"], data["alerts"]
    pending = fired[0].get("pending") or fired[0]["fired"]
    print(f"pending at {pending - data['started']:.0f} s, paged at {fired[0]['fired'] - data['started']:.0f} s, "
          f"the run OOM-killed and over at {data['wall_s']:.0f} s")
