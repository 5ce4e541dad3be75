"""The node agent as the chart's DaemonSet runs it (tests/container/kubelet.py runs the rendered pod spec): uid
65532, read-only root, every capability dropped, no privilege escalation, the host's /proc, /sys and / mounted
read-only, the host's network. It answers /healthz and /metrics (promtool accepts the exposition), its network
counters are the host's interfaces, its filesystem space is the host's /, and what a non-root agent may not read
(other users' /proc/PID/io and fd) is absent and counted, never 0. Its RSS is measured from the host."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from outrider.config import Config
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


def test_node_agent_reads_the_host_as_the_chart_runs_it(podman: Podman, built: dict[str, str],
                                                        tmp_path: Path) -> None:
    promtool = need_binary("promtool")
    # Every process one by one (a large top N), so each one's readings can be checked. Without the kubelet's
    # pod-resources socket (no kubelet here): the node agent as it runs without GPU -> pod attribution, non-root.
    docs = render(built["IMAGE"], {"config": {"interval_s": 1, "filesystems": ["/"], "process_top_n": 10000},
                                   "nodeAgent": {"podResources": {"enabled": False}}})
    spec = pod_spec(docs, "DaemonSet")
    assert spec["hostNetwork"] is True and not spec["hostPID"]
    agent = spec["containers"][0]
    port = free_port()
    kubelet = Kubelet(podman, tmp_path, configmaps(docs))
    # The chart listens on 0.0.0.0:9477 of the node; here the node is this machine: a free port on loopback.
    cid = kubelet.create(spec, agent, Override(env={"OUTRIDER_LISTEN": f"127.0.0.1:{port}"}))
    net_before = _host_netdev()
    podman("start", cid)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert podman.exit_code(cid) is None, f"the node agent exited:\n{podman.logs(cid)}"
        return http_get(url + "/readyz", timeout_s=2)[0] == 200

    wait_until(ready, timeout_s=90, interval_s=0.5, what="the node agent's /readyz")
    state = podman.inspect(cid)
    assert state["Config"]["User"].split(":")[0] == str(AGENT_UID)
    assert state["HostConfig"]["ReadonlyRootfs"] is True
    assert state["HostConfig"]["NetworkMode"] == "host"
    pid = int(state["State"]["Pid"])
    status = Path(f"/proc/{pid}/status").read_text()
    assert "CapEff:\t0000000000000000" in status, "no capabilities at all"
    assert "NoNewPrivs:\t1" in status

    # Three sweeps more, so the process collector's counters have moved and the rules have been evaluated once.
    def sweeps() -> float:
        return value(samples(http_get(url + "/metrics")[2].decode()), "outrider_agent_sweeps_total") or 0

    start = sweeps()
    wait_until(lambda: sweeps() >= start + 3, timeout_s=60, what="three more sweeps")
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
    shown = {dict(labels)["pid"] for (name, labels) in parsed if name == "outrider_process_threads"} - {"other"}
    with_io = {dict(labels)["pid"] for (name, labels) in parsed if name == "outrider_process_io_bytes_total"}
    with_fds = {dict(labels)["pid"] for (name, labels) in parsed if name == "outrider_process_open_fds"}
    owners = {}
    for p in shown:
        try:
            owners[p] = os.stat(f"/proc/{p}").st_uid
        except FileNotFoundError:
            continue  # exited since the sweep
    others = {p for p, uid in owners.items() if uid != AGENT_UID}
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
