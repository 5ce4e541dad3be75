"""Which Kubernetes pod and container a cgroup belongs to, with zero configuration: the names the kubelet and the
container runtime give cgroups, and the kubelet's log directories on the node.

The kubelet names a pod's cgroup after the pod's UID and the runtime names a container's after the container's ID:

    systemd driver:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID, "-" as "_">.slice/
                     cri-containerd-<ID>.scope (containerd), crio-<ID>.scope (CRI-O), docker-<ID>.scope (cri-dockerd)
    cgroupfs driver: /kubepods/burstable/pod<UID>/<ID> (containerd, cri-dockerd), .../pod<UID>/crio-<ID> (CRI-O)

(a Guaranteed pod sits directly under kubepods; a static pod's UID is 32 hex digits, its config hash). Outside a pod
the same container names appear under podman (libpod-<ID>.scope) and docker (docker-<ID>.scope, /docker/<ID>).
`identity` reads those from a path and touches nothing.

A pod's namespace and name and a container's name are not in the cgroup. The kubelet writes them into its log
paths, `/var/log/pods/<NAMESPACE>_<POD>_<UID>/<CONTAINER>/` and `/var/log/containers/<POD>_<NAMESPACE>_<CONTAINER>-
<ID>.log` (none of those names can hold "_": they are DNS labels and subdomains); `PodDirectory` reads them under the
host's root, which a node agent has mounted. A container whose log link is gone (removed after its restart) is named
only where its pod has one container.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from outrider.k8s.gpu_owners import Owner

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
POD_SEGMENT = re.compile(rf"(?:kubepods-(?:besteffort-|burstable-)?)?pod({_UID})(?:\.slice)?")
CONTAINER_SEGMENT = re.compile(r"(?:(cri-containerd|crio|docker|libpod)-)?([0-9a-f]{64})(?:\.scope)?")
RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", "libpod": "podman"}


class CgroupIdentity(NamedTuple):
    pod_uid: str  # "" outside a Kubernetes pod
    container_id: str  # the runtime's 64-hex-digit container id; "" where the path names none (a pod's own cgroup)
    runtime: str  # containerd, cri-o, docker, podman; "" where the name does not say (the cgroupfs driver)


def identity(cgroup: str) -> CgroupIdentity:
    """The pod and container a cgroup path names, from the kubelet's and runtimes' layouts above."""
    segments = [s for s in cgroup.split("/") if s]
    pod_uid, after = "", 0
    for i, segment in enumerate(segments):
        m = POD_SEGMENT.fullmatch(segment)
        if m and any(s.startswith("kubepods") for s in segments[:i + 1]):
            pod_uid, after = m.group(1).replace("_", "-"), i + 1
    container_id = runtime = ""
    for segment in segments[after:]:
        m = CONTAINER_SEGMENT.fullmatch(segment)
        if m:
            container_id, runtime = m.group(2), RUNTIMES.get(m.group(1) or "", "")
    return CgroupIdentity(pod_uid, container_id, runtime)


class PodDirectory:
    """Pod and container names from the kubelet's log directories under `root` (the host's root filesystem).

    Each directory is listed again only when asked for a pod or container it did not hold at the last listing; an
    unreadable directory raises OSError to the caller, which counts it.
    """

    def __init__(self, root: str = "/") -> None:
        base = root.rstrip("/")
        self.pods_dir = f"{base}/var/log/pods"
        self.containers_dir = f"{base}/var/log/containers"
        self._pods: dict[str, tuple[str, str, str]] = {}  # uid -> (namespace, pod, its directory's name)
        self._containers: dict[str, str] = {}  # container id -> container name

    def owner(self, ident: CgroupIdentity) -> Owner | None:
        """The namespace, pod and (where it can tell) container of a cgroup's identity; None outside a known pod."""
        if not ident.pod_uid:
            return None
        pod = self._pods.get(ident.pod_uid)
        if pod is None:
            self._pods = self._list_pods()
            pod = self._pods.get(ident.pod_uid)
            if pod is None:
                return None
        namespace, name, dirname = pod
        container = self._container(ident.container_id, dirname) if ident.container_id else ""
        return Owner(namespace, name, container)

    def _list_pods(self) -> dict[str, tuple[str, str, str]]:
        out = {}
        for entry in os.listdir(self.pods_dir):
            parts = entry.split("_")
            if len(parts) == 3 and all(parts):
                out[parts[2]] = (parts[0], parts[1], entry)
        return out

    def _container(self, container_id: str, pod_dirname: str) -> str:
        name = self._containers.get(container_id)
        if name is None:
            self._containers = self._list_containers()
            name = self._containers.get(container_id)
        if name is not None:
            return name
        try:  # the link went with the container: name it only where the pod has a single container
            names = [e for e in os.listdir(f"{self.pods_dir}/{pod_dirname}")
                     if os.path.isdir(f"{self.pods_dir}/{pod_dirname}/{e}")]
        except FileNotFoundError:
            return ""
        return names[0] if len(names) == 1 else ""

    def _list_containers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        try:
            entries = os.listdir(self.containers_dir)
        except FileNotFoundError:
            return out
        for entry in entries:
            stem = entry.removesuffix(".log")
            parts = stem.split("_")
            if len(parts) != 3:
                continue
            container, dash, cid = parts[2].rpartition("-")
            if dash and container:
                out[cid] = container
        return out
