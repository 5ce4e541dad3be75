"""The image as built, started with nothing but its own ENV and CMD: the agent comes up, /healthz answers 200 and
/metrics passes promtool (an image whose environment the agent rejects, as OUTRIDER_RULES_FILE once was, exits 2
and never serves)."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import need_binary
from tests.container.podman import Podman
from tests.helpers import free_port, samples, value, wait_until
from tests.servers import OtlpGrpcReceiver, otlp_points

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
    serves (it exited 2, and a native sidecar with a startup probe never let the server start), and its exports
    reach a gRPC receiver (grpcio's, on the host's loopback)."""
    port = free_port()
    receiver = OtlpGrpcReceiver()
    try:
        cid = podman.create("image-otlp-grpc", ["--network", "host", "--read-only", "--cap-drop", "all",
                                                "-e", f"OUTRIDER_LISTEN=127.0.0.1:{port}",
                                                "-e", "OUTRIDER_OTLP_PROTOCOL=grpc",
                                                "-e", f"OUTRIDER_OTLP_ENDPOINT={receiver.endpoint}",
                                                "-e", "OTEL_METRIC_EXPORT_INTERVAL=500", built["IMAGE"]])
        podman("start", cid)

        def exported() -> bool:
            assert podman.exit_code(cid) is None, f"the agent exited:\n{podman.logs(cid)}"
            return "system.cpu.time" in otlp_points(receiver.requests)

        wait_until(exported, timeout_s=90, interval_s=0.5, what="an OTLP/gRPC export from the image's agent")
        assert "needs the gRPC exporter" not in podman.logs(cid)
    finally:
        receiver.stop()
    # The node agent's PodResources client loads too (gRPC on h2, protobuf's C++ core on the libstdc++ the base once
    # lacked); grpcio is not in the image at all.
    podman("exec", cid, "/opt/outrider/bin/python", "-c",
           "import importlib.util as u, outrider.adapters.grpc_client, outrider.k8s.podresources.api_pb2; "
           "assert u.find_spec('grpc') is None")


# Run inside the image by its own Python: every shared object (the standard library's extension modules, the
# wheels', the C libraries) loaded with its dependencies resolved now, as an import would.
LOAD_ALL = """
import ctypes, os, sys
failed, loaded = [], 0
for top in ("/opt/outrider", "/usr/lib/python3.11", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"):
    for root, _, names in os.walk(top):
        for name in sorted(names):
            path = os.path.join(root, name)
            if ".so" not in name or os.path.islink(path) or "/gconv/" in path:
                continue
            try:
                ctypes.CDLL(path, mode=os.RTLD_NOW)
                loaded += 1
            except OSError as e:
                failed.append(str(e))
print(loaded)
print(chr(10).join(failed))
"""


def _run_python(podman: Podman, image: str, name: str, code: str) -> str:
    cid = podman.create(name, ["--network", "none", "--read-only", "--cap-drop", "all", "--entrypoint",
                               "/opt/outrider/bin/python", image, "-c", code])
    return podman("start", "--attach", cid, strip=False)


def test_every_shared_object_in_the_image_finds_its_libraries(podman: Podman, built: dict[str, str]) -> None:
    """The runtime root carries only some Debian packages: a library that one of its files or a wheel's extension
    needs and that was left out (libstdc++, which protobuf's and RE2's C++ cores need, once) fails here, not when
    the agent first matches a regex or asks the kubelet."""
    loaded, _, failed = _run_python(podman, built["IMAGE"], "image-libraries", LOAD_ALL).partition("\n")
    assert not failed.strip(), failed
    assert int(loaded) > 50, "the walk found the extension modules"


def test_the_image_runs_nothing_but_python(podman: Podman, built: dict[str, str]) -> None:
    """No shell, no package manager, no setuid program: the runtime root is Python and its libraries; TLS still
    verifies against the CA bundle it carries, and the state directory is the agent's alone."""
    code = ("import os, ssl, stat; "
            "print(sorted(p for p in ('/bin/sh', '/bin/bash', '/usr/bin/dpkg', '/usr/bin/apt', '/usr/bin/su', "
            "'/usr/bin/perl') if os.path.lexists(p))); "
            "print(ssl.create_default_context().cert_store_stats()['x509_ca']); "
            "s = os.stat('/var/lib/outrider'); print(s.st_uid, oct(stat.S_IMODE(s.st_mode)))")
    present, cas, state = _run_python(podman, built["IMAGE"], "image-contents", code).splitlines()
    assert present == "[]"
    assert int(cas) > 100, "the CA bundle loads as OpenSSL's default"
    assert state == "65532 0o700"


def test_the_image_is_at_most_100_mb(built: dict[str, str]) -> None:
    """#29: 165 MB on the full Debian base with rich and pygments; the goal is 100 MB."""
    assert int(built["SIZE_BYTES"]) <= 100_000_000, f"{int(built['SIZE_BYTES']) / 1e6:.1f} MB"
