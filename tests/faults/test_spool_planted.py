"""Planted junk in a shared spool, with the real agent under a low descriptor limit and real hooked processes.

Once 1,500 files named like shards, planted by another user in an explicitly shared 1777 spool, took the agent to
its 1,024 descriptors: /metrics unreachable, the HTTP accept loop spinning and logging about 40,000 lines a second.
Now what is not a valid shard is closed (most of it never opened), good shards' descriptors kept are bounded by
the limit, and every refused file is counted once by reason."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from outrider.shared import spool
from tests.helpers import REPO, AgentProcess, after_more, http_get, reap, samples, value, wait_until

pytestmark = pytest.mark.integration
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's files needs root (CI runs as root)")
WORKLOAD = str(REPO / "tests" / "hook" / "workload.py")
STRANGER = 54321
FD_LIMIT = 256
FORKS = 40  # per workload: 2 x (1 + 40) = 82 real shards, more than the reader keeps open under this limit
STEPS = 25


def _shard_bytes(pid: int, start_ns: int, *, steps: float = 1e9) -> tuple[bytes, bytes]:
    """A well-formed shard's header and directory (planted: it claims a stalled rank and huge counts)."""
    directory = json.dumps({"meta": {"rank": "0"}, "series": [
        ["outrider_train_steps_total", "counter", {}, 0, []]]}).encode()
    head = spool.pack_header(flags=spool.FLAG_STALLED, seq=2, pid=pid, stalls=1, start_ns=start_ns,
                             heartbeat_ns=start_ns, last_step_ns=0, steps=int(steps), directory_len=len(directory),
                             value_count=1, stalled_since_ns=start_ns)
    return head, directory


def _plant_shard(path: Path, pid: int, *, size: int = spool.SHARD_BYTES, mode: int = 0o644) -> None:
    """A sparse file laid out like a real shard (no blocks beyond what is written)."""
    head, directory = _shard_bytes(pid, 5)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.pwrite(fd, head, 0)
        os.pwrite(fd, directory, spool.HEADER_BYTES)
        os.pwrite(fd, struct.pack("<d", 1e9), spool.DATA_OFFSET)
        os.ftruncate(fd, size)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def plant(shared: Path, outside: Path) -> dict[str, int]:
    """Thousands of files named like shards, of every kind an agent must refuse; how many of each reason."""
    counts: dict[str, int] = {}
    n = iter(range(10_000_000, 20_000_000))

    def name() -> Path:
        i = next(n)
        return shared / f"outrider-{i}-{i}.shard"

    def planted(reason: str, k: int) -> range:
        counts[reason] = counts.get(reason, 0) + k
        return range(k)

    target = outside / "outrider-1-1.shard"
    _plant_shard(target, 1)
    for _ in planted("corrupt", 1000):  # garbage of a trusted owner: opened once, refused, closed
        name().write_bytes(os.urandom(8192))
    for _ in planted("not_regular", 300):  # links to a valid shard elsewhere: never followed
        name().symlink_to(target)
    for _ in planted("not_regular", 100):  # FIFOs: never opened (an open would hang)
        os.mkfifo(name())
    for _ in planted("not_regular", 50):
        name().mkdir()
    for _ in planted("untrusted", 300):  # well-formed, another user's, claiming this test's (root's) pid
        path = name()
        _plant_shard(path, os.getpid())
        os.chown(path, STRANGER, STRANGER)
    for _ in planted("untrusted", 100):  # another user's garbage
        path = name()
        path.write_bytes(os.urandom(512))
        os.chown(path, STRANGER, STRANGER)
    for _ in planted("bad_mode", 200):  # well-formed, root's, but writable by anyone: refused
        _plant_shard(name(), os.getpid(), mode=0o666)
    for _ in planted("too_large", 100):  # 1 GiB (sparse), valid header: never read
        _plant_shard(name(), os.getpid(), size=2**30)
    for _ in planted("truncated", 150):  # shorter than a header
        name().write_bytes(spool.MAGIC + b"\x01\0\0\0")
    for _ in planted("truncated", 150):  # a header whose directory and data are cut off
        path = name()
        _plant_shard(path, os.getpid())
        os.truncate(path, 4200)
    return counts


