"""The oom collector against fixture trees laid out as the kernel writes them (tests/fakes/cgroup_node.py): cgroup v2
(memory.events, counting a cgroup's descendants) and v1 (memory.oom_control, each cgroup its own), the kubelet's
systemd and cgroupfs drivers, containerd, CRI-O and docker names, /proc/vmstat's oom_kill, the kernel log's records
as /dev/kmsg hands them out, and the kubelet's log directories that name pods and containers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from outrider.collectors import oom as oom_module
from outrider.collectors.base import CollectorContext
from outrider.collectors.oom import OomCollector
from outrider.k8s.cgroup_owners import CgroupIdentity, PodDirectory, identity
from outrider.kernel.kmsg import KernelLog, parse_killed_process, parse_oom_kill_summary, split_records
from outrider.metrics.exposition import render
from outrider.metrics.family import Family
from outrider.rules.promtest import parse_series
from outrider.wiring.sampler import SweepStats
from tests.alerts.test_input_series import TARGET_LABELS
from tests.fakes.cgroup_node import V2_EVENTS, VMSTAT, Node
from tests.helpers import REPO

UID = "3f0c2a8e-5b1d-4c7e-9a61-0d2f4b8c7e15"
CID = "4b2f9c1d7e8a6b5c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c"
CID2 = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d"
STATIC_UID = "b6d5f6c0e0c5a1d2e3f4a5b6c7d8e9f0"
SYSTEMD_POD = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"
CGROUPFS_POD = f"/kubepods/burstable/pod{UID}"


def collector(node: Node, clock: list[float] | None = None, **extra: object) -> OomCollector:
    now = clock if clock is not None else [0.0]
    return OomCollector(CollectorContext(node.config(**extra), SweepStats()), clock=lambda: now[0])


def victims(fams: list[Family]) -> dict[str, dict[str, object]]:
    """cgroup -> {label: value, ..., "kills": n} of the victim series."""
    out: dict[str, dict[str, object]] = {}
    for f in fams:
        if f.defn.name == "outrider_oom_victim_kills_total":
            for labels, value in f.samples:
                row: dict[str, object] = dict(zip(f.defn.label_names, labels))
                row["kills"] = value
                out[labels[0]] = row
    return out


def value(fams: list[Family], name: str, *labels: str) -> float:
    return next(float(v) for f in fams if f.defn.name == name for lb, v in f.samples  # type: ignore[arg-type]
                if lb == labels)


# --- the kubelet's and runtimes' cgroup names -------------------------------------------------------------------

@pytest.mark.parametrize(("path", "expected"), [
    (f"{SYSTEMD_POD}/cri-containerd-{CID}.scope", CgroupIdentity(UID, CID, "containerd")),
    (f"{SYSTEMD_POD}/crio-{CID}.scope", CgroupIdentity(UID, CID, "cri-o")),
    (f"{SYSTEMD_POD}/docker-{CID}.scope", CgroupIdentity(UID, CID, "docker")),
    (f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
     CgroupIdentity(UID, CID, "containerd")),  # Guaranteed: directly under kubepods
    (f"{CGROUPFS_POD}/{CID}", CgroupIdentity(UID, CID, "")),  # containerd with the cgroupfs driver
    (f"{CGROUPFS_POD}/crio-{CID}", CgroupIdentity(UID, CID, "cri-o")),
    (f"/kubepods/pod{UID}/{CID}", CgroupIdentity(UID, CID, "")),
    (f"/kubepods/besteffort/pod{STATIC_UID}/{CID}", CgroupIdentity(STATIC_UID, CID, "")),  # a static pod
    (SYSTEMD_POD, CgroupIdentity(UID, "", "")),  # the pod's own cgroup
    (f"{SYSTEMD_POD}/crio-conmon-{CID}.scope", CgroupIdentity(UID, "", "")),  # CRI-O's monitor, not the container
    (f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
     f"kubelet-kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
     CgroupIdentity("", CID, "containerd")),  # a kind node's nested kubelet: the pod segment is not the kubelet's
    (f"/machine.slice/libpod-{CID}.scope/container", CgroupIdentity("", CID, "podman")),
    (f"/system.slice/docker-{CID}.scope", CgroupIdentity("", CID, "docker")),
    (f"/docker/{CID}", CgroupIdentity("", CID, "")),
    ("/system.slice/data-sync.service", CgroupIdentity("", "", "")),
    (f"/user.slice/pod{UID}", CgroupIdentity("", "", "")),  # a pod-like name outside kubepods is no pod
])
def test_the_cgroup_path_names_the_pod_and_the_container(path: str, expected: CgroupIdentity) -> None:
    assert identity(path) == expected


def test_the_kubelets_logs_name_the_pod_and_its_container(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    node.pod_logs("ml", "trainer-0", UID, {"trainer": CID, "sidecar": CID2})
    pods = PodDirectory(str(node.host))
    assert pods.owner(CgroupIdentity(UID, CID, "containerd")).labels() == ("ml", "trainer-0", "trainer")
    assert pods.owner(CgroupIdentity(UID, CID2, "")).labels() == ("ml", "trainer-0", "sidecar")
    assert pods.owner(CgroupIdentity(UID, "", "")).labels() == ("ml", "trainer-0", "")
    assert pods.owner(CgroupIdentity(UID, "f" * 64, "")).labels() == ("ml", "trainer-0", ""), \
        "a container without a log link in a two-container pod is not guessed"
    assert pods.owner(CgroupIdentity("0" * 32, CID, "")) is None
    assert pods.owner(CgroupIdentity("", CID, "")) is None


def test_a_restarted_containers_old_id_is_named_where_its_pod_has_one_container(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    node.pod_logs("ml", "trainer-0", UID, {"trainer": CID2})  # the link of the restarted container's new id only
    assert PodDirectory(str(node.host)).owner(CgroupIdentity(UID, CID, "")).labels() == ("ml", "trainer-0", "trainer")


# --- the kernel log's records ----------------------------------------------------------------------------------

def test_the_kernel_logs_oom_lines_are_parsed_with_awkward_process_names() -> None:
    rec = parse_oom_kill_summary("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
                                 "oom_memcg=/a,task_memcg=/a/b,task=my,task=x,pid=7,uid=0", 12)
    assert rec is not None and (rec.pid, rec.task, rec.memcg, rec.timestamp_us) == (7, "my,task=x", "/a/b", 12)
    none = parse_oom_kill_summary("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
                                  "global_oom,task_memcg=/,task=java,pid=9,uid=1000")
    assert none is not None and (none.task, none.memcg) == ("java", "/")
    killed = parse_killed_process("Out of memory: Killed process 42 (pt (worker) 1) total-vm:1kB, anon-rss:1kB")
    assert killed is not None and (killed.pid, killed.task, killed.memcg) == (42, "pt (worker) 1", None)
    for garbage in ("oom-kill:", "oom-kill:task=x,pid=,uid=0", "Killed process x (y)", "Killed process 3 (y",
                    "something else"):
        assert parse_oom_kill_summary(garbage) is None and parse_killed_process(garbage) is None
    assert split_records("6,1,5,-;hello\n SUBSYSTEM=x\nno separator\n4,2,junk,-;world\n") == [(5, "hello"),
                                                                                           (0, "world")]


def test_the_kernel_log_gives_only_what_came_after_it_was_opened(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    node.kill("/old", task="before")
    log = KernelLog(str(node.kmsg))
    assert log.open() and log.oom_kills() == ([], [])
    node.kill("/new", task="after", pid=77)
    summaries, killed = log.oom_kills()
    assert [(r.task, r.memcg, r.pid) for r in summaries] == [("after", "/new", 77)]
    assert [(r.task, r.pid) for r in killed] == [("after", 77)]
    assert log.oom_kills() == ([], [])
    missing = KernelLog(str(tmp_path / "no-kmsg"))
    assert not missing.open() and isinstance(missing.error, FileNotFoundError) and missing.read_new() == ""


# --- victims ------------------------------------------------------------------------------------------------------

def test_a_kill_in_a_pods_container_names_pod_container_and_process(tmp_path: Path) -> None:
    """v2, the systemd driver, containerd: the node agent's view."""
    node = Node(tmp_path, 2)
    container = f"{SYSTEMD_POD}/cri-containerd-{CID}.scope"
    node.cgroup(container)
    node.cgroup(f"{SYSTEMD_POD}/cri-containerd-{CID2}.scope")
    node.pod_logs("ml", "trainer-0", UID, {"trainer": CID, "sidecar": CID2})
    c = collector(node)
    assert victims(c.collect()) == {}
    node.kill(container, task="python3", pid=18855)
    fams = c.collect()
    assert victims(fams) == {container: {
        "cgroup": container, "pod_uid": UID, "container_id": CID, "process": "python3",
        "victim": "python3 in pod ml/trainer-0, container trainer", "exported_namespace": "ml",
        "exported_pod": "trainer-0", "exported_container": "trainer", "kills": 1.0}}
    assert value(fams, "outrider_oom_unattributed_kills_total", "unnamed") == 0
    assert value(fams, "outrider_oom_scans_total") == 1
    assert value(fams, "outrider_oom_kernel_log_readable") == 1
    text = render(fams).decode()
    assert (f'outrider_oom_victim_kills_total{{cgroup="{container}",pod_uid="{UID}",container_id="{CID}",'
            f'process="python3",victim="python3 in pod ml/trainer-0, container trainer",exported_namespace="ml",'
            f'exported_pod="trainer-0",exported_container="trainer"}} 1') in text
    node.kill(container, task="pt_data_worker", pid=18900)
    again = victims(c.collect())[container]
    assert again["kills"] == 2 and again["process"] == "python3", "one series per victim: the first name stays"
    assert c.errors == 0


