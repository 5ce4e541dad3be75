"""The node agent as the chart's DaemonSet runs it by default (tests/container/kubelet.py runs the rendered pod
spec): uid 65532, read-only root, every capability dropped, no privilege escalation, the host's /proc, /sys and /
mounted read-only, the host's network. It answers /healthz and /metrics (promtool accepts the exposition), its
network counters are the host's interfaces, its filesystem space is the host's /, what a non-root agent may not
read (other users' /proc/PID/io and fd) is absent and counted, never 0, and the host's private files (a 0600 key of
root's, /etc/shadow) stay unreadable through the host's / mounted in it. Its RSS is measured from the host. The
opt-ins (nodeAgent.privileges) add what values.yaml says at the cost it says: root adds root's processes' open
files, all-processes every process's I/O (and can read every file), and both can read root's private files."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outrider.ground.config import Config
from outrider.kernel import procfs
from tests.conftest import need_binary
from tests.container.chart import configmaps, pod_spec, render
from tests.container.conftest import FIGURES
from tests.container.kubelet import Kubelet, Override
from tests.container.podman import Podman
from tests.helpers import free_port, http_get, samples, value, wait_until

pytestmark = pytest.mark.container
AGENT_UID = 65532


def _host_netdev() -> dict[str, int]:
    import re

    exclude = re.compile(Config().network_exclude)
    return {n.interface: n.rx_bytes for n in procfs.read_netdev("/proc") if not exclude.match(n.interface)}


def _memory_limit_bytes(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    return int(text[:-2]) * units[text[-2:]]


@pytest.fixture
def host_keys() -> Iterator[tuple[Path, Path]]:
    """A 0600 file of root's on the host, as a private key is, and a 0644 one beside it, in a directory every user
    may enter (so that what keeps the key from the agent is the key's own mode, not a directory's)."""
    directory = Path(tempfile.mkdtemp(prefix="outrider-node-agent-", dir="/var/tmp"))
    try:
        directory.chmod(0o755)
        key, public = directory / "id_ed25519", directory / "id_ed25519.pub"
        key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nplanted\n")
        public.write_text("ssh-ed25519 planted\n")
        key.chmod(0o600)
        public.chmod(0o644)
        for path in (directory, key, public):
            os.chown(path, 0, 0)
        yield key, public
    finally:
        shutil.rmtree(directory)


def _reads(podman: Podman, cid: str, path: str) -> str:
    """What the agent's container, as the agent's user, gets when it opens a host file through /host/root."""
    return podman("exec", cid, "/opt/outrider/bin/python3", "-c",
                  "import sys\ntry:\n open(sys.argv[1], 'rb').read(1)\n print('read')\n"
                  "except OSError as e:\n print(type(e).__name__)", "/host/root" + path)


def _start(podman: Podman, image: str, tmp_path: Path, values: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """The chart's DaemonSet pod, every process one by one (a large top N, so that each one's readings can be
    checked), listening on a free loopback port (the chart listens on 0.0.0.0:9477 of the node; the node is this
    machine); (container id, URL, the agent's container spec) once it is ready."""
    docs = render(image, {"config": {"interval_s": 1, "filesystems": ["/"], "process_top_n": 10000}, **values})
    spec = pod_spec(docs, "DaemonSet")
    assert spec["hostNetwork"] is True and not spec["hostPID"]
    agent = spec["containers"][0]
    port = free_port()
    cid = Kubelet(podman, tmp_path, configmaps(docs)).create(spec, agent,
                                                             Override(env={"OUTRIDER_LISTEN": f"127.0.0.1:{port}"}))
    podman("start", cid)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert podman.exit_code(cid) is None, f"the node agent exited:\n{podman.logs(cid)}"
        return http_get(url + "/readyz", timeout_s=2)[0] == 200

    wait_until(ready, timeout_s=90, interval_s=0.5, what="the node agent's /readyz")
    return cid, url, agent


def _sweeps_later(url: str, n: int) -> dict[Any, float]:
    """The exposition n sweeps from now, parsed."""
    def sweeps() -> float:
        return value(samples(http_get(url + "/metrics")[2].decode()), "outrider_agent_sweeps_total") or 0

    start = sweeps()
    wait_until(lambda: sweeps() >= start + n, timeout_s=60, what=f"{n} more sweeps")
    return samples(http_get(url + "/metrics")[2].decode())


def _readable_io(podman: Podman, cid: str, pids: set[str]) -> set[str]:
    """The pids whose /proc/PID/io a second reader in the agent's container (the same user, capabilities and
    security profile) can open through the host's /proc: what the privileges let the agent read on this machine.
    It is not every process everywhere: a host may hold processes no container reads (one CI machine's PID 1 is
    such a one), and the agent is judged on what its privileges allow, not on the host's own rules."""
    out = podman("exec", cid, "/opt/outrider/bin/python3", "-c",
                 "import sys\nfor p in sys.argv[1:]:\n try:\n  open(f'/host/proc/{p}/io', 'rb').read()\n"
                 "  print(p)\n except OSError:\n  pass", *sorted(pids))
    return set(out.split())


def _with_io_and_fds(parsed: dict[Any, float]) -> tuple[set[str], set[str], set[str]]:
    """The pids shown one by one, those with I/O readings, those with open-file counts."""
    shown = {dict(labels)["pid"] for (name, labels) in parsed if name == "outrider_process_threads"} - {"other"}
    with_io = {dict(labels)["pid"] for (name, labels) in parsed if name == "outrider_process_io_bytes_total"}
    with_fds = {dict(labels)["pid"] for (name, labels) in parsed if name == "outrider_process_open_fds"}
    return shown, with_io, with_fds


def _holds_no_capability(pid: str) -> bool:
    try:
        return "CapPrm:\t0000000000000000" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True  # gone since the sweep: whatever it held, it says nothing


def _owners(pids: set[str]) -> dict[str, int]:
    owners = {}
    for p in pids:
        try:
            owners[p] = os.stat(f"/proc/{p}").st_uid
        except FileNotFoundError:
            continue  # exited since the sweep
    return owners


def test_node_agent_reads_the_host_as_the_chart_runs_it(podman: Podman, built: dict[str, str], tmp_path: Path,
                                                        host_keys: tuple[Path, Path]) -> None:
    promtool = need_binary("promtool")
    key, public = host_keys
    net_before = _host_netdev()
    cid, url, agent = _start(podman, built["IMAGE"], tmp_path, {})  # the chart's defaults
    state = podman.inspect(cid)
    assert state["Config"]["User"].split(":")[0] == str(AGENT_UID)
    assert state["HostConfig"]["ReadonlyRootfs"] is True
    assert state["HostConfig"]["NetworkMode"] == "host"
    pid = int(state["State"]["Pid"])
    status = Path(f"/proc/{pid}/status").read_text()
    assert "CapEff:\t0000000000000000" in status, "no capabilities at all"
    assert "NoNewPrivs:\t1" in status

    # The host's private files, through the host's / mounted in the container: a 0600 key of root's, /etc/shadow
    assert _reads(podman, cid, str(key)) == "PermissionError"
    assert _reads(podman, cid, "/etc/shadow") == "PermissionError"
    assert _reads(podman, cid, str(public)) == "read", "the host's / is there: only what is private is out"

    # Three sweeps more, so the process collector's counters have moved and the rules have been evaluated once.
    _sweeps_later(url, 3)
    assert http_get(url + "/healthz")[0] == 200
    text = http_get(url + "/metrics")[2].decode()
    net_after = _host_netdev()
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    parsed = samples(text)

    # Network: the host's interfaces, with the host's counters (between the host's readings before and after).
    seen = {}
    for (name, label_pairs), v in parsed.items():
        d = dict(label_pairs)
        if name == "outrider_host_network_io_bytes_total" and d["direction"] == "receive":
            seen[d["interface"]] = v
    assert set(seen) == set(net_before) and seen, (seen, net_before, net_after)
    for interface, rx in seen.items():
        assert net_before[interface] <= rx <= net_after[interface], (interface, net_before, rx, net_after)

    # Filesystem: the host's / as the host mounts it (read-write), not the container's read-only view of it.
    st = os.statvfs("/")
    host_root = procfs.mount_of("/", procfs.read_mounts("/proc/1"))
    assert host_root is not None
    labels = {"mountpoint": "/", "device": host_root.device, "fstype": host_root.fstype}
    assert value(parsed, "outrider_host_filesystem_size_bytes", **labels) == st.f_blocks * st.f_frsize
    assert value(parsed, "outrider_host_filesystem_readonly", **labels) == (1 if host_root.readonly else 0)

    # Processes: every host process is visible (the host's /proc); the I/O and fds of other users' processes
    # cannot be read by uid 65532: absent, and counted as dropped readings, never reported as 0.
    shown, with_io, with_fds = _with_io_and_fds(parsed)
    others = {p for p, uid in _owners(shown).items() if uid != AGENT_UID}
    assert others, "the agent sees the host's processes, most of them root's"
    assert not others & with_io, f"other users' I/O is left out, not reported: {others & with_io}"
    assert not others & with_fds, others & with_fds
    assert str(pid) in shown and str(pid) in with_io, f"its own readings (same uid) are there: {pid}, {with_io}"
    assert (value(parsed, "outrider_collector_errors_total", collector="process") or 0) > 0, "and counted"

    # Memory: the agent's RSS inside its container, against the chart's limit.
    rss = int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:")).split()[1]) * 1024
    limit = _memory_limit_bytes(agent["resources"]["limits"]["memory"])
    FIGURES.append(f"node agent RSS in its container: {rss / (1 << 20):.1f} MiB (chart limit "
                   f"{limit / (1 << 20):.0f} MiB), all collectors, built-in rules, {len(shown)} processes one by one")
    assert rss < limit, "the node agent fits the memory limit the chart gives it"


@pytest.mark.parametrize("privileges", ["root", "all-processes"])
def test_node_agent_privileges_add_what_they_say_at_the_cost_they_say(
        podman: Podman, built: dict[str, str], tmp_path: Path, host_keys: tuple[Path, Path], privileges: str) -> None:
    """nodeAgent.privileges, the opt-ins. root (uid 0, every capability still dropped, for the kubelet's socket) adds
    the open-file counts of root's processes (their fd directories are uid 0's) but not their I/O, which needs the
    reader to hold every capability they hold; all-processes (CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH, nothing else)
    reads every process's, another user's included. Both pay the cost values.yaml states, shown here: the
    host's files of root's are readable through the host's / (hence neither is the default)."""
    key, _ = host_keys
    other_user = subprocess.Popen(["sleep", "600"], user=4321, group=4321)  # a process of another user
    try:
        cid, url, _ = _start(podman, built["IMAGE"], tmp_path, {"nodeAgent": {"privileges": privileges}})
        state = podman.inspect(cid)
        assert state["Config"]["User"].split(":")[0] == "0"
        status = Path(f"/proc/{state['State']['Pid']}/status").read_text()
        # bits 2 and 19: CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE
        effective = "0000000000080004" if privileges == "all-processes" else "0000000000000000"
        assert f"CapEff:\t{effective}" in status and "NoNewPrivs:\t1" in status
        assert _reads(podman, cid, str(key)) == "read" and _reads(podman, cid, "/etc/shadow") == "read", \
            "the cost stated: root's files are readable"
        parsed = _sweeps_later(url, 3)
        shown, with_io, with_fds = _with_io_and_fds(parsed)
        others = {p for p, uid in _owners(shown).items() if p != str(state["State"]["Pid"])}
        assert str(other_user.pid) in others
        roots = {p for p, uid in _owners(shown).items() if uid == 0} & others
        if privileges == "root":
            assert str(other_user.pid) not in with_io | with_fds, "another user's: still out"
            assert len(roots & with_fds) >= 0.9 * len(roots), "root's processes' open files (their fd directories)"
            assert others & with_io <= {p for p in roots if _holds_no_capability(p)}, \
                "I/O only of root's processes that hold no capability either (a reader must hold all of theirs)"
        else:
            assert str(other_user.pid) in with_io & with_fds, "another user's process"
            readable = _readable_io(podman, cid, others)
            assert str(other_user.pid) in readable and len(readable) >= 0.5 * len(others), \
                f"the privileges read most of the host's processes' I/O: {len(readable)} of {len(others)}"
            assert len(readable & with_io) >= 0.9 * len(readable), \
                "every process's the privileges let it read (bar those gone since the sweep)"
    finally:
        other_user.kill()
        other_user.wait()
