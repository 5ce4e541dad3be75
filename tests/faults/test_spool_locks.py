"""Lock files planted by another user in a shared spool, with real workloads and agents.

Once an empty `agent.lock` or `spawn.lock` of another user in a shared spool meant that no agent was ever started
(the hook took the file for a held lock) and nothing said why, and a sidecar on such a spool never owned it, so it
never removed finished shards. Now a lock file nobody holds that is not a trusted user's is replaced where the
directory lets this user (said once), and refused with the reason where it does not (a sticky directory of someone
else's). Tests run as root: the other user's files are made by chown, and "this user without the right to replace
them" is root without CAP_FOWNER (capsh), since other uids cannot run this interpreter here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from outrider.hook.election import SPAWN_LOCK_NAME
from outrider.shared import spool
from tests.helpers import (
    REPO,
    AgentProcess,
    free_port,
    samples,
    standalone_agent,
    stop_standalone_agent,
    value,
    wait_until,
)

pytestmark = pytest.mark.integration
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's files needs root (CI runs as root)")
WORKLOAD = str(REPO / "tests" / "hook" / "workload.py")
STRANGER = 54321  # the other user: neither this one, root, nor trusted
OWNER = 4242  # a trusted uid that owns the sticky shared directory (not this user, so its sticky bit binds us)


def _env(spool_dir: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    return {**base, "OUTRIDER_SPOOL_DIR": str(spool_dir), "OUTRIDER_FLUSH_INTERVAL_S": "0.1", **extra}


def shared_spool(path: Path, *, mode: int = 0o777, owner: int = 0) -> Path:
    """A spool shared by several users: root's and open to all like a pod's emptyDir, or sticky like /tmp."""
    path.mkdir()
    path.chmod(mode)
    os.chown(path, owner, owner)
    return path


def plant(spool_dir: Path, *names: str) -> None:
    """The other user's empty lock files, as `touch` makes them."""
    for name in names:
        (spool_dir / name).write_text("")
        (spool_dir / name).chmod(0o644)
        os.chown(spool_dir / name, STRANGER, STRANGER)


@needs_root
def test_planted_agent_and_spawn_locks_do_not_keep_the_workloads_agent_out(tmp_path: Path) -> None:
    sp = shared_spool(tmp_path / "emptydir")
    plant(sp, spool.LOCK_NAME, SPAWN_LOCK_NAME)
    r = subprocess.run([sys.executable, WORKLOAD, "--steps", "30", "--step-sleep", "0.02"],
                       env=_env(sp, OUTRIDER_STANDALONE="true", OUTRIDER_LISTEN=f"127.0.0.1:{free_port()}",
                                OUTRIDER_INTERVAL_S="0.2"),
                       capture_output=True, text=True, timeout=120)
    agent = standalone_agent(r.stderr)
    assert agent is not None, "an agent was started all the same:\n" + r.stderr
    assert stop_standalone_agent(agent[0]), "and it ended after the workload"
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    for name in (spool.LOCK_NAME, SPAWN_LOCK_NAME):  # why, said once for each
        said = [line for line in r.stderr.splitlines() if f"{sp / name} was owned by uid {STRANGER}" in line]
        assert len(said) == 1 and "replaced" in said[0], r.stderr
        assert os.lstat(sp / name).st_uid == 0, "the lock file is this user's now"


@needs_root
def test_a_sidecar_on_a_spool_with_a_planted_lock_owns_it_and_removes_finished_shards(tmp_path: Path) -> None:
    sp = shared_spool(tmp_path / "emptydir")
    plant(sp, spool.LOCK_NAME)
    with AgentProcess(env={"OUTRIDER_SPOOL_DIR": str(sp)}) as agent:
        assert value(samples(agent.metrics()), "outrider_hook_spool_owner") == 1, agent.output
        r = subprocess.run([sys.executable, WORKLOAD, "--steps", "20"], env=_env(sp, OUTRIDER_STANDALONE="false"),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        wait_until(lambda: value(samples(agent.metrics()), "outrider_train_steps_total", rank="") == 20,
                   timeout_s=30, what="the finished workload's steps")
        wait_until(lambda: not list(sp.glob("*.shard")), timeout_s=30, what="its shard removed by the owner")
        output = agent.output
    assert f"{sp / spool.LOCK_NAME} was owned by uid {STRANGER}" in output and "replaced" in output, output


@needs_root
def test_a_planted_lock_that_cannot_be_replaced_is_said_once_and_the_workload_runs_on(tmp_path: Path) -> None:
    capsh = shutil.which("capsh")
    if capsh is None:
        pytest.skip("capsh (libcap2-bin) drops the capability")
    sp = shared_spool(tmp_path / "scratch", mode=0o1777, owner=OWNER)  # a shared /tmp-like directory
    plant(sp, spool.LOCK_NAME)
    command = [capsh, "--drop=cap_fowner", "--", "-c", 'exec "$0" "$@"', sys.executable, WORKLOAD,
               "--steps", "30", "--step-sleep", "0.05"]
    r = subprocess.run(command, env=_env(sp, OUTRIDER_STANDALONE="true", OUTRIDER_SPOOL_TRUSTED_UIDS=str(OWNER),
                                         OUTRIDER_LISTEN=f"127.0.0.1:{free_port()}"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert standalone_agent(r.stderr) is None, "no agent can own the spool"
    said = [line for line in r.stderr.splitlines() if "no agent can own this spool" in line]
    assert len(said) == 1, r.stderr
    assert f"{sp / spool.LOCK_NAME} is owned by uid {STRANGER}, which is not trusted, and no process holds it" \
        in said[0] and "remove it, or set spool_dir" in said[0]
    assert os.lstat(sp / spool.LOCK_NAME).st_uid == STRANGER
    shards = list(sp.glob("*.shard"))
    assert len(shards) == 1 and spool.decode(shards[0].read_bytes()).header.steps == 30, "it published all along"
