"""The sidecar pod as the chart's training-Job example renders it, run by tests/container/kubelet.py: one PID
namespace (shareProcessNamespace), the spool emptyDir in both containers with OUTRIDER_SPOOL_DIR, the sidecar as
uid 65532 with a read-only root and no capabilities. The workload is an instrumented Python loop (the hook
pip-installed from the agent's wheel into a bare Python image) in place of the example's trainer image.

The sidecar's /metrics shows the workload's steps while it runs; when the workload exits the pod ends: as a
native sidecar, stopped with SIGTERM once the trainer has exited (what the kubelet does), and as an ordinary
container (sidecar.native=false), by itself; either way exit 0 after a final sweep and OTLP flush that carry the
last values (the periodic export is hours apart, so only that flush can carry them)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.container.chart import configmaps, pod_spec, render
from tests.container.conftest import FIGURES
from tests.container.kubelet import Kubelet, Override
from tests.container.podman import Podman
from tests.helpers import free_port, http_get, samples, value, wait_until
from tests.servers import OtlpHttpReceiver, otlp_points

pytestmark = pytest.mark.container
STEPS = 40


def _otlp_value(receiver: OtlpHttpReceiver, name: str) -> float | None:
    points = otlp_points(receiver.requests).get(name, [])
    return points[-1][1].as_double or points[-1][1].as_int if points else None


def _pod_containers(podman: Podman, pod: str) -> dict[str, str]:
    """The state of each of the pod's containers, by its name in the pod spec (the infra container, which holds
    the namespaces as a Kubernetes pod's pause container does, left out)."""
    import json

    info = json.loads(podman("pod", "inspect", pod))
    info = info[0] if isinstance(info, list) else info
    return {c["Name"].rsplit("-", 1)[-1]: c["State"] for c in info["Containers"]
            if c["Id"] != info["InfraContainerID"]}


def training_pod(image: str, native: bool, otlp_endpoint: str = "", **sidecar: Any) -> list[dict[str, Any]]:
    """The chart's training-Job example, rendered: the sidecar native or not (with `sidecar` values besides)."""
    return render(image, {
        "nodeAgent": {"enabled": False}, "dashboards": {"enabled": False}, "examples": {"trainingJob": True},
        "sidecar": {"native": native, **sidecar},
        "config": {"interval_s": 1, "rule_files": []},
        **({"otlp": {"endpoint": otlp_endpoint, "intervalSeconds": 3600}} if otlp_endpoint else {})})


