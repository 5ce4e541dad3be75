"""The image as built, started with nothing but its own ENV and CMD: the agent comes up, /healthz answers 200 and
/metrics passes promtool (an image whose environment the agent rejects, as OUTRIDER_RULES_FILE once was, exits 2
and never serves)."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import need_binary
from tests.container.podman import Podman
from tests.helpers import samples, value, wait_until

pytestmark = pytest.mark.container

FETCH = ("import sys, urllib.request as u; port = sys.argv[2] if len(sys.argv) > 2 else '9477'; "
         "r = u.urlopen('http://127.0.0.1:' + port + sys.argv[1], timeout=5); "
         "sys.stdout.write(str(r.status) + chr(10) + r.read().decode())")


def fetch(podman: Podman, cid: str, path: str, port: int = 9477) -> tuple[int, str]:
    status, _, body = podman("exec", cid, "python3", "-c", FETCH, path, str(port), strip=False).partition("\n")
    return int(status), body


def test_the_images_own_env_and_cmd_start_the_agent(podman: Podman, built: dict[str, str]) -> None:
    promtool = need_binary("promtool")
    # Its own network namespace (only loopback): the CMD's 0.0.0.0:9477 is the container's; the test asks from
    # inside it. Read-only and without capabilities, as the chart runs it.
    cid = podman.create("image-defaults", ["--network", "none", "--read-only", "--cap-drop", "all",
                                           built["IMAGE"]])
    podman("start", cid)
    inspect = podman.inspect(cid)
    assert inspect["Config"]["User"] == "65532:65532"
    assert inspect["Config"]["Cmd"] == ["agent"], "no flag in the CMD that would override -e OUTRIDER_LISTEN"
    assert "OUTRIDER_LISTEN=0.0.0.0:9477" in inspect["Config"]["Env"]
    assert not [e for e in inspect["Config"]["Env"] if e.startswith("OUTRIDER_RULES")]

    def healthy() -> bool:
        assert podman.exit_code(cid) is None, f"the agent exited:\n{podman.logs(cid)}"
        return fetch(podman, cid, "/healthz")[0] == 200

    wait_until(healthy, timeout_s=90, interval_s=0.5, what="the image's agent to answer /healthz")
    status, text = fetch(podman, cid, "/metrics")
    assert status == 200 and "outrider_host_cpu_seconds_total" in text
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    parsed = samples(text)
    assert value(parsed, "outrider_rule_evaluations_total") is not None, "the built-in rules load from the package"
    assert value(parsed, "outrider_collector_success", collector="host") == 1


def test_the_listen_address_is_taken_from_the_environment(podman: Podman, built: dict[str, str]) -> None:
    """`docker run -e OUTRIDER_LISTEN=...` moves the port (the CMD used to pass --listen, which wins over it)."""
    cid = podman.create("image-listen-env", ["--network", "none", "--read-only", "--cap-drop", "all",
                                             "-e", "OUTRIDER_LISTEN=127.0.0.1:9555", built["IMAGE"]])
    podman("start", cid)

    def healthy() -> bool:
        assert podman.exit_code(cid) is None, f"the agent exited:\n{podman.logs(cid)}"
        return fetch(podman, cid, "/healthz", port=9555)[0] == 200  # raises while nothing listens there yet

    wait_until(healthy, timeout_s=90, interval_s=0.5, what="the agent on the port OUTRIDER_LISTEN names")


def test_otlp_over_grpc_runs_on_the_image(podman: Podman, built: dict[str, str]) -> None:
    """The chart's inference example sets otlp.protocol grpc: the image carries the gRPC exporter, so the agent
    serves (it exited 2, and a native sidecar with a startup probe never let the server start)."""
    cid = podman.create("image-otlp-grpc", ["--network", "none", "--read-only", "--cap-drop", "all",
                                            "-e", "OUTRIDER_OTLP_PROTOCOL=grpc",
                                            "-e", "OUTRIDER_OTLP_ENDPOINT=http://127.0.0.1:4317", built["IMAGE"]])
    podman("start", cid)

    def healthy() -> bool:
        assert podman.exit_code(cid) is None, f"the agent exited:\n{podman.logs(cid)}"
        return fetch(podman, cid, "/healthz")[0] == 200

    wait_until(healthy, timeout_s=90, interval_s=0.5, what="the agent with OTLP over gRPC")
    assert "needs the gRPC exporter" not in podman.logs(cid)
    # grpcio's C++ core loads (it needs libstdc++, which the base once lacked): the node agent's PodResources client
    podman("exec", cid, "/opt/outrider/bin/python", "-c",
           "import grpc, outrider.k8s.podresources.api_pb2_grpc, opentelemetry.exporter.otlp.proto.grpc")
