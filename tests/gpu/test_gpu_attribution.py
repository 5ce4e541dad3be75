"""GPU -> pod attribution: the GPU collector over the fake libnvidia-ml.so.1, asking a real gRPC server that speaks the
kubelet's PodResources v1 API on a unix socket (tests/fakes/kubelet.py stands in for the kubelet)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.gpu import GpuCollector
from outrider.ground.config import Config, ConfigError
from outrider.k8s.gpu_owners import GpuOwners
from outrider.wiring.sampler import SweepStats
from tests.fakes.kubelet import FakeKubelet, NotGrpcSocket, pod, short_socket_dir
from tests.gpu.conftest import Scenario, _open, sweep
from tests.gpu.test_gpu_collector import FULL, G0, G1
from tests.helpers import AgentProcess, samples, value, wait_until
from tests.servers import OtlpHttpReceiver, attributes, otlp_points

# GPU 0 whole to a training pod; GPU 1 in MIG mode, one MIG device to a serving pod, the other unallocated.
SCENARIO = FULL.replace("gpu 1 util_mem 0", "gpu 1 util_mem 0\ngpu 1 mig_mode 1") + """
gpu 1 max_mig 7
gpu 1 mig 0 8
gpu 1 mig 1 9
gpu 8 uuid MIG-aaaa
gpu 8 gpu_instance 1
gpu 8 memory_total 10737418240
gpu 8 memory_used 1073741824
gpu 8 memory_free 9663676416
gpu 9 uuid MIG-bbbb
gpu 9 gpu_instance 5
gpu 9 memory_total 10737418240
gpu 9 memory_used 0
gpu 9 memory_free 10737418240
gpu 0 proc 4242 2147483648 50
gpu 1 proc 5151 1073741824 -1 1
gpu 1 proc 6161 4096 -1 5
"""
PODS = [
    pod("research", "train-0", {"trainer": [("nvidia.com/gpu", ["GPU-0"])], "logger": []}),
    pod("serving", "llm-0", {"server": [("nvidia.com/mig-1g.10gb", ["MIG-aaaa"])]}),
]
TRAIN = {"exported_namespace": "research", "exported_pod": "train-0", "exported_container": "trainer"}
LLM = {"exported_namespace": "serving", "exported_pod": "llm-0", "exported_container": "server"}


@pytest.fixture
def sock() -> Iterator[str]:
    with short_socket_dir() as d:
        yield os.path.join(d, "kubelet.sock")


def collector(lib: str, sock: str, **config: object) -> GpuCollector:
    c = GpuCollector(CollectorContext(Config(nvml_library=lib, k8s_pod_resources_socket=sock, **config),  # type: ignore[arg-type]
                                      SweepStats()))
    _open.append(c)
    return c


def test_owner_labels_on_every_gpu_mig_and_process_series(fake_nvml: dict[str, str], scenario: Scenario,
                                                           sock: str) -> None:
    scenario.write(SCENARIO)
    with FakeKubelet(sock, PODS):
        parsed = sweep(collector(fake_nvml["full"], sock))
    assert value(parsed, "outrider_gpu_utilization_ratio", **G0, task="general", **TRAIN) == 0.87
    assert value(parsed, "outrider_gpu_up", **G0, **TRAIN) == 1
    gpu0 = [labels for (name, labels) in parsed if name.startswith("outrider_gpu_") and ("gpu", "0") in labels]
    assert len(gpu0) > 40 and all(set(TRAIN.items()) <= set(labels) for labels in gpu0), \
        "every series of GPU 0 names its owner"
    assert value(parsed, "outrider_gpu_process_memory_bytes", **G0, pid="4242", name="", **TRAIN) == 2147483648
    assert value(parsed, "outrider_gpu_up", **G1) == 1, "GPU 1 as a whole belongs to no pod: no owner labels"
    mig = {"mig_uuid": "MIG-aaaa", "gpu_instance": "1"}
    assert value(parsed, "outrider_gpu_mig_memory_used_bytes", **G1, **mig, **LLM) == 1 << 30
    assert value(parsed, "outrider_gpu_mig_memory_used_bytes", **G1, mig_uuid="MIG-bbbb", gpu_instance="5") == 0
    assert value(parsed, "outrider_gpu_process_memory_bytes", **G1, pid="5151", name="", **LLM) == 1 << 30, \
        "a process on a MIG device: that device's owner"
    assert value(parsed, "outrider_gpu_process_memory_bytes", **G1, pid="6161", name="") == 4096
    assert value(parsed, "outrider_k8s_podresources_errors_total") is None, "no failures, no error series"


def test_owner_label_names_come_from_the_config(fake_nvml: dict[str, str], scenario: Scenario, sock: str) -> None:
    scenario.write(SCENARIO)
    with FakeKubelet(sock, PODS):
        parsed = sweep(collector(fake_nvml["full"], sock, k8s_owner_namespace_label="workload_namespace",
                                 k8s_owner_pod_label="workload_pod", k8s_owner_container_label="workload_container"))
    assert value(parsed, "outrider_gpu_up", **G0, workload_namespace="research", workload_pod="train-0",
                 workload_container="trainer") == 1


@pytest.mark.parametrize(("key", "name"), [("k8s_owner_pod_label", "uuid"), ("k8s_owner_container_label", "task"),
                                           ("k8s_owner_pod_label", "exported_namespace")])
def test_an_owner_label_name_that_clashes_is_a_config_error(fake_nvml: dict[str, str], sock: str, key: str,
                                                            name: str) -> None:
    with pytest.raises(ConfigError, match=key):
        collector(fake_nvml["full"], sock, **{key: name})


@pytest.mark.parametrize("fault", ["missing", "timeout", "invalid_response", "unavailable"])
def test_a_kubelet_that_cannot_answer_leaves_the_gpu_series_unlabelled_and_counts_it(
        fake_nvml: dict[str, str], scenario: Scenario, sock: str, fault: str) -> None:
    scenario.write(SCENARIO)
    server: FakeKubelet | NotGrpcSocket | None = None
    if fault == "timeout":
        server = FakeKubelet(sock, PODS, delay_s=30)
    elif fault == "invalid_response":
        server = FakeKubelet(sock, garbage=True)
    elif fault == "unavailable":
        server = NotGrpcSocket(sock)
    try:
        c = collector(fake_nvml["full"], sock, k8s_pod_resources_timeout_s=0.3)
        parsed = sweep(c)
    finally:
        if server is not None:
            server.stop()
    assert value(parsed, "outrider_gpu_utilization_ratio", **G0, task="general") == 0.87, "the series stay"
    assert not [k for k in parsed if any(n.startswith("exported_") for n, _ in k[1])], "without owner labels"
    assert value(parsed, "outrider_k8s_podresources_errors_total", reason=fault) == 1
    assert c.errors >= 1, "counted in the collector's errors too"


def test_labels_come_back_when_the_kubelet_does(fake_nvml: dict[str, str], scenario: Scenario, sock: str) -> None:
    scenario.write(SCENARIO)
    now = [0.0]
    owners = GpuOwners(sock, timeout_s=2, ttl_s=10, clock=lambda: now[0])
    c = GpuCollector(CollectorContext(Config(nvml_library=fake_nvml["full"], k8s_pod_resources_socket=sock),
                                      SweepStats()), owners=owners)
    _open.append(c)
    assert value(sweep(c), "outrider_gpu_up", **G0) == 1
    with FakeKubelet(sock, PODS):
        now[0] = 10.0
        parsed = sweep(c)
    assert value(parsed, "outrider_gpu_up", **G0, **TRAIN) == 1
    assert value(parsed, "outrider_k8s_podresources_errors_total", reason="missing") == 1, "the earlier failure"


def test_agent_exports_the_owner_on_metrics_and_otlp(fake_nvml: dict[str, str], scenario: Scenario, sock: str,
                                                     tmp_path: Path) -> None:
    """The real agent, the fake driver by soname, the fake kubelet: /metrics carries the owner labels, and OTLP the
    semantic-convention attributes k8s.namespace.name, k8s.pod.name, k8s.container.name (none where no owner)."""
    scenario.write(SCENARIO)
    env = {"LD_LIBRARY_PATH": os.path.dirname(fake_nvml["full"]), "FAKE_NVML_SCENARIO": str(scenario.path),
           "OUTRIDER_K8S_POD_RESOURCES_SOCKET": sock, "OTEL_METRIC_EXPORT_INTERVAL": "500"}
    with FakeKubelet(sock, PODS), OtlpHttpReceiver() as receiver:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        with AgentProcess("--no-collector.process", env=env) as agent:
            parsed = wait_until(lambda: (lambda p: p if value(p, "outrider_gpu_up", **G0, **TRAIN) else None)(
                samples(agent.metrics())), timeout_s=30, what="owner labels on /metrics")
            assert value(parsed, "outrider_gpu_mig_memory_used_bytes", **G1, mig_uuid="MIG-aaaa", gpu_instance="1",
                         **LLM) == 1 << 30
            assert value(parsed, "outrider_gpu_up", **G1) == 1
            points = wait_until(lambda: otlp_points(receiver.requests).get("hw.gpu.utilization"), timeout_s=30,
                                what="an OTLP export with GPU utilisation")
    by_gpu = {attributes(p.attributes)["hw.id"]: attributes(p.attributes) for _, p in points}
    assert by_gpu["GPU-0"]["k8s.namespace.name"] == "research"
    assert by_gpu["GPU-0"]["k8s.pod.name"] == "train-0"
    assert by_gpu["GPU-0"]["k8s.container.name"] == "trainer"
    assert not {k for k in by_gpu["GPU-1"] if k.startswith("k8s.")}, "no empty owner attributes"
    mig = {attributes(p.attributes).get("outrider.gpu.mig.uuid"): attributes(p.attributes)
           for _, p in otlp_points(receiver.requests)["outrider.gpu.mig.memory.usage"]}
    assert mig["MIG-aaaa"]["k8s.pod.name"] == "llm-0"
