"""The hook's own settings, read from its handful of OUTRIDER_* variables with the standard library only.

The hook never loads the agent's configuration: a pod that shares one environment between the workload and the
sidecar may set any agent key (OUTRIDER_COLLECTORS, ...), which the agent validates and the hook ignores. Each
value is parsed on its own: a bad one keeps its default and is reported, never dropping the others. The agent's
configuration (outrider.ground.config) takes these keys' defaults and bounds from KEYS, so both sides agree.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

ENV_PREFIX = "OUTRIDER_"
ROLES = ("", "training", "inference")
MAX_TEXT = 128


@dataclass(frozen=True)
class Bounds:
    low: float
    high: float


# Numeric settings the hook reads and their inclusive bounds: beyond them a value is refused with a clear message
# rather than, say, an interval of 1e308 s that kills the publisher thread or one of 1e-300 s that spins a core.
BOUNDS: dict[str, Bounds] = {
    "flush_interval_s": Bounds(0.05, 3600.0),
    "hook_max_series_per_metric": Bounds(1, 100_000),
    "stall_factor": Bounds(1.0, 10_000.0),
    "stall_floor_s": Bounds(1.0, 30 * 86400.0),
    "first_step_timeout_s": Bounds(1.0, 30 * 86400.0),
    "phase_timeout_s": Bounds(1.0, 30 * 86400.0),
    "profile_hz": Bounds(0.0, 1000.0),
    "flops_every_s": Bounds(0.0, 30 * 86400.0),
}


@dataclass(frozen=True)
class HookSettings:
    spool_dir: str = ""  # empty: the private per-user default (outrider.shared.spool.default_dir)
    flush_interval_s: float = 1.0
    hook_max_series_per_metric: int = 100
    stall_factor: float = 10.0
    stall_floor_s: float = 300.0
    first_step_timeout_s: float = 1800.0
    phase_timeout_s: float = 3600.0
    standalone: bool = True
    listen: str = ""  # /metrics address of the agent a hooked process starts (standalone); empty: the default
    training_job: str = ""  # groups the ranks of one training job; else derived (derive_training_job)
    role: str = ""  # training, inference, or empty: judged from what the process does
    spool_trusted_uids: tuple[int, ...] = ()  # owners of a configured spool besides this user and root
    profile_hz: float = 50.0  # samples a second of the loop thread's stack (hook/profiler.py); 0: off
    flops_every_s: float = 600.0  # seconds between counts of a step's FLOPs (hook/torch_flops.py); 0: never


KEYS: dict[str, Any] = {f.name: f.default for f in fields(HookSettings)}


def parse_bool(raw: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("true or false")


def parse_number(b: Bounds, raw: Any, integer: bool = False) -> float:
    """A number within the bounds; ValueError saying what was expected."""
    what = f"{'a whole number' if integer else 'a number'} from {b.low:g} to {b.high:g}"
    if isinstance(raw, bool):
        raise ValueError(what)
    try:
        value = float(raw) if not integer else float(int(str(raw).strip()) if not isinstance(raw, int) else raw)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(what) from None
    if not math.isfinite(value) or not b.low <= value <= b.high:
        raise ValueError(what)
    return value


def parse_uids(raw: Any) -> tuple[int, ...]:
    items = raw.split(",") if isinstance(raw, str) else list(raw) if isinstance(raw, (list, tuple)) else [raw]
    uids = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        if isinstance(item, bool) or not text.isdigit() or int(text) > 2**32 - 2:
            raise ValueError("a comma-separated list of numeric uids")
        uids.append(int(text))
    return tuple(uids)


def read(env: Mapping[str, str] | None = None) -> tuple[HookSettings, list[str]]:
    """The settings from the environment, and one message per value that was refused (its default kept)."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, default in KEYS.items():
        name = ENV_PREFIX + key.upper()
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            if isinstance(default, bool):
                values[key] = parse_bool(raw)
            elif isinstance(default, int):
                values[key] = int(parse_number(BOUNDS[key], raw, integer=True))
            elif isinstance(default, float):
                values[key] = parse_number(BOUNDS[key], raw)
            elif key == "spool_trusted_uids":
                values[key] = parse_uids(raw)
            elif key == "role":
                if raw.strip().lower() not in ROLES:
                    raise ValueError("training or inference")
                values[key] = raw.strip().lower()
            else:
                if len(raw) > 4096 or "\x00" in raw:
                    raise ValueError("a path or name without NUL, at most 4096 characters")
                values[key] = raw
        except ValueError as e:
            problems.append(f"{name}={raw[:80]!r}: expected {e}; using the default {default!r}")
    if "training_job" not in values:
        job, _ = derive_training_job(env)
        if job:
            values["training_job"] = job
    if len(values.get("training_job", "")) > MAX_TEXT:
        values["training_job"] = values["training_job"][:MAX_TEXT]
    return HookSettings(**values), problems


def environment(values: Mapping[str, Any]) -> dict[str, str]:
    """The OUTRIDER_* variables that give a hooked process these settings (the inverse of `read`): how `outrider
    run` hands the agent's configuration of the hook (a config file's flush_interval_s, ...) to the command's
    processes. Keys the hook does not read are refused; an empty text is left out (the hook's default)."""
    out = {}
    for key, value in values.items():
        if key not in KEYS:
            raise KeyError(f"{key} is not a hook setting")
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (tuple, list)):
            text = ",".join(str(v) for v in value)
        elif isinstance(value, float):
            text = repr(value)
        else:
            text = str(value)
        if text:
            out[ENV_PREFIX + key.upper()] = text
    return out