def _processes(parsed: dict) -> float:  # type: ignore[type-arg]
    """Processes the agent reads, in any state (on a loaded machine one may read as unresponsive a while)."""
    return sum(value(parsed, "outrider_hook_processes", state=s) or 0 for s in ("running", "stalled", "unresponsive"))


def _fds(pid: int, spool_dir: Path) -> tuple[int, int]:
    """The agent's open descriptors, and how many of them are shards (or files named so) in the spool."""
    total = shards = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        total += 1
        try:
            target = Path(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        shards += target.parent == spool_dir and bool(spool.SHARD_NAME_RE.fullmatch(target.name))
    return total, shards


@needs_root
def test_thousands_of_planted_files_leave_the_agent_bounded_and_every_real_shard_read(tmp_path: Path) -> None:
    shared, outside, hold = tmp_path / "emptydir", tmp_path / "outside", tmp_path / "hold"
    shared.mkdir()
    shared.chmod(0o1777)  # explicitly shared: anyone may create files in it
    outside.mkdir()
    counts = plant(shared, outside)
    assert sum(counts.values()) >= 2000
    env = {"OUTRIDER_SPOOL_DIR": str(shared), "OUTRIDER_FLUSH_INTERVAL_S": "0.2"}
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    with AgentProcess(env=env, interval_s=0.3, fd_limit=FD_LIMIT) as agent:
        workloads = [subprocess.Popen([sys.executable, WORKLOAD, "--steps", str(STEPS), "--forks", str(FORKS),
                                       "--hold", str(hold)], env={**base, **env, "OUTRIDER_STANDALONE": "false"})
                     for _ in range(2)]
        most = [0, 0]
        try:
            def all_read() -> dict | None:  # type: ignore[type-arg]
                total, in_spool = _fds(agent.proc.pid, shared)
                most[:] = [max(most[0], total), max(most[1], in_spool)]
                status, _, body = http_get(agent.url + "/metrics", timeout_s=10)
                assert status == 200, "/metrics stays reachable"
                parsed = samples(body.decode())
                done = (_processes(parsed) == 2 * (1 + FORKS)
                        and value(parsed, "outrider_samples_total", rank="") == 2 * (STEPS * 4 + FORKS * 7))
                return parsed if done else None
            parsed = wait_until(all_read, timeout_s=120, interval_s=0.2,
                                what="every real shard read: 2 workloads and their forked children")
            assert value(parsed, "outrider_train_steps_total", rank="") == 2 * STEPS, "the planted counts are not"
            assert value(parsed, "outrider_train_steps_total", rank="0") is None
            parsed = samples(after_more(agent, "outrider_agent_sweeps_total", 5))
            for reason, n in counts.items():
                assert value(parsed, "outrider_hook_shard_errors_total", reason=reason) == n, \
                    f"{reason}: each planted file counted once, however many sweeps saw it"
                assert value(parsed, "outrider_hook_spool_rejected_files", reason=reason) == n
            assert value(parsed, "outrider_agent_accept_errors_total", reason="emfile") is None
            total, in_spool = _fds(agent.proc.pid, shared)
            most[:] = [max(most[0], total), max(most[1], in_spool)]
            print(f"\n{sum(counts.values())} planted files, {2 * (1 + FORKS)} real shards, ulimit -n {FD_LIMIT}: "
                  f"at most {most[0]} descriptors, {most[1]} of them in the spool")
            assert most[1] <= FD_LIMIT // 4, "shard descriptors stay within the reader's bound"
            assert most[0] < FD_LIMIT // 2, "the agent stays well under its limit"
            hold.touch()
            for p in workloads:
                assert p.wait(timeout=60) == 0
            wait_until(lambda: _processes(samples(agent.metrics())) == 0, timeout_s=60, what="the workloads retired")
            parsed = samples(agent.metrics())
            assert value(parsed, "outrider_samples_total", rank="") == 2 * (STEPS * 4 + FORKS * 7), "totals kept"
            left = [p.name for p in shared.iterdir() if spool.SHARD_NAME_RE.fullmatch(p.name)]
            assert len(left) == sum(counts.values()), "the real shards cleaned up, nothing planted touched"
        finally:
            hold.touch()
            reap(workloads)
        lines = agent.output.splitlines()
    print(f"{len(lines)} log lines")
    assert len(lines) <= 40, "logs rate-limited: " + "\n".join(lines[:60])
