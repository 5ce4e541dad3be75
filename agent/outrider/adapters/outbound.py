"""Outbound HTTP calls (OTLP export, notifications) bounded in total time and in response size.

A socket timeout bounds each read, not a call: a peer that answers one byte every few seconds holds a call for as
long as it likes, and a peer that answers 200 with a gigabyte body is read whole into memory by requests. So every
outbound call runs under a `Deadline`: the sockets it opens (or reuses) are registered with it, and when the
deadline passes a timer thread shuts them down, which ends any blocked connect, handshake or read at once with an
OSError the caller already handles as a failed attempt. Bodies are read to at most a cap; a larger one fails the
call as `ResponseTooLarge`. Callers count both by reason.

Used through two narrow adapters: `bounded_session()` for requests (the OTLP/HTTP exporter takes a session), and
`connection_classes()` for http.client (the notifiers' urllib opener). Nothing here is imported until an outbound
call is configured.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

DEFAULT_MAX_RESPONSE_BYTES = 1 << 20  # no answer the agent reads (OTLP partial success, a webhook's reply) is larger
_current = threading.local()


class DeadlineExceeded(OSError):
    """The call's total deadline passed (its sockets were shut down)."""


class ResponseTooLarge(OSError):
    """The response body was larger than the cap; the connection is closed without reading the rest."""


class Deadline:
    """A total bound on one call made by this thread: sockets registered while it is current are shut down when it
    passes. Use as `with Deadline(10.0) as d: ...`; `d.expired` says whether it cut the call short."""

    def __init__(self, total_s: float) -> None:
        self.total_s = max(0.001, float(total_s))
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._outer: Deadline | None = None
        self._ends = 0.0

    def __enter__(self) -> Deadline:
        self._outer = getattr(_current, "deadline", None)
        _current.deadline = self
        self._ends = time.monotonic() + self.total_s
        self._timer = threading.Timer(self.total_s, self._expire)
        self._timer.daemon = True
        self._timer.name = "outrider-deadline"
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        _current.deadline = self._outer
        with self._lock:
            self._sockets.clear()

    def register(self, sock: Any) -> None:
        with self._lock:
            if self.expired:
                _shut(sock)
            else:
                self._sockets.append(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: Any) -> None:
    with contextlib.suppress(OSError, AttributeError):
        sock.shutdown(socket.SHUT_RDWR)


def register_socket(sock: Any) -> Any:
    """Put `sock` under the calling thread's current deadline, if any; returns it (for use in expressions)."""
    deadline: Deadline | None = getattr(_current, "deadline", None)
    if deadline is not None and sock is not None:
        deadline.register(sock)
    return sock


def root_cause(e: BaseException) -> str:
    """Why a call failed, in a few words: the innermost error it wraps (requests wraps urllib3's, which wraps the
    socket's: "Connection refused", not three class names and an object's address)."""
    seen: set[int] = set()
    inner: BaseException = e
    nxt: BaseException | None = e
    while nxt is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        inner = nxt
        reason = getattr(nxt, "reason", None)
        nxt = nxt.__cause__ or nxt.__context__ or (reason if isinstance(reason, BaseException) else None)
    if isinstance(inner, OSError) and inner.strerror:
        return str(inner.strerror)
    return str(inner) or type(inner).__name__


