"""gRPC unary calls over HTTP/2 (h2, pure Python): what the agent needs of gRPC, without grpcio's C++ core.

Two calls use it: the kubelet's PodResources List over a unix socket (outrider.k8s.gpu_owners) and OTLP Export over
TCP or TLS (outrider.exporters.otlp_grpc). Both are unary and seconds apart, so each call opens its own connection,
sends one request, reads one response and closes: no channel state, no reconnect backoff, nothing left behind by a
peer that went away. The whole call, connect and TLS handshake included, ends by its deadline (each read waits at
most what is left of it, so a peer that answers a byte at a time cannot stretch it); a response larger than
max_response_bytes is not read. Every failure is a `GrpcError` whose code is a gRPC status name, as grpcio would
report it (UNAVAILABLE: nothing to connect to, or not HTTP/2; DEADLINE_EXCEEDED; UNIMPLEMENTED; INTERNAL: a
response that is not one gRPC message; the server's own status otherwise).

Measured: h2, hpack and hyperframe are 1.1 MB installed against grpcio's 19 MB and the 2.2 MB of libstdc++ it needs.
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import ssl
import struct
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from outrider.shared.version import __version__

WINDOW = (1 << 31) - 1  # what the server may send before we acknowledge: responses are capped below it anyway
DEFAULT_MAX_RESPONSE_BYTES = 4 << 20  # grpcio's default receive limit
READ_SIZE = 65536
# gRPC over HTTP/2 (PROTOCOL-HTTP2.md): an HTTP status without a grpc-status maps to these codes, others to UNKNOWN.
HTTP_TO_GRPC = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "UNIMPLEMENTED",
                429: "UNAVAILABLE", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "UNAVAILABLE"}
CODES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
         "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
         "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")


class GrpcError(Exception):
    """A failed call: `code` is the gRPC status name, `details` what the server or the transport said. `cut` names
    a call this client ended itself: "deadline" (it passed) or "too_large" (the answer passed the cap)."""

    def __init__(self, code: str, details: str, cut: str = "") -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details
        self.cut = cut


@dataclass(frozen=True)
class Target:
    """Where a call goes: a unix socket (`unix_path`) or host:port, in clear or over TLS (`tls`, ALPN h2)."""

    host: str = ""
    port: int = 0
    unix_path: str = ""
    tls: ssl.SSLContext | None = None

    @property
    def authority(self) -> str:
        return "localhost" if self.unix_path else f"{self.host}:{self.port}"


def unix_target(path: str) -> Target:
    return Target(unix_path=path)


def tcp_target(host: str, port: int, tls: ssl.SSLContext | None = None) -> Target:
    return Target(host=host, port=port, tls=tls)


def tls_context(ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None) -> \
        ssl.SSLContext:
    """A client context that verifies the server (the system's CAs, or ca_file's), optionally with a client
    certificate, offering HTTP/2 by ALPN as gRPC requires."""
    context = ssl.create_default_context(cafile=ca_file)
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(["h2"])
    return context


def call(target: Target, method: str, request: bytes, timeout_s: float,
         metadata: Sequence[tuple[str, str]] = (), compress: bool = False,
         max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> bytes:
    """One unary call of `method` ("/package.Service/Method"): the serialized request in, the serialized response
    out. Raises GrpcError."""
    deadline = time.monotonic() + timeout_s
    sock = _connect(target, deadline)
    try:
        return _exchange(sock, target, method, request, deadline, timeout_s, metadata, compress, max_response_bytes)
    finally:
        with contextlib.suppress(OSError):
            sock.close()


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise GrpcError("DEADLINE_EXCEEDED", "the call's deadline passed", cut="deadline")
    return left


def _connect(target: Target, deadline: float) -> socket.socket:
    where = target.unix_path or target.authority
    try:
        if target.unix_path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(_remaining(deadline))
            try:
                sock.connect(target.unix_path)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((target.host, target.port), timeout=_remaining(deadline))
        if target.tls is None:
            return sock
        try:
            sock.settimeout(_remaining(deadline))
            tls = target.tls.wrap_socket(sock, server_hostname=target.host)
        except BaseException:
            sock.close()
            raise
        if tls.selected_alpn_protocol() != "h2":
            tls.close()
            raise GrpcError("UNAVAILABLE", f"{where} did not agree to HTTP/2 (ALPN h2)")
        return tls
    except TimeoutError:
        raise GrpcError("DEADLINE_EXCEEDED", f"connecting to {where} took longer than the deadline",
                        cut="deadline") from None
    except ssl.SSLError as e:
        raise GrpcError("UNAVAILABLE", f"TLS with {where} failed: {e}") from None
    except OSError as e:
        raise GrpcError("UNAVAILABLE", f"cannot connect to {where}: {e}") from None


def grpc_timeout(timeout_s: float) -> str:
    """The grpc-timeout header: at most 8 digits, in the finest unit that fits."""
    for unit, per_s in (("u", 1_000_000), ("m", 1000), ("S", 1), ("M", 1 / 60), ("H", 1 / 3600)):
        value = max(1, int(timeout_s * per_s))
        if value < 100_000_000:
            return f"{value}{unit}"
    return "99999999H"


def _exchange(sock: socket.socket, target: Target, method: str, request: bytes, deadline: float, timeout_s: float,
              metadata: Sequence[tuple[str, str]], compress: bool, max_response_bytes: int) -> bytes:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.ENABLE_PUSH: 0,
                          h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW})
    conn.increment_flow_control_window(WINDOW - 65535)
    stream = conn.get_next_available_stream_id()
    headers = [(":method", "POST"), (":scheme", "http" if target.tls is None else "https"), (":path", method),
               (":authority", target.authority), ("te", "trailers"), ("content-type", "application/grpc"),
               ("user-agent", f"outrider/{__version__}"), ("grpc-timeout", grpc_timeout(timeout_s)),
               ("grpc-accept-encoding", "identity,gzip")]
    if compress:
        headers.append(("grpc-encoding", "gzip"))
    headers += [(k.lower(), v) for k, v in metadata]
    body = gzip.compress(request, mtime=0) if compress else request
    pending = memoryview(struct.pack(">BI", 1 if compress else 0, len(body)) + body)
    ended = False
    response: dict[str, str] = {}
    trailers: dict[str, str] = {}
    data = bytearray()
    try:
        conn.send_headers(stream, headers)
        while True:
            while pending:  # as much of the request as the server's flow-control windows take now
                size = min(len(pending), conn.local_flow_control_window(stream), conn.max_outbound_frame_size)
                if size <= 0:
                    break
                conn.send_data(stream, pending[:size].tobytes())
                pending = pending[size:]
            if not pending and not ended:
                conn.end_stream(stream)
                ended = True
            _send(sock, conn.data_to_send(), deadline)
            chunk = _recv(sock, deadline)
            if not chunk:
                raise GrpcError("UNAVAILABLE", "the server closed the connection before it answered")
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                    response = dict(event.headers)  # type: ignore[arg-type]  # str, by header_encoding
                elif isinstance(event, h2.events.TrailersReceived) and event.stream_id == stream:
                    trailers = dict(event.headers)  # type: ignore[arg-type]
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                    data += event.data
                    if len(data) > max_response_bytes + 5:
                        raise GrpcError("RESOURCE_EXHAUSTED", f"the response is larger than {max_response_bytes} "
                                                              "bytes: not read", cut="too_large")
                    conn.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == stream:
                    code = "UNAVAILABLE" if event.error_code == 7 else "INTERNAL"  # 7: REFUSED_STREAM
                    raise GrpcError(code, f"the server reset the stream (HTTP/2 error {event.error_code})")
                elif isinstance(event, h2.events.ConnectionTerminated) and (
                        event.last_stream_id is None or event.last_stream_id < stream or event.error_code):
                    raise GrpcError("UNAVAILABLE", f"the server closed the connection (GOAWAY, HTTP/2 error "
                                                   f"{event.error_code})")
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    return _result(response, trailers, bytes(data), max_response_bytes)
    except h2.exceptions.ProtocolError as e:
        raise GrpcError("UNAVAILABLE", f"the server does not speak HTTP/2: {e}") from None
    except TimeoutError:
        raise GrpcError("DEADLINE_EXCEEDED", "no complete answer within the deadline", cut="deadline") from None
    except (ssl.SSLError, OSError) as e:
        raise GrpcError("UNAVAILABLE", f"the connection failed: {e}") from None


def _send(sock: socket.socket, data: bytes, deadline: float) -> None:
    if data:
        sock.settimeout(_remaining(deadline))
        sock.sendall(data)


def _recv(sock: socket.socket, deadline: float) -> bytes:
    sock.settimeout(_remaining(deadline))
    return sock.recv(READ_SIZE)


def _result(response: dict[str, str], trailers: dict[str, str], data: bytes, max_response_bytes: int) -> bytes:
    """The response message, or the error its status says."""
    status = {**response, **trailers}  # a trailers-only response carries grpc-status in its headers
    http = int(response.get(":status", "0") or 0)
    if "grpc-status" not in status:
        if http != 200:
            raise GrpcError(HTTP_TO_GRPC.get(http, "UNKNOWN"), f"HTTP status {http} without a gRPC status")
        raise GrpcError("INTERNAL", "the response carries no grpc-status")
    code = status["grpc-status"]
    name = CODES[int(code)] if code.isdigit() and int(code) < len(CODES) else "UNKNOWN"
    if name != "OK":
        raise GrpcError(name, urllib.parse.unquote(status.get("grpc-message", "")))
    if not response.get("content-type", "").startswith("application/grpc"):
        raise GrpcError("INTERNAL", f"the response is {response.get('content-type')!r}, not application/grpc")
    if len(data) < 5:
        raise GrpcError("INTERNAL", "the response carries no message")
    compressed, length = struct.unpack_from(">BI", data)
    if len(data) != 5 + length:
        raise GrpcError("INTERNAL", "the response is not exactly one gRPC message")
    message = data[5:]
    if compressed:
        encoding = response.get("grpc-encoding", "identity")
        if encoding != "gzip":
            raise GrpcError("INTERNAL", f"a compressed response in {encoding!r}, which was not offered")
        try:
            message = _gunzip(message, max_response_bytes)
        except (OSError, EOFError) as e:
            raise GrpcError("INTERNAL", f"the response does not decompress: {e}") from None
    return message


def _gunzip(data: bytes, limit: int) -> bytes:
    import zlib

    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = d.decompress(data, limit + 1)
    if len(out) > limit:
        raise GrpcError("RESOURCE_EXHAUSTED", f"the decompressed response is larger than {limit} bytes",
                        cut="too_large")
    if not d.eof:
        raise OSError("truncated gzip data")
    return out
