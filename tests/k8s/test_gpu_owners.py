"""GPU owners from the kubelet's PodResources API: a real gRPC server speaking the published v1 proto (through the
generated code) on a unix socket stands in for the kubelet (tests/fakes/kubelet.py)."""

from __future__ import annotations

import importlib.abc
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

import outrider.adapters
import outrider.k8s.podresources
from outrider.k8s.gpu_owners import MAX_RESPONSE_BYTES, GpuOwners, Owner, owners_from_response
from outrider.k8s.podresources import api_pb2
from outrider.k8s.podresources.generate import GENERATED, PROTO, SOURCE_ROOT, differences, generate, generated_versions
from tests.fakes.kubelet import FakeKubelet, NotGrpcSocket, pod, short_socket_dir
from tests.helpers import REPO

GPU = "nvidia.com/gpu"
COMMITTED = REPO / "agent" / "outrider" / "k8s" / "podresources"
PODS = [
    pod("research", "train-0", {"trainer": [(GPU, ["GPU-0", "GPU-1"])], "sidecar": []}),
    pod("serving", "llm-0", {"server": [("nvidia.com/mig-1g.10gb", ["MIG-aaaa"]),
                                        ("example.com/fpga", ["GPU-9"])]}),  # not a GPU resource
    pod("batch", "job-a", {"main": [(GPU, ["GPU-2::0"])]}),  # time-sliced replicas of one GPU
    pod("batch", "job-b", {"main": [(GPU, ["GPU-2::1"])]}),
    pod("legacy", "by-index", {"c": [(GPU, ["3", ""])]}),  # the device plugin's "index" id strategy
]


@pytest.fixture
def sock() -> Iterator[str]:
    with short_socket_dir() as d:
        yield os.path.join(d, "kubelet.sock")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_owners_by_gpu_uuid_mig_uuid_index_and_shared_replicas(sock: str) -> None:
    with FakeKubelet(sock, PODS):
        owners = GpuOwners(sock, timeout_s=5).owners()
    assert owners == {
        "GPU-0": Owner("research", "train-0", "trainer"),
        "GPU-1": Owner("research", "train-0", "trainer"),
        "MIG-aaaa": Owner("serving", "llm-0", "server"),
        "GPU-2": Owner("batch", "job-a,job-b", "main"),
        "3": Owner("legacy", "by-index", "c"),
    }, "GPU-9 is another resource's device; an empty id is no device"


def test_answers_are_cached_for_the_ttl_then_asked_again(sock: str) -> None:
    clock = Clock()
    with FakeKubelet(sock, PODS[:1]) as kubelet:
        owners = GpuOwners(sock, timeout_s=5, ttl_s=10, clock=clock)
        assert "GPU-0" in owners.owners()
        kubelet.pods = PODS[1:2]
        clock.now += 9
        assert "GPU-0" in owners.owners() and kubelet.requests == 1, "within the TTL: the cached answer"
        clock.now += 1
        assert set(owners.owners()) == {"MIG-aaaa"} and kubelet.requests == 2, "past it: asked again"
        assert owners.asks == 2
        owners.close()


def test_the_cache_lasts_the_readmes_10_s_by_default(sock: str) -> None:
    """README: "The answer is cached for 10 s": just below it the cached answer, at it asked again."""
    clock = Clock()
    with FakeKubelet(sock, PODS[:1]) as kubelet:
        owners = GpuOwners(sock, timeout_s=5, clock=clock)
        owners.owners()
        clock.now = 1000.0 + 9.999
        owners.owners()
        assert kubelet.requests == 1, "9.999 s later: still the cached answer"
        clock.now = 1000.0 + 10
        owners.owners()
        assert kubelet.requests == 2, "10 s later: asked again"


def test_missing_socket_is_counted_and_answers_no_owners(sock: str) -> None:
    owners = GpuOwners(sock, timeout_s=5)
    assert owners.owners() == {}
    assert owners.errors == {"missing": 1}
    assert owners.last_error == "missing"
    assert owners.last_error_text == (f"{sock} does not exist (is the kubelet's pod-resources directory mounted into "
                                      "the agent?)"), "the warning says what to mount"