def read_capped(read: Any, max_bytes: int) -> bytes:
    """Read a body through `read(n)` until it ends, at most max_bytes; ResponseTooLarge past that."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = read(min(65536, max_bytes + 1 - total))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > max_bytes:
            raise ResponseTooLarge(f"response body larger than {max_bytes} bytes")
        chunks.append(chunk)


# --- http.client (the notifiers' urllib opener) -----------------------------------------------------------------
def connection_classes() -> tuple[type[Any], type[Any]]:
    """HTTPConnection and HTTPSConnection subclasses whose sockets are registered with the current deadline as soon
    as they exist, once connected (for HTTPS, the TLS socket) and again on every request (a kept-alive connection
    under a new call)."""
    import http.client

    def create(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
        return register_socket(socket.create_connection(address, *args, **kwargs))  # type: ignore[no-any-return]

    class Registering(http.client.HTTPConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._create_connection = create

        def connect(self) -> None:
            super().connect()
            # HTTPS: the TLS socket that wrapped the one registered at creation (wrapping detached that one, so
            # shutting it down would no longer reach the connection). The handshake itself, in between, is bounded
            # by the socket timeout alone.
            register_socket(self.sock)

        def request(self, *args: Any, **kwargs: Any) -> None:
            register_socket(self.sock)
            super().request(*args, **kwargs)

    class BoundedHTTPSConnection(Registering, http.client.HTTPSConnection):
        pass

    return Registering, BoundedHTTPSConnection


# --- requests / urllib3 (the OTLP/HTTP exporter) ----------------------------------------------------------------
def bounded_session(total_s: float, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                    on_failure: Callable[[str], None] | None = None,
                    on_error: Callable[[str], None] | None = None) -> Any:
    """A requests.Session whose every request runs under Deadline(total_s) and reads at most max_response_bytes of
    body (ResponseTooLarge, a requests ConnectionError subclass for its callers, past that). on_failure("deadline"
    or "too_large") is told of each call cut short, and on_error(why) why each call failed (root_cause of its
    error, or "HTTP 503 Service Unavailable"), for callers (the OTel exporter) that swallow the exception."""
    import requests
    import urllib3
    from requests.adapters import HTTPAdapter

    class BoundedConnection(urllib3.connection.HTTPConnection):
        def _new_conn(self) -> socket.socket:
            return register_socket(super()._new_conn())  # type: ignore[no-any-return]

    class BoundedHTTPSConnection(BoundedConnection, urllib3.connection.HTTPSConnection):
        pass

    class BoundedPool(urllib3.HTTPConnectionPool):
        ConnectionCls = BoundedConnection

        def _make_request(self, conn: Any, *args: Any, **kwargs: Any) -> Any:
            register_socket(getattr(conn, "sock", None))  # a kept-alive connection's socket, under this call
            return super()._make_request(conn, *args, **kwargs)

    class BoundedHTTPSPool(BoundedPool, urllib3.HTTPSConnectionPool):
        ConnectionCls = BoundedHTTPSConnection

    class TooLarge(requests.exceptions.ConnectionError, ResponseTooLarge):
        pass

    class Expired(requests.exceptions.ConnectionError, DeadlineExceeded):
        pass

    class BoundedAdapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = {"http": BoundedPool, "https": BoundedHTTPSPool}

        def send(self, request: Any, stream: bool = False, timeout: Any = None, verify: Any = True, cert: Any = None,
                 proxies: Any = None) -> Any:
            with Deadline(total_s) as deadline:
                try:
                    response = super().send(request, stream=True, timeout=timeout, verify=verify, cert=cert,
                                            proxies=proxies)
                    try:
                        body = read_capped(lambda n: response.raw.read(n, decode_content=True), max_response_bytes)
                    except ResponseTooLarge as e:
                        response.close()
                        if on_failure is not None:
                            on_failure("too_large")
                        raise TooLarge(str(e)) from None
                except TooLarge:
                    raise
                except Exception as e:
                    if deadline.expired:
                        if on_failure is not None:
                            on_failure("deadline")
                        raise Expired(f"no complete answer within {total_s:g} s (the call's total deadline)") from e
                    if on_error is not None:
                        on_error(root_cause(e))
                    raise
            if on_error is not None and not 200 <= response.status_code < 300:
                on_error(f"HTTP {response.status_code} {response.reason or ''}".rstrip())
            response._content = body
            response._content_consumed = True
            return response

    session = requests.Session()
    adapter = BoundedAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
