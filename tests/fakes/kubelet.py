"""A kubelet's PodResources endpoint for tests: a real gRPC server (grpcio) speaking the published v1 API through the
generated code (outrider.k8s.podresources), on a unix socket in the test's own directory.

It stands in for the kubelet, which cannot run here. Its faults are the ones an agent meets on a node: `delay_s`
answers late (past the client's deadline), `garbage` answers List with bytes that are not a ListPodResourcesResponse,
`serve_nothing` runs a gRPC server without the PodResources service (an old kubelet: UNIMPLEMENTED), and `refuse`
answers List with that gRPC status (a kubelet that denies the agent, say).
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
from collections.abc import Iterable, Mapping
from concurrent import futures
from typing import Any

import grpc

from outrider.k8s.podresources import api_pb2, api_pb2_grpc

# {container: [(resource name, [device ids])]}
Containers = Mapping[str, Iterable[tuple[str, Iterable[str]]]]


def pod(namespace: str, name: str, containers: Containers) -> Any:
    return api_pb2.PodResources(name=name, namespace=namespace, containers=[
        api_pb2.ContainerResources(name=cname, devices=[
            api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids)) for resource, ids in devices])
        for cname, devices in containers.items()])


def short_socket_dir() -> tempfile.TemporaryDirectory[str]:
    """A unix socket path must fit in 107 bytes: pytest's tmp_path can be longer, so the socket gets its own short
    temporary directory (removed by the caller's cleanup)."""
    return tempfile.TemporaryDirectory(prefix="k8s-", dir="/tmp")


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, socket_path: str, pods: Iterable[Any] = (), delay_s: float = 0.0, garbage: bool = False,
                 serve_nothing: bool = False, refuse: grpc.StatusCode | None = None) -> None:
        self.socket_path = socket_path
        self.pods = list(pods)
        self.delay_s = delay_s
        self.refuse = refuse
        self.requests = 0
        self._release = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        if garbage:
            handler = grpc.unary_unary_rpc_method_handler(self._garbage)  # no serializers: raw bytes go out
            self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
                "v1.PodResourcesLister", {"List": handler}),))
        elif not serve_nothing:
            api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        if self._server.add_insecure_port(f"unix://{socket_path}") == 0:
            raise RuntimeError(f"cannot listen on {socket_path}")
        self._server.start()

    def List(self, request: Any, context: Any) -> Any:  # the generated servicer's method name
        self.requests += 1
        if self.refuse is not None:
            context.abort(self.refuse, "the kubelet says no")
        if self.delay_s:
            self._release.wait(self.delay_s)
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)

    def _garbage(self, request: bytes, context: Any) -> bytes:
        self.requests += 1
        return b"\xff\xff\xff\xff\x0f not a protobuf message"

    def stop(self) -> None:
        self._release.set()
        self._server.stop(grace=0).wait(5)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def __enter__(self) -> FakeKubelet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NotGrpcSocket:
    """A unix socket that accepts and answers with bytes that are not HTTP/2: something else at the kubelet's path."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(socket_path)
        self._sock.listen(8)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\nthis is not a kubelet\n")

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._sock.close()
        self._thread.join(5)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def __enter__(self) -> NotGrpcSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
