"""Which Kubernetes workload owns each GPU: the kubelet's PodResources API (v1 List over its unix socket).

The kubelet lists, per container, the devices its device plugins allocated. NVIDIA's plugin names them by resource:
`nvidia.com/gpu` (device ids: GPU UUIDs, or GPU indices with its "index" id strategy) and `nvidia.com/mig-<profile>`
(device ids: MIG device UUIDs). A shared GPU (time-slicing) appears as replicas `UUID::N`, one per container that
holds a share: those containers are all its owners, their distinct names joined with "," in sorted order.

The answer is cached for ttl_s. A failed ask (no socket, kubelet unreachable, past the deadline, a response that
does not decode) is counted by reason and answers {} (no owners) until the next ask, ttl_s later: a missing or
slow kubelet costs at most one deadline per ttl_s, and the GPU series go on without owner labels meanwhile.

The call is gRPC over HTTP/2 on the unix socket (outrider.adapters.grpc_client, on h2: no grpcio), its messages the ones
protoc generates from the published proto (outrider.k8s.podresources.api_pb2, on protobuf). Both are imported on
the first ask: an agent without the feature never loads them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MAX_RESPONSE_BYTES = 16 << 20  # a node with hundreds of pods stays well under this; gRPC's default is 4 MiB
LIST_METHOD = "/v1.PodResourcesLister/List"
DEFAULT_TTL_S = 10.0


@dataclass(frozen=True)
class Owner:
    namespace: str
    pod: str
    container: str

    def labels(self) -> tuple[str, str, str]:
        return self.namespace, self.pod, self.container


def is_gpu_resource(name: str) -> bool:
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def owners_from_response(response: Any) -> dict[str, Owner]:
    """{device id (GPU UUID, MIG UUID, or GPU index): owner} from a ListPodResourcesResponse."""
    holders: dict[str, set[tuple[str, str, str]]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name):
                    continue
                for device_id in devices.device_ids:
                    device = device_id.split("::", 1)[0].strip()  # a time-sliced replica: its GPU
                    if device:
                        holders.setdefault(device, set()).add((pod.namespace, pod.name, container.name))
    return {device: _joined(sorted(owners)) for device, owners in holders.items()}


def _joined(owners: Iterable[tuple[str, str, str]]) -> Owner:
    columns = list(zip(*owners))
    return Owner(*(",".join(dict.fromkeys(column)) for column in columns))


class GpuOwners:
    """Asks the kubelet at most once per ttl_s, with a deadline of timeout_s; `errors` counts failures by reason."""

    def __init__(self, socket_path: str, timeout_s: float, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.socket_path = os.path.abspath(socket_path)
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self.errors: dict[str, int] = {}
        self.asks = 0
        self.last_error = ""  # the reason of the last failure
        self.last_error_text = ""
        self._clock = clock
        self._owners: dict[str, Owner] = {}
        self._next_ask = float("-inf")

    def owners(self) -> Mapping[str, Owner]:
        """Device id -> owner, asked anew when the last answer is older than ttl_s; {} after a failed ask."""
        now = self._clock()
        if now >= self._next_ask:
            self._next_ask = now + self.ttl_s
            self._owners = self._ask()
        return self._owners

    def _ask(self) -> dict[str, Owner]:
        self.asks += 1
        if not os.path.exists(self.socket_path):
            return self._fail("missing", f"{self.socket_path} does not exist (is the kubelet's pod-resources "
                                         "directory mounted into the agent?)")
        try:
            from outrider.adapters import grpc_client
            from outrider.k8s.podresources import api_pb2
        except Exception as e:  # not installed, or older than the generated messages need
            return self._fail("no_grpc", f"the PodResources client cannot load: {e} (pip install 'outrider[k8s]')")
        try:
            answer = grpc_client.call(grpc_client.unix_target(self.socket_path), LIST_METHOD,
                                      api_pb2.ListPodResourcesRequest().SerializeToString(), self.timeout_s,
                                      max_response_bytes=MAX_RESPONSE_BYTES)
        except grpc_client.GrpcError as e:
            return self._fail(_REASONS.get(e.code, "error"), f"PodResources List failed: {e.code}: {e.details}")
        try:
            return owners_from_response(api_pb2.ListPodResourcesResponse.FromString(answer))
        except Exception as e:  # bytes that are not a ListPodResourcesResponse, fields not what the proto says
            return self._fail("invalid_response", f"PodResources List answered something unusable: {e!r}")

    def _fail(self, reason: str, text: str) -> dict[str, Owner]:
        self.errors[reason] = self.errors.get(reason, 0) + 1
        self.last_error, self.last_error_text = reason, text
        return {}

    def close(self) -> None:
        """Nothing to release: each ask is one connection, closed when it is answered."""


# gRPC status -> reason label. INTERNAL is what the client reports when a response is not one gRPC message.
_REASONS = {"DEADLINE_EXCEEDED": "timeout", "UNAVAILABLE": "unavailable", "INTERNAL": "invalid_response",
            "UNIMPLEMENTED": "unimplemented"}