def test_failures_of_one_reason_add_up(sock: str) -> None:
    clock = Clock()
    owners = GpuOwners(sock, timeout_s=5, ttl_s=10, clock=clock)
    owners.owners()
    clock.now += 10
    owners.owners()
    assert owners.errors == {"missing": 2} and owners.asks == 2


def test_a_kubelet_slower_than_the_deadline_is_a_counted_timeout(sock: str) -> None:
    with FakeKubelet(sock, PODS, delay_s=30):
        owners = GpuOwners(sock, timeout_s=0.2)
        assert owners.owners() == {}
        owners.close()
    assert owners.errors == {"timeout": 1}
    assert owners.last_error_text.startswith("PodResources List failed: DEADLINE_EXCEEDED: ")


def test_a_response_that_does_not_decode_is_counted(sock: str) -> None:
    with FakeKubelet(sock, garbage=True) as kubelet:
        owners = GpuOwners(sock, timeout_s=5)
        assert owners.owners() == {}
        owners.close()
    assert kubelet.requests == 1, "the server answered; the answer was garbage"
    assert owners.errors == {"invalid_response": 1}
    assert owners.last_error_text.startswith("PodResources List answered something unusable: ")


def test_something_else_on_the_socket_is_unavailable(sock: str) -> None:
    with NotGrpcSocket(sock):
        owners = GpuOwners(sock, timeout_s=2)
        assert owners.owners() == {}
        owners.close()
    assert owners.errors == {"unavailable": 1}


def test_a_kubelet_without_the_v1_api_is_unimplemented(sock: str) -> None:
    with FakeKubelet(sock, serve_nothing=True):
        owners = GpuOwners(sock, timeout_s=5)
        assert owners.owners() == {}
        owners.close()
    assert owners.errors == {"unimplemented": 1}


def test_a_grpc_status_without_a_reason_of_its_own_is_counted_as_error(sock: str) -> None:
    with FakeKubelet(sock, PODS, refuse=grpc.StatusCode.PERMISSION_DENIED):
        owners = GpuOwners(sock, timeout_s=5)
        assert owners.owners() == {}
    assert owners.errors == {"error": 1}
    assert owners.last_error_text == "PodResources List failed: PERMISSION_DENIED: the kubelet says no"


class NoK8sExtra(importlib.abc.MetaPathFinder):
    """An install without the 'k8s' extra: h2 and protobuf cannot be imported."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0] == "h2" or name.startswith("google.protobuf"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_without_the_k8s_extra_the_ask_is_counted_as_no_grpc_and_says_what_to_install(
        sock: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # forget the client and what it stands on (monkeypatch puts them back), so that the ask imports them afresh
    for name in list(sys.modules):
        if name.split(".")[0] == "h2" or name.startswith("google.protobuf") or name in (
                "outrider.adapters.grpc_client", "outrider.k8s.podresources.api_pb2"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.delattr(outrider.adapters, "grpc_client", raising=False)
    monkeypatch.delattr(outrider.k8s.podresources, "api_pb2", raising=False)
    monkeypatch.setattr(sys, "meta_path", [NoK8sExtra(), *sys.meta_path])
    with FakeKubelet(sock, PODS) as kubelet:
        owners = GpuOwners(sock, timeout_s=5)
        assert owners.owners() == {}
    assert owners.errors == {"no_grpc": 1} and kubelet.requests == 0
    assert owners.last_error_text == "the PodResources client cannot load: No module named 'h2' (pip install " \
                                     "'outrider[k8s]')"


def test_an_answer_larger_than_grpcs_4_mib_default_is_read(sock: str) -> None:
    """A node with many devices of other resources: the answer passes grpcio's 4 MiB default receive limit, within
    the agent's own 16 MiB."""
    many = [f"nic-{i:076d}" for i in range(60_000)]
    big = [pod("ml", "train", {"main": [("example.com/nic", many), (GPU, ["GPU-7"])]})]
    size = api_pb2.ListPodResourcesResponse(pod_resources=big).ByteSize()
    assert 4 << 20 < size < MAX_RESPONSE_BYTES
    with FakeKubelet(sock, big):
        owners = GpuOwners(sock, timeout_s=30)
        assert owners.owners() == {"GPU-7": Owner("ml", "train", "main")}
    assert owners.errors == {}