def test_the_owner_labels_take_their_configured_names(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    container = f"{SYSTEMD_POD}/cri-containerd-{CID}.scope"
    node.cgroup(container)
    node.pod_logs("ml", "trainer-0", UID, {"trainer": CID})
    c = collector(node, k8s_owner_namespace_label="workload_namespace", k8s_owner_pod_label="workload_pod",
                  k8s_owner_container_label="workload_container")
    c.collect()
    node.kill(container)
    text = render(c.collect()).decode()
    assert 'workload_namespace="ml",workload_pod="trainer-0",workload_container="trainer"' in text


def test_a_container_removed_before_the_look_is_named_by_the_kernel_log_else_its_pod(tmp_path: Path) -> None:
    """v2, the cgroupfs driver, CRI-O: the container dies of the kill and its cgroup goes before the agent looks;
    the pod's cgroup kept the count (v2 counts ancestors)."""
    container = f"{CGROUPFS_POD}/crio-{CID}"
    for kmsg in (True, False):
        node = Node(tmp_path / str(kmsg), 2)
        node.cgroup(container)
        node.pod_logs("ml", "trainer-0", UID, {"trainer": CID})
        c = collector(node, **({} if kmsg else {"kmsg_path": ""}))
        c.collect()
        node.kill(container, task="python3")
        node.remove(container)
        seen = victims(c.collect())
        if kmsg:
            assert list(seen) == [container]
            assert seen[container]["victim"] == "python3 in pod ml/trainer-0, container trainer"
        else:
            assert list(seen) == [CGROUPFS_POD], "without the log, the kill stays with the pod"
            assert seen[CGROUPFS_POD]["victim"] == "a process in pod ml/trainer-0"
            assert seen[CGROUPFS_POD]["process"] == "" and seen[CGROUPFS_POD]["exported_pod"] == "trainer-0"


def test_v1_counts_each_cgroups_own_kills_and_a_removed_one_is_named_by_the_log_or_unattributed(tmp_path: Path) -> None:
    """v1, the cgroupfs driver, docker names: every cgroup is read; a cgroup removed with its count is named by the
    kernel log, else counted as unattributed (only in the host's view)."""
    kept = f"/kubepods/burstable/pod{UID}/{CID}"
    gone = f"/kubepods/burstable/pod{UID}/{CID2}"
    for kmsg in (True, False):
        node = Node(tmp_path / str(kmsg), 1)
        node.cgroup(kept)
        node.cgroup(gone)
        node.pod_logs("ml", "trainer-0", UID, {"trainer": CID, "loader": CID2})
        c = collector(node, **({} if kmsg else {"kmsg_path": ""}))
        c.collect()
        node.kill(kept, task="python3", pid=100)
        node.kill(gone, task="loader", pid=101)
        node.remove(gone)
        fams = c.collect()
        seen = victims(fams)
        assert seen[kept]["victim"] == ("python3" if kmsg else "a process") + " in pod ml/trainer-0, container trainer"
        assert seen[kept]["kills"] == 1
        if kmsg:
            assert seen[gone]["victim"] == "loader in pod ml/trainer-0, container loader"
            assert value(fams, "outrider_oom_unattributed_kills_total", "unnamed") == 0
        else:
            assert gone not in seen and f"/kubepods/burstable/pod{UID}" not in seen, "v1's pod does not hold it"
            assert value(fams, "outrider_oom_unattributed_kills_total", "unnamed") == 1


def test_kills_before_the_agent_started_are_history(tmp_path: Path) -> None:
    for version in (1, 2):
        node = Node(tmp_path / str(version), version)
        old = f"{SYSTEMD_POD}/cri-containerd-{CID}.scope"
        node.kill(old)
        node.kill(old)
        c = collector(node)
        assert victims(c.collect()) == {}
        other = f"{SYSTEMD_POD}/cri-containerd-{CID2}.scope"
        node.kill(other, task="x")
        assert {k: v["kills"] for k, v in victims(c.collect()).items()} == {other: 1.0}
        node.kill(old)
        assert {k: v["kills"] for k, v in victims(c.collect()).items()} == {other: 1.0, old: 1.0}


def test_a_sweep_looks_no_further_while_the_hosts_count_stands_still(tmp_path: Path) -> None:
    """The cgroups are read only when /proc/vmstat's oom_kill moved: a malformed counter file is not even noticed
    until then, and is then a counted error, logged once, while the rest of the look goes on."""
    node = Node(tmp_path, 2)
    good, bad = node.cgroup("/system.slice/a.service"), node.cgroup("/system.slice/b.service")
    c = collector(node)
    c.collect()
    node.kill("/system.slice/a.service")
    c.collect()
    (bad / "memory.events").write_text("low 0\noom_kill lots\n")
    (node.root / "system.slice" / "memory.events").write_text(V2_EVENTS.format(n=1))
    for _ in range(3):
        fams = c.collect()
    assert value(fams, "outrider_oom_scans_total") == 1 and c.errors == 0
    node.kill("/system.slice/a.service")
    fams = c.collect()
    assert value(fams, "outrider_oom_scans_total") == 2
    assert victims(fams)["/system.slice/a.service"]["kills"] == 2
    assert c.errors == 1
    assert good.exists()


def test_unreadable_and_broken_sources_are_counted_and_the_look_goes_on(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path, 2)
    container = f"{SYSTEMD_POD}/cri-containerd-{CID}.scope"
    node.cgroup(container)
    node.cgroup("/system.slice/a.service")
    (node.host / "var" / "log").mkdir(parents=True)
    (node.host / "var" / "log" / "pods").write_text("not a directory")
    with node.kmsg.open("a") as fh:
        fh.write("garbage without a separator\n4,9,x;oom-kill:task=,pid=z\n")
    c = collector(node)
    c.collect()
    node.kill(container)
    node.kill("/system.slice/a.service", task="worker")
    seen = victims(c.collect())
    assert seen[container]["victim"] == f"python3 in pod {UID}, container {CID[:12]}", "named as far as it can"
    assert seen["/system.slice/a.service"]["victim"] == "worker in cgroup /system.slice/a.service"
    assert c.errors == 1
    node.kill(f"{SYSTEMD_POD}/cri-containerd-{CID2}.scope")
    c.collect()
    assert c.errors == 2
    assert sum("pod logs unreadable" in r.message for r in caplog.records) == 1, "logged once"


def test_the_agents_own_cgroup_is_left_to_the_host_collector(tmp_path: Path) -> None:
    """v2: the agent's cgroup and those below it (its memory.events counts them); v1: its own processes only."""
    own = "/kubepods/burstable/pod" + UID + "/" + CID
    for version in (2, 1):
        node = Node(tmp_path / str(version), version, own=own)
        node.cgroup(own)
        c = collector(node)
        c.collect()
        node.kill(own)
        node.kill(own + "/worker")
        fams = c.collect()
        assert list(victims(fams)) == ([] if version == 2 else [own + "/worker"])
        assert value(fams, "outrider_oom_unattributed_kills_total", "unnamed") == 0


def test_inside_a_cgroup_namespace_nothing_else_is_claimed(tmp_path: Path) -> None:
    """A sidecar's view (its cgroup namespace): the host's count is every pod's, so nothing unattributed, and the
    kernel log's paths are the host's (not read)."""
    node = Node(tmp_path, 2, own="/", kernel_root=False)
    c = collector(node)
    fams = c.collect()
    node.kill("/other", counted=False)
    fams = c.collect()
    assert victims(fams) == {} and value(fams, "outrider_oom_unattributed_kills_total", "unnamed") == 0
    assert not any(f.defn.name == "outrider_oom_kernel_log_readable" for f in fams)


def test_a_logged_kill_whose_count_came_later_is_named_at_the_next_look(tmp_path: Path) -> None:
    """The kernel logs the summary before it counts the kill: a look between the two keeps the line for the next."""
    node = Node(tmp_path, 2)
    c = collector(node)
    c.collect()
    node.kill("/a.slice/first.service", task="first")
    node.kill("/a.slice/second.service", task="second", counted=False, host=False)  # logged, not yet counted
    assert {v["victim"] for v in victims(c.collect()).values()} == {"first in cgroup /a.slice/first.service"}
    node.kill("/a.slice/second.service", logged=False)  # now counted
    seen = victims(c.collect())
    assert seen["/a.slice/second.service"]["victim"] == "second in cgroup /a.slice/second.service"
    assert value(c.collect(), "outrider_oom_unattributed_kills_total", "unnamed") == 0


def test_a_count_read_before_the_hosts_caught_up_is_no_unattributed_kill(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    c = collector(node)
    c.collect()
    node.kill("/a.slice/one.service")
    node.kill("/a.slice/two.service", host=False)  # the cgroup's count is there, the host's not yet
    assert len(victims(c.collect())) == 2
    node.host_kills += 1
    (node.proc / "vmstat").write_text(VMSTAT.format(n=node.host_kills))
    fams = c.collect()
    assert value(fams, "outrider_oom_unattributed_kills_total", "unnamed") == 0
    assert value(fams, "outrider_oom_scans_total") == 2


def test_a_kill_in_the_root_cgroup_is_unattributed(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    c = collector(node, kmsg_path="")
    c.collect()
    node.kill("/", counted=False)  # the v2 root has no counter
    assert value(c.collect(), "outrider_oom_unattributed_kills_total", "unnamed") == 1


def test_victims_are_bounded_and_forgotten_an_hour_after_their_last_kill(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oom_module, "MAX_VICTIMS", 3)
    node = Node(tmp_path, 2)
    clock = [0.0]
    c = collector(node, clock)
    c.collect()
    for i in range(5):
        node.kill(f"/jobs.slice/job-{i}.service", task=f"job{i}", pid=1000 + i)
    fams = c.collect()
    assert len(victims(fams)) == 3
    assert value(fams, "outrider_oom_unattributed_kills_total", "cap") == 2
    clock[0] = 1800.0
    node.kill("/jobs.slice/job-0.service")
    assert victims(c.collect())["/jobs.slice/job-0.service"]["kills"] == 2
    clock[0] = 3601.0
    assert list(victims(c.collect())) == ["/jobs.slice/job-0.service"], "the others' last kill was an hour ago"
    clock[0] = 5401.0
    assert victims(c.collect()) == {}


def test_a_systemd_service_recreated_under_the_same_path_counts_from_zero(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    service = "/system.slice/data-sync.service"
    c = collector(node, kmsg_path="")  # the counters alone (the log would name the service whatever they say)
    c.collect()
    node.kill(service, task="rsync")
    c.collect()
    # restarted: a new cgroup counting from 0 (kernfs never hands the old one's inode number out again: the old
    # directory is kept alive elsewhere until the new one exists, so that this filesystem cannot reuse it either)
    old = node.root / "system.slice" / "data-sync.service"
    old.rename(tmp_path / "old-service")
    node.cgroup(service)
    shutil.rmtree(tmp_path / "old-service")
    node.kill(service, task="rsync")
    fams = c.collect()
    assert victims(fams)[service]["kills"] == 2
    assert "/system.slice" not in victims(fams)
    assert value(fams, "outrider_oom_unattributed_kills_total", "unnamed") == 0


def test_a_kernel_without_oom_kill_counters_is_said_once_and_fails_nothing(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path, 2)
    (node.proc / "vmstat").write_text("nr_free_pages 3022136\npgfault 912733245\n")
    c = collector(node)
    assert c.collect() == [] and c.collect() == []
    assert sum("has no oom_kill" in r.message for r in caplog.records) == 1


def test_the_rule_tests_victim_series_are_the_ones_this_collector_writes(tmp_path: Path) -> None:
    """Every victim series alerts/tests/memory.test.yaml feeds HostOOMKills, rebuilt from its own labels as a kill on
    a fixture node (its cgroup, the kubelet's logs of its pod, the kernel log's process), comes out of the collector
    with exactly those labels and values, the scrape's target labels aside."""
    doc = yaml.safe_load((REPO / "alerts" / "tests" / "memory.test.yaml").read_text())
    fed = [dict(parse_series(s["series"])[1]) for case in doc["tests"] for s in case.get("input_series") or []
           if s["series"].startswith("outrider_oom_victim_kills_total{")]
    assert len(fed) >= 4
    node = Node(tmp_path, 2)
    for labels in fed:
        node.cgroup(labels["cgroup"])
        if labels.get("exported_pod"):
            node.pod_logs(labels["exported_namespace"], labels["exported_pod"], labels["pod_uid"],
                          {labels["exported_container"]: labels["container_id"]})
    c = collector(node)
    c.collect()
    for pid, labels in enumerate(fed, 100):
        node.kill(labels["cgroup"], task=labels["process"], pid=pid)
    written = {k: {name: v for name, v in row.items() if name != "kills" and v != ""}
               for k, row in victims(c.collect()).items()}
    assert written == {lb["cgroup"]: {k: v for k, v in lb.items() if k not in TARGET_LABELS} for lb in fed}