# --- the training job's identity, where the platform says it --------------------------------------------------
# Ranks of one job that run in different pods (one rank per pod) are compared with each other (stragglers) only when
# they share a training_job; so it is derived from what the launcher or the platform puts in the pod, in this order
# (the first that says something wins; docs/instrumenting.md, "Training job identity"):
KUBEFLOW_MASTER = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)-master-0$")  # training operator v1: <job>-master-0
HOSTS_PATH = "/etc/hosts"
# Where the pod's labels are read, when a downward API volume mounts them there (the path of Kubernetes' own example).
# Not an OUTRIDER_* setting: every such variable is an agent key too, and a sidecar sharing the environment would
# refuse one it does not know.
POD_LABELS_PATH = "/etc/podinfo/labels"
# Pod labels that name the job, the framework's own before the Kubernetes Job's (a JobSet's pods belong to one Job
# per replicated job: their job-name differs between ranks)
JOB_LABELS = ("training.kubeflow.org/job-name", "trainer.kubeflow.org/trainjob-name", "jobset.sigs.k8s.io/jobset-name",
              "volcano.sh/job-name", "ray.io/cluster", "batch.kubernetes.io/job-name", "job-name")


def derive_training_job(env: Mapping[str, str], hosts_path: str = HOSTS_PATH) -> tuple[str, str]:
    """(training job, where it came from), or ("", "") when nothing says it. Never raises."""
    for source in _SOURCES:
        try:
            job = source(env, hosts_path)
        except Exception:  # a platform's odd value never costs the workload anything
            job = ""
        if job:
            return job[:MAX_TEXT], source.__name__.lstrip("_")
    return "", ""


def _outrider(env: Mapping[str, str], _: str) -> str:
    return env.get("OUTRIDER_TRAINING_JOB", "").strip()


def _torchrun(env: Mapping[str, str], _: str) -> str:
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    return run_id if run_id != "none" else ""  # torchrun's placeholder when no rendezvous id was given


def _jobset(env: Mapping[str, str], _: str) -> str:
    """JOBSET_NAME: mapped from the pod's jobset.sigs.k8s.io/jobset-name label with the downward API."""
    return env.get("JOBSET_NAME", "").strip()


def _pod_labels(env: Mapping[str, str], _: str) -> str:
    """The pod's labels, where the downward API mounts them (`key="value"` lines): the first of JOB_LABELS."""
    try:
        with open(POD_LABELS_PATH, encoding="utf-8", errors="replace") as fh:
            text = fh.read(65536)
    except OSError:
        return ""
    labels: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            labels[key.strip()] = value.strip().strip('"')
    return next((labels[k] for k in JOB_LABELS if labels.get(k)), "")


def _ray(env: Mapping[str, str], _: str) -> str:
    """A Ray job's submission id (set in the job's environment), else the KubeRay cluster's name."""
    return (env.get("RAY_JOB_SUBMISSION_ID", "") or env.get("RAY_CLUSTER_NAME", "")).strip()


def _volcano(env: Mapping[str, str], _: str) -> str:
    """Volcano's svc plugin: VC_<TASK>_HOSTS lists `<job>-<task>-<i>.<job>`: the job is the domain."""
    for key in sorted(env):
        if key.startswith("VC_") and key.endswith("_HOSTS"):
            first = env[key].split(",")[0].strip()
            if first.count(".") >= 1:
                return first.split(".")[1]
    return ""


def _kubeflow(env: Mapping[str, str], _: str) -> str:
    """Kubeflow: the training operator's PyTorchJob sets MASTER_ADDR to `<job>-master-0`; Trainer v2 sets
    PET_MASTER_ADDR to `<trainjob>-node-0-0.<trainjob>`."""
    pet = env.get("PET_MASTER_ADDR", "").strip()
    if pet.count(".") >= 1 and "-node-" in pet.split(".")[0]:
        return pet.split(".")[1]
    match = KUBEFLOW_MASTER.match(env.get("MASTER_ADDR", "").strip())
    if match and env.get("KUBERNETES_SERVICE_HOST"):
        return match.group(1)
    return ""


def _subdomain(env: Mapping[str, str], hosts_path: str) -> str:
    """The pod's subdomain (its headless service: a JobSet's, a Volcano job's, an Indexed Job's), from the line
    the kubelet writes for it in /etc/hosts (`IP host.subdomain.namespace.svc.<domain> host`); no DNS lookup."""
    host = env.get("HOSTNAME", "").strip()
    if not host or not env.get("KUBERNETES_SERVICE_HOST"):
        return ""
    with open(hosts_path, encoding="utf-8", errors="replace") as fh:
        for line in fh.read(65536).splitlines():
            for name in line.split("#")[0].split()[1:]:
                parts = name.split(".")
                if len(parts) >= 4 and parts[0] == host and parts[3] == "svc":
                    return parts[1]
    return ""


def _indexed_job(env: Mapping[str, str], _: str) -> str:
    """An Indexed Kubernetes Job: JOB_COMPLETION_INDEX is set, and the pod's name (HOSTNAME) is
    `<job>-<index>-<random>` (or `<job>-<index>` with a subdomain)."""
    index = env.get("JOB_COMPLETION_INDEX", "").strip()
    match = re.match(rf"^(.+)-{re.escape(index)}(-[a-z0-9]{{5}})?$", env.get("HOSTNAME", "").strip())
    return match.group(1) if index.isdigit() and match else ""


_SOURCES = (_outrider, _torchrun, _jobset, _pod_labels, _ray, _volcano, _kubeflow, _subdomain, _indexed_job)