def test_after_a_failure_the_next_ask_waits_for_the_ttl_then_recovers(sock: str) -> None:
    clock = Clock()
    owners = GpuOwners(sock, timeout_s=5, ttl_s=10, clock=clock)
    assert owners.owners() == {} and owners.asks == 1
    with FakeKubelet(sock, PODS[:1]):
        clock.now += 5
        assert owners.owners() == {} and owners.asks == 1, "a failed ask is not repeated every sweep"
        clock.now += 5
        assert "GPU-0" in owners.owners()
        owners.close()


def test_owners_from_a_response_ignore_other_resources() -> None:
    response = api_pb2.ListPodResourcesResponse(pod_resources=[
        pod("ns", "p", {"c": [("nvidia.com/gpu-not-really", ["GPU-0"]), ("amd.com/gpu", ["GPU-1"])]})])
    assert owners_from_response(response) == {}


def test_a_containers_other_devices_listed_before_its_gpu_do_not_hide_it() -> None:
    response = api_pb2.ListPodResourcesResponse(pod_resources=[
        pod("ns", "p", {"c": [("example.com/fpga", ["FPGA-0"]), (GPU, ["GPU-0"]), ("example.com/nic", ["NIC-0"]),
                              ("nvidia.com/mig-1g.10gb", ["MIG-bbbb"])]})])
    assert owners_from_response(response) == {"GPU-0": Owner("ns", "p", "c"), "MIG-bbbb": Owner("ns", "p", "c")}


def test_a_replica_id_names_the_device_before_its_first_separator() -> None:
    """A time-sliced replica is `<device>::<n>`; whatever follows the first `::` is the replica's, not the device's."""
    response = api_pb2.ListPodResourcesResponse(pod_resources=[
        pod("ns", "p", {"c": [(GPU, ["GPU-5::3::extra", " GPU-6 "])]})])
    assert owners_from_response(response) == {"GPU-5": Owner("ns", "p", "c"), "GPU-6": Owner("ns", "p", "c")}


def test_the_committed_client_means_what_grpcio_tools_generates(tmp_path: Path) -> None:
    """Compared by meaning (the proto's descriptor, the RPCs' wiring), so any grpcio-tools the dev extra allows
    passes: each release writes its own version into the client (1.85.4 failed a byte comparison of 1.85.1's)."""
    written = generate(tmp_path)
    assert [p.name for p in written] == list(GENERATED)
    assert differences(written[0].parent, COMMITTED) == [], \
        "the client drifted from api.proto: PYTHONPATH=agent python -m outrider.k8s.podresources.generate"
    assert "Copyright The Kubernetes Authors" in (COMMITTED / "api_pb2.py").read_text()


def proto_changed(tmp_path: Path, edit: Callable[[str], str]) -> Path:
    """The client generated from an edited copy of api.proto; the directory of its two files."""
    source = tmp_path / "src"
    relative = PROTO.relative_to(SOURCE_ROOT)
    (source / relative).parent.mkdir(parents=True)
    (source / relative).write_text(edit(PROTO.read_text()))
    return generate(tmp_path / "out", source_root=source)[0].parent


def test_a_new_field_in_the_proto_is_a_difference(tmp_path: Path) -> None:
    out = proto_changed(tmp_path, lambda t: t.replace("repeated PodResources pod_resources = 1;",
                                                      "repeated PodResources pod_resources = 1;\n    string x = 2;"))
    assert differences(out, COMMITTED) == ["api_pb2.py: the proto's descriptor (messages, fields, services) differs"]


