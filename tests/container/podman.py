"""Podman for the container tests: the project's settings (scripts/podman/: runc, ulimits that fit this host, the
image storage .ci/run builds into), every container and pod a test starts removed by its id afterwards."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

from tests.conftest import need_binary
from tests.helpers import REPO

CONF = REPO / "scripts" / "podman"


def podman_env() -> dict[str, str]:
    """scripts/build-image.sh's settings: the project's storage, or OUTRIDER_PODMAN_STORAGE_CONF's."""
    return {**os.environ, "CONTAINERS_CONF": str(CONF / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": os.environ.get("OUTRIDER_PODMAN_STORAGE_CONF", str(CONF / "storage.conf"))}


class Podman:
    """`podman` with the project's settings. Containers and pods made through create()/pod_create() are removed,
    by id, in cleanup()."""

    def __init__(self) -> None:
        self.exe = need_binary("podman")
        self.env = podman_env()
        self.containers: list[str] = []
        self.pods: list[str] = []
        self.prefix = f"outrider-test-{uuid.uuid4().hex[:8]}"

    def __call__(self, *args: str, check: bool = True, timeout_s: float = 300, strip: bool = True) -> str:
        r = subprocess.run([self.exe, *args], env=self.env, capture_output=True, text=True, timeout=timeout_s,
                           stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r.stdout.strip() if strip else r.stdout

    def create(self, name: str, args: list[str]) -> str:
        cid = self("create", "--name", f"{self.prefix}-{name}", *args)
        self.containers.append(cid)
        return cid

    def pod_create(self, name: str, args: list[str]) -> str:
        pod = self("pod", "create", "--name", f"{self.prefix}-{name}", *args)
        self.pods.append(pod)
        return pod

    def inspect(self, cid: str) -> dict[str, Any]:
        import json

        data: list[dict[str, Any]] = json.loads(self("inspect", "--type", "container", cid))
        return data[0]

    def exit_code(self, cid: str) -> int | None:
        """The container's exit code once it has exited; None while it runs."""
        state = self.inspect(cid)["State"]
        return None if state["Running"] or state["Status"] in ("created", "configured", "initialized") \
            else int(state["ExitCode"])

    def logs(self, cid: str) -> str:
        r = subprocess.run([self.exe, "logs", cid], env=self.env, capture_output=True, text=True, timeout=60)
        return (r.stdout + r.stderr)[-6000:]

    def cleanup(self) -> None:
        for cid in reversed(self.containers):
            self("rm", "--force", "--time", "0", cid, check=False, timeout_s=120)
        for pod in reversed(self.pods):
            self("pod", "rm", "--force", pod, check=False, timeout_s=120)
        self.containers.clear()
        self.pods.clear()


def build_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines (scripts/build-image.sh's output)."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def build_workload_image(podman: Podman, base_image: str, wheelhouse: Path, tag: str, workdir: Path) -> str:
    """An instrumented Python workload's image: the bare base, the hook pip-installed from the same wheel as the
    agent (--no-deps: the hook is stdlib-only), and tests/container/workload.py."""
    if _exists(podman, tag):
        return tag
    ctx = workdir / "workload-image"
    ctx.mkdir(parents=True)
    wheel = next(wheelhouse.glob("outrider-*.whl"))
    (ctx / wheel.name).write_bytes(wheel.read_bytes())
    (ctx / "workload.py").write_text((Path(__file__).parent / "workload.py").read_text())
    (ctx / "Containerfile").write_text(
        f"FROM {base_image}\n"
        f"COPY {wheel.name} /tmp/\n"
        f"RUN python3 -m venv /opt/workload && /opt/workload/bin/pip install --no-cache-dir --no-index --no-deps "
        f"/tmp/{wheel.name} && rm /tmp/{wheel.name}\n"
        "COPY workload.py /opt/workload/workload.py\n"
        'ENTRYPOINT ["/opt/workload/bin/python", "/opt/workload/workload.py"]\n')
    podman("build", "--quiet", "--network", "none", "--pull=never", "-t", tag, str(ctx))
    repository = tag.rsplit(":", 1)[0]
    for old in podman("images", "--noheading", "--format", "{{.Repository}}:{{.Tag}}", repository).split():
        if old != tag:
            podman("rmi", old, check=False)  # an earlier tree's; in use elsewhere, it stays
    return tag


def _exists(podman: Podman, tag: str) -> bool:
    return subprocess.run([podman.exe, "image", "exists", tag], env=podman.env).returncode == 0
