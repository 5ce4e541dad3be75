"""The oom collector's edges on fixture nodes (tests/fakes/cgroup_node.py): what it says when a source is missing or
unreadable, word for word; the agent's own subtree against the kernel log's records; kills that share a look
(a pod and its container, two in one cgroup, one logged and one not); counts kept across looks for cgroups removed
since; names that end in the characters a path is trimmed of. tests/collectors/test_oom_collector.py has the
layouts and the attribution rules."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from outrider.collectors import oom as oom_module
from tests.collectors.test_oom_collector import CID, UID, collector, value, victims
from tests.fakes.cgroup_node import V2_EVENTS, VMSTAT, Node

POD = f"/kubepods/burstable/pod{UID}"


def messages(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_no_memory_hierarchy_is_said_once_and_only_the_hosts_count_is_left(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path, 2)
    empty = tmp_path / "nosys"
    empty.mkdir()
    c = collector(node, sys_root=str(empty))
    with caplog.at_level(logging.WARNING):
        c.collect()
        node.kill("/a.service")
        fams = c.collect()
    assert messages(caplog) == [f"oom: no memory cgroup hierarchy under {empty}/fs/cgroup: OOM kills are counted "
                                "host-wide only (outrider_host_oom_kills_total)"]
    assert victims(fams) == {} and value(fams, "outrider_oom_scans_total") == 0


def test_an_unreadable_kernel_log_is_said_with_its_error_and_a_readable_one_is_not(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path, 2)
    missing = tmp_path / "no-kmsg"
    with caplog.at_level(logging.WARNING):
        collector(node).collect()
        assert messages(caplog) == []
        fams = collector(node, kmsg_path=str(missing)).collect()
    assert messages(caplog) == [
        f"oom: the kernel log {missing} is not readable ([Errno 2] No such file or directory: '{missing}'): OOM "
        "victims are named by their cgroup, without the killed process's name"]
    assert value(fams, "outrider_oom_kernel_log_readable") == 0


def test_an_unreadable_own_cgroup_is_counted_and_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path, 2)
    (node.proc / "self" / "cgroup").unlink()
    (node.proc / "self" / "cgroup").mkdir()
    c = collector(node)
    with caplog.at_level(logging.WARNING):
        c.collect()
    assert c.errors == 1
    [said] = messages(caplog)
    assert said.startswith("oom: dropped reading own cgroup unreadable: [Errno 21] Is a directory")
    node.kill("/a.service")
    assert list(victims(c.collect())) == ["/a.service"], "the look goes on without it"


def test_each_kill_and_the_cap_are_logged_as_they_say(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oom_module, "MAX_VICTIMS", 1)
    node = Node(tmp_path, 2)
    c = collector(node)
    c.collect()
    with caplog.at_level(logging.INFO):
        node.kill("/a.service", task="trainer")
        c.collect()
        node.kill("/b.service", task="loader")
        node.kill("/c.service", task="loader")
        c.collect()
    assert messages(caplog, logging.INFO) == ["OOM kill: trainer in cgroup /a.service (memory cgroup /a.service)"]
    assert messages(caplog) == ["oom: more than 1 OOM victims within 3600 s: the kills of the others are counted in "
                                'outrider_oom_unattributed_kills_total{reason="cap"}']


def test_a_malformed_counter_is_said_with_its_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path, 2)
    bad = node.cgroup("/b.service")
    c = collector(node)
    c.collect()
    (bad / "memory.events").write_text("oom_kill lots\n")
    node.kill("/a.service")
    with caplog.at_level(logging.WARNING):
        c.collect()
    [said] = messages(caplog)
    assert said == ("oom: dropped reading cgroup counter unreadable or malformed: invalid literal for int() with "
                    "base 10: 'lots' (logged once; counted in outrider_collector_errors_total)")


def test_close_closes_the_kernel_log_and_a_collector_without_one(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    c = collector(node)
    c.collect()
    kmsg = c._kmsg
    assert kmsg is not None and kmsg._fd is not None
    c.close()
    assert kmsg._fd is None
    collector(node, kmsg_path="").close()


def test_victims_named_without_the_kubelets_logs(tmp_path: Path) -> None:
    node = Node(tmp_path, 2, own="/elsewhere")
    docker = f"/system.slice/docker-{CID}.scope"
    c = collector(node)
    c.collect()
    node.kill(POD, task="pause")
    node.kill(docker, task="redis")
    seen = victims(c.collect())
    assert seen[POD]["victim"] == f"pause in pod {UID}"
    assert seen[docker]["victim"] == f"redis in container {CID[:12]}"


def test_the_kernel_logs_records_of_the_agents_own_subtree_are_never_matched_elsewhere(tmp_path: Path) -> None:
    """v2: the agent's cgroup and those below it are the host collector's; their logged kills wait for no count
    here, and never take one of an ancestor's."""
    own = f"{POD}/{CID}"
    node = Node(tmp_path, 2, own=own)
    node.cgroup(own)
    c = collector(node)
    c.collect()
    node.kill(own, task="agent")
    node.kill(own + "/worker", task="helper")
    assert victims(c.collect()) == {}
    node.kill(POD, task="pause")
    seen = victims(c.collect())
    assert {k: (v["process"], v["kills"]) for k, v in seen.items()} == {POD: ("pause", 1.0)}