def test_a_new_rpc_is_a_difference_in_both_files(tmp_path: Path) -> None:
    out = proto_changed(tmp_path, lambda t: t.replace(
        "rpc Get(GetPodResourcesRequest)", "rpc Watch(ListPodResourcesRequest) returns (stream "
        "ListPodResourcesResponse) {}\n    rpc Get(GetPodResourcesRequest)"))
    found = differences(out, COMMITTED)
    assert len(found) == 2 and found[0].startswith("api_pb2.py") and found[1].startswith("api_pb2_grpc.py")
    committed_only, generated_only = found[1].split("generated only:")
    assert "'/v1.PodResourcesLister/Watch'" in generated_only and "Watch" not in committed_only


def test_the_generators_version_stamps_are_not_a_difference(tmp_path: Path) -> None:
    """What a newer grpcio-tools changes without a change to the proto: its version in both files."""
    for name in GENERATED:
        text = (COMMITTED / name).read_text()
        text = text.replace("GRPC_GENERATED_VERSION = '1.85.1'", "GRPC_GENERATED_VERSION = '1.99.0'")
        text = text.replace("# Protobuf Python Version: 7.35.1", "# Protobuf Python Version: 7.99.0")
        text = text.replace("    7,\n    35,\n    1,\n", "    7,\n    99,\n    0,\n")
        assert text != (COMMITTED / name).read_text(), f"{name}: the stamps this test rewrites are gone"
        (tmp_path / name).write_text(text)
    assert differences(tmp_path, COMMITTED) == []


def test_the_committed_client_runs_on_every_runtime_the_extras_allow() -> None:
    """The client refuses to import under a grpcio older than the one that generated it, and a protobuf older than
    its gencode: the extras' floors must admit it (regenerating with a newer grpcio-tools means raising them)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def floor(extra: str, package: str) -> tuple[int, ...]:
        spec = next(r for r in project[extra] if re.match(rf"{package}\s*[><=]", r))
        m = re.search(r">=\s*([\d.]+)", spec)
        assert m, f"{extra}: {spec} has no floor"
        return tuple(int(p) for p in m.group(1).split("."))

    versions = generated_versions()
    assert set(versions) == {"grpcio", "protobuf"}
    assert floor("dev", "grpcio") >= versions["grpcio"]
    assert floor("k8s", "protobuf") >= versions["protobuf"]
    assert floor("dev", "protobuf") >= versions["protobuf"]


GRPC_PROBE = """
import sys
from outrider.collectors.base import CollectorContext
from outrider.collectors.gpu import GpuCollector
from outrider.ground.config import load
from outrider.wiring.sampler import SweepStats
import outrider
outrider.instrument()
c = GpuCollector(CollectorContext(load().config, SweepStats()))
c.collect(); c.collect(); c.close()
print("h2" in sys.modules, "outrider.adapters.grpc_client" in sys.modules, "grpc" in sys.modules)
"""


@pytest.mark.parametrize(("socket_set", "expected"), [(False, "False False False"), (True, "True True False")])
def test_the_grpc_client_is_imported_only_when_attribution_is_on(sock: str, tmp_path: Path, socket_set: bool,
                                                                 expected: str) -> None:
    """The hook and an agent without the feature never load the gRPC client (h2); with the feature on, the first
    ask does. grpcio never: the client is outrider.adapters.grpc_client."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_"))}
    env.update(PYTHONPATH=str(REPO / "agent") + os.pathsep + str(REPO), OUTRIDER_SPOOL_DIR=str(tmp_path / "spool"),
               OUTRIDER_NVML_LIBRARY=str(tmp_path / "no-nvml.so"), OUTRIDER_STANDALONE="false")
    if socket_set:
        env["OUTRIDER_K8S_POD_RESOURCES_SOCKET"] = sock
    with FakeKubelet(sock, PODS):
        out = subprocess.run([sys.executable, "-c", GRPC_PROBE], env=env, capture_output=True, text=True,
                             timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == expected
