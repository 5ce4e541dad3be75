"""Kubernetes Pod Security Standards, the "baseline" and "restricted" profiles, as the policy page states them
(https://kubernetes.io/docs/concepts/security/pod-security-standards/, Kubernetes 1.29 to 1.33), checked on a pod
spec the way the PodSecurity admission controller checks it: every control, every container (init and ephemeral
ones included), pod-level settings standing in for container-level ones where the policy allows it. Each check
returns what it finds wrong, in words; an empty list is a pod the profile admits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def _containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _contexts(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(whose, securityContext) for the pod and each container."""
    yield "pod", spec.get("securityContext") or {}
    for c in _containers(spec):
        yield f"container {c['name']}", c.get("securityContext") or {}


def baseline(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> list[str]:
    wrong = []
    for whose, sc in _contexts(spec):
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            wrong.append(f"{whose}: HostProcess")
        if sc.get("privileged"):
            wrong.append(f"{whose}: privileged")
        added = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if added:
            wrong.append(f"{whose}: adds capabilities {sorted(added)}")
        if (sc.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            wrong.append(f"{whose}: AppArmor profile {sc['appArmorProfile']['type']}")
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            wrong.append(f"{whose}: SELinux options {se}")
        if sc.get("procMount") not in (None, "Default"):
            wrong.append(f"{whose}: procMount {sc['procMount']}")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            wrong.append(f"{whose}: seccomp Unconfined")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            wrong.append(f"pod: {field}")
    for v in spec.get("volumes") or []:
        if "hostPath" in v:
            wrong.append(f"volume {v['name']}: hostPath")
    for c in _containers(spec):
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                wrong.append(f"container {c['name']}: hostPort {p['hostPort']}")
    for key, value in (annotations or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and \
                value != "runtime/default" and not value.startswith("localhost/"):
            wrong.append(f"annotation {key}: {value}")
    for sysctl in (spec.get("securityContext") or {}).get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            wrong.append(f"pod: sysctl {sysctl['name']}")
    return wrong


def restricted(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> list[str]:
    wrong = baseline(spec, annotations)
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            wrong.append(f"volume {v['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod = spec.get("securityContext") or {}
    if pod.get("runAsUser") == 0:
        wrong.append("pod: runAsUser 0")
    pod_seccomp = (pod.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        wrong.append(f"pod: seccomp {pod_seccomp}")
    for c in _containers(spec):
        whose, sc = f"container {c['name']}", c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            wrong.append(f"{whose}: allowPrivilegeEscalation is not false")
        non_root = sc.get("runAsNonRoot")
        if non_root is False or (non_root is None and pod.get("runAsNonRoot") is not True):
            wrong.append(f"{whose}: runAsNonRoot is not true (here or on the pod)")
        if sc.get("runAsUser") == 0:
            wrong.append(f"{whose}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp not in (None, "RuntimeDefault", "Localhost") or (seccomp is None and pod_seccomp is None):
            wrong.append(f"{whose}: seccomp profile is not RuntimeDefault or Localhost (here or on the pod)")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            wrong.append(f"{whose}: does not drop ALL capabilities")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            wrong.append(f"{whose}: adds capabilities other than NET_BIND_SERVICE")
    return wrong