def test_in_a_cgroup_namespace_every_counted_kill_is_the_agents_own(tmp_path: Path) -> None:
    node = Node(tmp_path, 2, own="/", kernel_root=False)
    c = collector(node)
    c.collect()
    node.kill("/other")
    assert victims(c.collect()) == {}


def test_kills_that_share_a_look(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    container = f"{POD}/{CID}"
    c = collector(node)
    c.collect()
    node.kill(POD, task="pause")
    node.kill(container, task="python3")
    node.kill("/a.service", task="worker")
    node.kill("/a.service", logged=False)
    seen = victims(c.collect())
    assert {k: v["kills"] for k, v in seen.items()} == {POD: 1.0, container: 1.0, "/a.service": 2.0}
    assert seen["/a.service"]["process"] == "worker"


def test_a_logged_kill_not_counted_yet_holds_back_none_logged_after_it(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    c = collector(node)
    c.collect()
    node.kill("/a.slice/late.service", task="late", counted=False, host=False)
    node.kill("/a.slice/now.service", task="now")
    seen = victims(c.collect())
    assert seen["/a.slice/now.service"]["victim"] == "now in cgroup /a.slice/now.service"


def test_unattributed_kills_add_up_look_after_look(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    c = collector(node, kmsg_path="")
    c.collect()
    node.kill("/", counted=False)
    c.collect()
    node.kill("/", counted=False)
    assert value(c.collect(), "outrider_oom_unattributed_kills_total", "unnamed") == 2


def test_a_cgroup_removed_after_its_kills_were_kept_is_forgotten_with_those_below(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    job = "/batch.slice/job.scope"
    c = collector(node)
    c.collect()
    node.kill(job + "/step", task="step")
    c.collect()
    node.remove("/batch.slice")
    node.kill("/a.service", task="worker")
    seen = victims(c.collect())
    assert seen["/a.service"]["kills"] == 1 and seen[job + "/step"]["kills"] == 1
    assert c.errors == 0


@pytest.mark.parametrize("version", [1, 2])
def test_a_cgroup_whose_name_ends_in_x_keeps_its_name(tmp_path: Path, version: int) -> None:
    node = Node(tmp_path, version)
    c = collector(node, kmsg_path="")
    c.collect()
    node.kill("/jobX/a.service")
    assert list(victims(c.collect())) == ["/jobX/a.service"]


def test_a_link_to_a_cgroup_is_not_walked_as_another(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    node.cgroup("/system.slice/a.service")
    os.symlink(node.root / "system.slice", node.root / "link.slice")
    c = collector(node, kmsg_path="")
    c.collect()
    node.kill("/system.slice/a.service")
    assert list(victims(c.collect())) == ["/system.slice/a.service"]


def test_a_directory_without_counters_is_no_cgroup_to_count(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    (node.root / "plain").mkdir()
    c = collector(node, kmsg_path="")
    c.collect()
    node.kill("/a.service")
    assert list(victims(c.collect())) == ["/a.service"] and c.errors == 0


def refuse_listing(monkeypatch: pytest.MonkeyPatch, refused: str) -> None:
    """os.scandir of `refused` fails as it does for an agent without the right to list it (root lists anything)."""
    listing = os.scandir

    def scandir(path: str) -> object:
        if str(path) == refused:
            raise PermissionError(13, "Permission denied", path)
        return listing(path)

    monkeypatch.setattr(oom_module.os, "scandir", scandir)


def unlistable(refused: str) -> str:
    return (f"oom: dropped reading cgroup directory unreadable: [Errno 13] Permission denied: '{refused}' (logged "
            "once; counted in outrider_collector_errors_total)")


def test_v1_keeps_the_counts_below_a_directory_it_cannot_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path, 1)
    deep = "/batch.slice/job.scope/step"
    c = collector(node, kmsg_path="")
    c.collect()
    node.kill(deep)
    c.collect()
    refused = str(node.root / "batch.slice" / "job.scope")
    with monkeypatch.context() as m:
        refuse_listing(m, refused)
        node.kill("/a.service")
        with caplog.at_level(logging.WARNING):
            c.collect()
    assert c.errors == 1 and messages(caplog) == [unlistable(refused)]
    node.kill(deep)
    fams = c.collect()
    assert victims(fams)[deep]["kills"] == 2, "its count was kept while it could not be reached: one kill, not two"
    assert value(fams, "outrider_oom_unattributed_kills_total", "unnamed") == 0


def test_v2_counts_a_kill_below_a_directory_it_cannot_list_as_unnamed(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path, 2)
    c = collector(node, kmsg_path="")
    c.collect()
    refused = str(node.root)
    refuse_listing(monkeypatch, refused)
    node.kill("/a.service")
    with caplog.at_level(logging.WARNING):
        fams = c.collect()
    assert c.errors == 1 and messages(caplog) == [unlistable(refused)]
    assert victims(fams) == {} and value(fams, "outrider_oom_unattributed_kills_total", "unnamed") == 1


def test_a_kernel_without_the_hosts_count_is_said_word_for_word(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path, 2)
    (node.proc / "vmstat").write_text("nr_free_pages 3022136\n")
    with caplog.at_level(logging.WARNING):
        collector(node).collect()
    assert messages(caplog) == [f"oom: {node.proc}/vmstat has no oom_kill (a kernel before 4.13): OOM kills are not "
                                "counted"]


def test_a_host_count_that_went_back_is_taken_as_counted_from_zero(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    c = collector(node, kmsg_path="")
    node.host_kills = 5
    (node.proc / "vmstat").write_text(VMSTAT.format(n=5))
    c.collect()
    node.host_kills = 0
    node.kill("/", counted=False)  # the host's count reads 1: less than the 5 of the last look
    assert value(c.collect(), "outrider_oom_unattributed_kills_total", "unnamed") == 1


def test_without_a_kernel_log_or_a_hierarchy_its_readability_is_not_said(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    for c in (collector(node, kmsg_path=""), collector(node, sys_root=str(tmp_path / "nosys"))):
        fams = c.collect()
        assert not any(f.defn.name == "outrider_oom_kernel_log_readable" for f in fams)
        assert c._kmsg is None or c._kmsg._fd is None


def test_a_victim_is_kept_for_exactly_its_hour(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    clock = [100.0]
    c = collector(node, clock)
    c.collect()
    node.kill("/a.service")
    c.collect()
    clock[0] = 100.0 + oom_module.VICTIM_TTL_S
    assert list(victims(c.collect())) == ["/a.service"]
    clock[0] += 0.5
    assert victims(c.collect()) == {}


def test_a_v1_cgroup_named_by_the_log_alone_counts_its_one_kill(tmp_path: Path) -> None:
    node = Node(tmp_path, 1)
    gone = f"{POD}/{CID}"
    node.cgroup(gone)
    c = collector(node)
    c.collect()
    node.kill(gone, task="loader")
    node.remove(gone)
    assert victims(c.collect())[gone]["kills"] == 1


def test_a_v1_cgroup_recreated_under_the_same_path_counts_from_zero(tmp_path: Path) -> None:
    node = Node(tmp_path, 1)
    service = "/system.slice/data-sync.service"
    c = collector(node, kmsg_path="")
    c.collect()
    node.kill(service)
    c.collect()
    old = node.root / "system.slice" / "data-sync.service"
    old.rename(tmp_path / "old-service")  # kept alive until the new one exists: another inode
    node.cgroup(service)
    node.kill(service)
    assert victims(c.collect())[service]["kills"] == 2


def test_the_kubelets_logs_are_read_under_the_host_root_or_else_slash(tmp_path: Path) -> None:
    node = Node(tmp_path, 2)
    assert collector(node)._pods.pods_dir == f"{node.host}/var/log/pods"
    assert collector(node, host_root="")._pods.pods_dir == "/var/log/pods"


def test_unreadable_pod_logs_are_said_with_their_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path, 2)
    (node.host / "var" / "log").mkdir(parents=True)
    (node.host / "var" / "log" / "pods").write_text("not a directory")
    c = collector(node, kmsg_path="")
    c.collect()
    node.kill(f"{POD}/{CID}")
    with caplog.at_level(logging.WARNING):
        c.collect()
    assert messages(caplog) == [f"oom: dropped reading pod logs unreadable: [Errno 20] Not a directory: "
                                f"'{node.host}/var/log/pods' (logged once; counted in outrider_collector_errors_total)"]


def test_a_kernel_log_that_fails_mid_run_is_counted_once_and_said(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path, 2)
    c = collector(node)
    c.collect()
    assert c._kmsg is not None and c._kmsg._fd is not None
    directory = os.open(tmp_path, os.O_RDONLY)
    os.dup2(directory, c._kmsg._fd)  # its next read fails as a device's read can (EISDIR here)
    os.close(directory)
    node.kill("/a.service")
    with caplog.at_level(logging.WARNING):
        fams = c.collect()
    assert c.errors == 1 and value(fams, "outrider_oom_kernel_log_readable") == 0
    assert messages(caplog) == ["oom: dropped reading kmsg: [Errno 21] Is a directory (logged once; counted in "
                                "outrider_collector_errors_total)"]
    node.kill("/a.service")
    c.collect()
    assert c.errors == 1, "counted when it starts failing, not at each look"


def test_a_counter_gone_or_reset_and_back_counts_from_zero(tmp_path: Path) -> None:
    """A cgroup whose memory controller was turned off and on again: its counter is gone for a while (a) or just
    starts again from 0 (c)."""
    node = Node(tmp_path, 2)
    a, c_path = node.cgroup("/a.service"), node.cgroup("/c.service")
    c = collector(node, kmsg_path="")
    c.collect()
    node.kill("/a.service")
    node.kill("/c.service")
    c.collect()
    (a / "memory.events").unlink()
    (c_path / "memory.events").write_text(V2_EVENTS.format(n=0))
    node.kill("/b.service")
    c.collect()
    for path in (a, c_path):
        (path / "memory.events").write_text(V2_EVENTS.format(n=2))
    node.host_kills += 4
    (node.proc / "vmstat").write_text(VMSTAT.format(n=node.host_kills))
    seen = victims(c.collect())
    assert (seen["/a.service"]["kills"], seen["/c.service"]["kills"]) == (3, 3)


def test_the_agents_own_kills_are_never_taken_for_unnamed_ones_whatever_its_siblings(tmp_path: Path) -> None:
    own = f"{POD}/agent"
    node = Node(tmp_path, 2, own=own)
    siblings = [f"{POD}/sibling-{i}" for i in range(12)]  # made before and after the agent's: listed around it
    for s in siblings[:6]:
        node.cgroup(s)
    node.cgroup(own)
    for s in siblings[6:]:
        node.cgroup(s)
    c = collector(node, kmsg_path="")
    c.collect()
    node.kill(own)
    for s in siblings:
        node.kill(s)
    fams = c.collect()
    assert value(fams, "outrider_oom_unattributed_kills_total", "unnamed") == 0
    assert sorted(victims(fams)) == sorted(siblings)