def run_training_pod(podman: Podman, image: str, workload_image: str, tmp_path: Path, native: bool,
                     workload_uid: int | None = None, fs_group: int | None = None,
                     steps_timeout_s: float = 120, workload_env: dict[str, str] | None = None,
                     **sidecar: Any) -> dict[str, Any]:
    with OtlpHttpReceiver() as receiver:
        docs = training_pod(image, native, receiver.endpoint, **sidecar)
        spec = pod_spec(docs, "Job")
        if fs_group is not None:
            spec["securityContext"]["fsGroup"] = fs_group
        sidecar = next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "outrider")
        trainer = next(c for c in spec["containers"] if c["name"] == "trainer")
        assert (sidecar in spec.get("initContainers", [])) is native
        control = tmp_path / "control"
        control.mkdir()
        control.chmod(0o777)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        kubelet = Kubelet(podman, tmp_path, configmaps(docs))
        pod = kubelet.create_pod(spec)
        side = kubelet.create(spec, sidecar, Override(env={"OUTRIDER_LISTEN": f"127.0.0.1:{port}"}), pod)
        work = kubelet.create(spec, trainer, Override(
            image=workload_image, command=["/opt/workload/bin/python", "/opt/workload/workload.py"],
            env={"WORKLOAD_STEPS": str(STEPS), **(workload_env or {})}, mounts=[f"{control}:/control:rw"],
            run_as_user=workload_uid), pod)

        def sidecar_alive() -> None:
            assert podman.exit_code(side) is None, f"the sidecar exited:\n{podman.logs(side)}"

        podman("start", side)
        if native:  # the kubelet starts the containers once a native sidecar's startup probe passes
            wait_until(lambda: sidecar_alive() or http_get(url + "/readyz", timeout_s=2)[0] == 200,
                       timeout_s=90, interval_s=0.5, what="the sidecar's startup probe (/readyz)")
        podman("start", work)

        def steps_on_metrics() -> float | None:
            sidecar_alive()
            return value(samples(http_get(url + "/metrics", timeout_s=5)[2].decode()),
                         "outrider_train_steps_total", rank="")

        try:
            try:
                wait_until(lambda: steps_on_metrics() == STEPS, timeout_s=steps_timeout_s, interval_s=0.5,
                           what=f"the workload's {STEPS} steps on the sidecar's /metrics")
            except AssertionError as e:
                raise AssertionError(f"{e}\nsidecar:\n{podman.logs(side)}\nworkload:\n{podman.logs(work)}") from None
            text = http_get(url + "/metrics")[2].decode()
            running = {
                "steps": value(samples(text), "outrider_train_steps_total", rank=""),
                "samples": value(samples(text), "outrider_samples_total", rank=""),
                "processes": value(samples(text), "outrider_hook_processes", state="running"),
                "process_names": {dict(labels)["name"] for (name, labels) in samples(text)
                                  if name == "outrider_process_threads"}}
        finally:
            (control / "go").touch()
        t_go = time.monotonic()
        wait_until(lambda: podman.exit_code(work) is not None, timeout_s=120, what="the workload to exit")
        if native:  # the main containers are done: the kubelet stops the sidecars with SIGTERM
            podman("stop", "--time", "30", side, timeout_s=120)
        wait_until(lambda: podman.exit_code(side) is not None, timeout_s=120, interval_s=0.5,
                   what="the sidecar to end with the workload")
        ended_after_s = time.monotonic() - t_go
        return {
            **running,
            "workload_uid": int((control / "uid").read_text()),
            "workload_exit": podman.exit_code(work), "sidecar_exit": podman.exit_code(side),
            "pod_containers": _pod_containers(podman, pod),
            "sidecar_log": podman.logs(side),
            "otlp_steps": _otlp_value(receiver, "outrider.train.steps"),
            "otlp_samples": _otlp_value(receiver, "outrider.samples"),
            "otlp_exports": len(receiver.requests),
            "shards_left": sorted(p.name for p in kubelet.volume_dirs["outrider-spool"].glob("*.shard")),
            "ended_after_s": ended_after_s,
        }


@pytest.mark.parametrize("native", [True, False], ids=["native-sidecar", "exits-with-the-workload"])
def test_sidecar_pod_exports_the_workloads_steps_and_ends_with_it(
        podman: Podman, built: dict[str, str], workload_image: str, tmp_path: Path, native: bool) -> None:
    r = run_training_pod(podman, built["IMAGE"], workload_image, tmp_path, native)
    assert r["workload_uid"] == 65532, "the trainer ran as the example pod's user"
    assert r["steps"] == STEPS and r["samples"] == 8 * STEPS and r["processes"] == 1
    assert "python" in r["process_names"], f"one PID namespace: the sidecar sees the trainer {r['process_names']}"
    assert r["workload_exit"] == 0
    assert r["sidecar_exit"] == 0, r["sidecar_log"]
    assert r["pod_containers"] == {"outrider": "exited", "trainer": "exited"}, "the pod has ended"
    if not native:
        assert "the workload is gone" in r["sidecar_log"], "it left by itself, not by a signal"
    assert r["otlp_steps"] == STEPS and r["otlp_samples"] == 8 * STEPS, "the last values were flushed"
    assert r["shards_left"] == [], "the workload's closed shard was read and removed"
    FIGURES.append(f"sidecar pod ({'native sidecar' if native else 'exits with the workload'}): {STEPS} steps "
                   f"on /metrics, pod ended {r['ended_after_s']:.1f} s after the trainer was let go, "
                   f"{r['otlp_exports']} OTLP exports, the last with steps={r['otlp_steps']:.0f}")


