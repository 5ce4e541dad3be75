"""A stand-in for the kubelet: runs a pod spec rendered by the chart with podman, so the container tests run what
the chart says (user, read-only root, dropped capabilities, no privilege escalation, env, args, volumes, host
network and PID namespaces), not a hand-written approximation of it.

What it covers is what the chart uses: emptyDir volumes (a directory of the test's, 0777 as the kubelet makes them,
group fsGroup and setgid when the pod has one), configMap volumes (from the rendered ConfigMaps, subPath
included), hostPath volumes (bind mounts, HostToContainer as rslave), downwardAPI volumes (the pod's name,
namespace and annotations as the kubelet writes them: `key="value"` lines), env values and Downward API fields;
shareProcessNamespace (a podman pod sharing its PID namespace), hostNetwork, hostPID, native sidecars (init
containers with restartPolicy Always: started first, their startup probe awaited, stopped with SIGTERM once the
main containers have exited, as the kubelet does). Anything else in a spec is an error, not silently dropped.
Probes are the test's to poll; no image is pulled.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.container.podman import Podman

POD_NAME, NAMESPACE, NODE_NAME = "outrider-test-pod", "monitoring", "test-node"
FIELDS = {"metadata.name": POD_NAME, "metadata.namespace": NAMESPACE, "spec.nodeName": NODE_NAME}
HANDLED_CONTAINER_KEYS = {"name", "image", "imagePullPolicy", "command", "args", "env", "ports", "resources",
                          "securityContext", "volumeMounts", "startupProbe", "readinessProbe", "livenessProbe",
                          "restartPolicy"}
HANDLED_POD_KEYS = {"containers", "initContainers", "volumes", "securityContext", "shareProcessNamespace",
                    "hostNetwork", "hostPID", "dnsPolicy", "automountServiceAccountToken", "restartPolicy",
                    "priorityClassName", "runtimeClassName", "nodeSelector", "tolerations", "affinity"}


@dataclass
class Override:
    """What a test changes in a rendered container: its image and command (the workload), env values (a free
    port on the host network), extra bind mounts (the test's control directory), its user."""

    image: str | None = None
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[str] = field(default_factory=list)
    run_as_user: int | None = None


class Kubelet:
    def __init__(self, podman: Podman, workdir: Path, configmaps: dict[str, dict[str, str]],
                 annotations: dict[str, str] | None = None) -> None:
        self.podman = podman
        self.workdir = workdir
        self.configmaps = configmaps
        self.annotations = annotations or {}  # the pod's (its template's metadata.annotations)
        self.volume_dirs: dict[str, Path] = {}

    # --- volumes ---------------------------------------------------------------------------------------------
    def _volume(self, spec: dict[str, Any], name: str) -> dict[str, Any]:
        return next(v for v in spec.get("volumes", []) if v["name"] == name)

    def _mount(self, pod: dict[str, Any], m: dict[str, Any]) -> str:
        volume = self._volume(pod, m["name"])
        ro = m.get("readOnly", False)
        options = ["ro" if ro else "rw"]
        if "emptyDir" in volume:
            source = self.empty_dir(pod, m["name"])
        elif "configMap" in volume:
            data = self.configmaps[volume["configMap"]["name"]]
            source = self.workdir / "configmaps" / m["name"]
            source.mkdir(parents=True, exist_ok=True)
            for key, text in data.items():
                (source / key).write_text(text)
                (source / key).chmod(0o644)
            source.chmod(0o755)
            if m.get("subPath"):
                source = source / m["subPath"]
            options = ["ro"]  # the kubelet mounts configMaps read-only
        elif "downwardAPI" in volume:
            source = self.workdir / "downward" / m["name"]
            source.mkdir(parents=True, exist_ok=True)
            for item in volume["downwardAPI"]["items"]:
                ref = item.get("fieldRef", {}).get("fieldPath")
                if ref == "metadata.annotations":  # one key="Go-quoted value" line each, as the kubelet writes
                    text = "".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(self.annotations.items()))
                else:
                    assert ref in FIELDS, f"volume {m['name']}: {item} is not something this stand-in gives"
                    text = FIELDS[ref]
                (source / item["path"]).write_text(text)
                (source / item["path"]).chmod(0o644)
            source.chmod(0o755)
            options = ["ro"]  # the kubelet mounts Downward API volumes read-only
        elif "hostPath" in volume:
            source = Path(volume["hostPath"]["path"])
            if m.get("mountPropagation") == "HostToContainer":
                options.append("rslave")
        else:
            raise NotImplementedError(f"volume {m['name']}: {sorted(volume)}")
        return f"{source}:{m['mountPath']}:{','.join(options)}"

    def empty_dir(self, pod: dict[str, Any], name: str) -> Path:
        """The directory behind an emptyDir: one per pod, shared by its containers."""
        path = self.volume_dirs.get(name)
        if path is None:
            path = self.volume_dirs[name] = self.workdir / "volumes" / name
            path.mkdir(parents=True)
            fs_group = pod.get("securityContext", {}).get("fsGroup")
            if fs_group is not None:
                os.chown(path, -1, fs_group)
                path.chmod(0o2777)
            else:
                path.chmod(0o777)
        return path

    # --- containers ------------------------------------------------------------------------------------------
    def container_args(self, pod: dict[str, Any], c: dict[str, Any], override: Override) -> list[str]:
        unknown = set(c) - HANDLED_CONTAINER_KEYS
        assert not unknown, f"container {c['name']}: the kubelet stand-in does not implement {unknown}"
        pod_sc = pod.get("securityContext", {})
        sc = {**pod_sc, **c.get("securityContext", {})}
        uid = override.run_as_user if override.run_as_user is not None else sc.get("runAsUser")
        args: list[str] = []
        if uid is not None:
            if sc.get("runAsNonRoot"):
                assert uid != 0, f"container {c['name']}: runAsNonRoot with uid 0 would not start"
            gid = sc.get("runAsGroup")
            args += ["--user", f"{uid}:{gid}" if gid is not None else str(uid)]
        if pod_sc.get("fsGroup") is not None:
            args += ["--group-add", str(pod_sc["fsGroup"])]
        if sc.get("readOnlyRootFilesystem"):
            args += ["--read-only", "--read-only-tmpfs=false"]
        if sc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        caps = sc.get("capabilities", {})
        for cap in caps.get("drop", []):
            args += ["--cap-drop", cap.lower()]
        for cap in caps.get("add", []):
            args += ["--cap-add", cap.lower()]
        for e in c.get("env", []):
            if e["name"] in override.env:
                value = override.env[e["name"]]
            elif "value" in e:
                value = str(e["value"])
            else:
                ref = e["valueFrom"].get("fieldRef", {}).get("fieldPath")
                assert ref in FIELDS, f"env {e['name']}: {e['valueFrom']} is not something this stand-in gives"
                value = FIELDS[ref]
            args += ["--env", f"{e['name']}={value}"]
        for name, value in override.env.items():
            if not any(e["name"] == name for e in c.get("env", [])):
                args += ["--env", f"{name}={value}"]
        for m in c.get("volumeMounts", []):
            args += ["--volume", self._mount(pod, m)]
        for m in override.mounts:
            args += ["--volume", m]
        command = override.command if override.command is not None else c.get("command")
        if command:
            args += ["--entrypoint", json.dumps(command)]
        image = override.image or c["image"]
        return [*args, image, *([] if override.command is not None else c.get("args", []))]

    def create(self, pod: dict[str, Any], c: dict[str, Any], override: Override | None = None,
               pod_id: str | None = None) -> str:
        unknown = set(pod) - HANDLED_POD_KEYS
        assert not unknown, f"the kubelet stand-in does not implement pod fields {unknown}"
        placement: list[str] = []
        if pod_id is not None:
            placement = ["--pod", pod_id]
        else:
            if pod.get("hostNetwork"):
                placement += ["--network", "host"]
            if pod.get("hostPID"):
                placement += ["--pid", "host"]
        return self.podman.create(c["name"], placement + self.container_args(pod, c, override or Override()))

    def create_pod(self, pod: dict[str, Any]) -> str:
        """A podman pod for a pod whose containers share more than volumes: the PID namespace with
        shareProcessNamespace. Its network is the host's: the test reaches the sidecar's /metrics and receives
        its OTLP on 127.0.0.1; the containers share localhost as a pod's do (a pod's own network namespace is not
        what these tests are about)."""
        share = "pid,ipc,uts,net" if pod.get("shareProcessNamespace") else "ipc,uts,net"
        return self.podman.pod_create("pod", ["--share", share, "--network", "host"])