def test_a_workload_of_another_uid_is_seen_by_the_sidecar(
        podman: Podman, built: dict[str, str], workload_image: str, tmp_path: Path) -> None:
    r = run_training_pod(podman, built["IMAGE"], workload_image, tmp_path, native=True, workload_uid=1000,
                         fs_group=65532, steps_timeout_s=30)
    assert r["workload_uid"] == 1000
    assert r["steps"] == STEPS and r["otlp_steps"] == STEPS
    assert r["sidecar_exit"] == 0 and set(r["pod_containers"].values()) == {"exited"}


def test_a_legacy_sidecar_waits_for_a_trainer_still_starting_past_its_startup_grace(
        podman: Podman, built: dict[str, str], workload_image: str, tmp_path: Path) -> None:
    """Sharing the pod's PID namespace, the agent sees the trainer's process before it publishes anything (here:
    12 s of imports and data loading before instrument(), past a 5 s startup grace): the workload has started, and
    the agent stays for its steps, then ends with it."""
    r = run_training_pod(podman, built["IMAGE"], workload_image, tmp_path, native=False,
                         workload_env={"WORKLOAD_START_DELAY_S": "12"}, startupGraceSeconds=5)
    assert r["steps"] == STEPS and r["otlp_steps"] == STEPS, r["sidecar_log"]
    assert r["sidecar_exit"] == 0 and "the workload is gone" in r["sidecar_log"], r["sidecar_log"]


def test_a_legacy_sidecar_whose_trainer_was_killed_at_once_ends_the_pod_after_its_startup_grace(
        podman: Podman, built: dict[str, str], workload_image: str, tmp_path: Path) -> None:
    """The kubelet starts a pod's containers in order, the legacy sidecar after the trainer; a trainer SIGKILLed in
    its first second is gone before the agent's first look and never published. The chart's startup grace for the
    legacy sidecar (sidecar.startupGraceSeconds, 30 s), not the agent's 15-minute default, ends the pod."""
    docs = training_pod(built["IMAGE"], native=False)
    spec = pod_spec(docs, "Job")
    sidecar, trainer = spec["containers"][-1], spec["containers"][0]
    assert (sidecar["name"], trainer["name"]) == ("outrider", "trainer"), "the sidecar after the workload"
    grace = float(next(e["value"] for e in sidecar["env"] if e["name"] == "OUTRIDER_STARTUP_GRACE_S"))
    kubelet = Kubelet(podman, tmp_path, configmaps(docs))
    pod = kubelet.create_pod(spec)
    port = free_port()
    work = kubelet.create(spec, trainer, Override(
        image=workload_image, command=["/opt/workload/bin/python", "/opt/workload/workload.py"],
        env={"WORKLOAD_KILLED_AT_ONCE": "1"}), pod)
    side = kubelet.create(spec, sidecar, Override(env={"OUTRIDER_LISTEN": f"127.0.0.1:{port}"}), pod)
    podman("start", work)
    wait_until(lambda: podman.exit_code(work) is not None, timeout_s=60, what="the trainer killed at once")
    assert podman.exit_code(work) == 137
    started = time.monotonic()
    podman("start", side)
    wait_until(lambda: podman.exit_code(side) is not None, timeout_s=grace + 90, interval_s=0.5,
               what=f"the sidecar to end within its startup grace ({grace:g} s), not 15 minutes")
    ended_after_s = time.monotonic() - started
    log = podman.logs(side)
    assert podman.exit_code(side) == 0, log
    assert f"no workload appeared within startup_grace_s ({grace:g} s)" in log, log
    assert ended_after_s >= grace, "it waited its startup grace: a trainer listed after it would have been seen"
    FIGURES.append(f"legacy sidecar, trainer SIGKILLed at once: pod ended {ended_after_s:.0f} s after the sidecar "
                   f"started (startup grace {grace:g} s; the agent's default is 900 s)")
