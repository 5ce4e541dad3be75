"""A small HTTP/1.1 server bounded in threads, connections, time and memory: every listener of the agent's (the
/metrics endpoint, exporters/prometheus.py; the OTLP receiver, collectors/otlp_receiver.py) is one.

One loop thread owns the listening socket and every connection that is waiting for something (a TLS handshake
message, a request, room to write); a fixed pool of worker threads does the I/O once a socket is ready. Sockets
are non-blocking, so a worker never waits on a peer: it does what the socket allows (a handshake step, reading
what has arrived, answering every complete request, writing what fits) and hands the connection back to the loop
with a deadline. What a hostile or broken peer can hold is therefore one table slot and a buffer, never a thread:

- TLS handshake and the first request head: `header_timeout_s` from accept; a later request's head:
  `header_timeout_s` from its first byte. A half-sent request or an idle TCP connection is closed at its deadline.
- Between requests on a kept-alive connection: `idle_timeout_s`.
- A response the peer does not read: `write_timeout_s`.
- `max_connections` open at once (at most a quarter of the soft descriptor limit): a new connection evicts the
  least recently active waiting one; with none to evict the loop stops accepting, and new connections wait in the
  listen backlog (`backlog`).
- Out of descriptors (EMFILE, ENFILE) or kernel memory: the loop stops accepting for a pause that doubles from
  50 ms up to 1 s while it lasts, counts each failure by reason (`accept_errors`) and says so once a minute at most;
  it never spins on a listener that stays readable. Waiting connections stay in the backlog until it can accept.
- Memory: a connection buffers at most one request head (`max_header_bytes`), so the server's worst case is
  max_connections x max_header_bytes (8 MiB on the defaults) plus the responses being written.
- Request bodies (a listener that takes them: `max_body_bytes` above 0, such as the OTLP receiver's): a body of
  its Content-Length is read whole before the handler sees it, within the request's clock (`header_timeout_s` from
  its first byte: head and body together), at most `max_body_bytes` (413 beyond; no Content-Length: 411), and the
  bodies held at once, all connections together, within `max_bodies_bytes`: a request that finds no room is
  answered 503 with Retry-After (which OTLP exporters retry) and closed, so a hundred slow uploads cost one budget,
  not a thread and a buffer each. A peer that leaves before its request is whole is counted (`aborted`), never
  traced.

Each response (status line, headers, body) is written with one send, so a kept-alive client never waits on
Nagle's algorithm against its own delayed ACK (about 40 ms per scrape); TCP_NODELAY is set as well.
Only the methods of `Limits.methods` are served (GET and HEAD by default); where bodies are not taken, a request
with one is answered and the connection closed.

A request on a kept-alive plain connection that the `quick` handler can answer at once (a body already rendered
and compressed) is answered by the loop thread itself: it reads what the socket holds, answers, writes what the
socket takes and parks the connection again, with the same deadlines as a worker sets, and a response the peer
does not take at once is left to the write deadline. Handing such a connection to a worker and back cost two
thread wake-ups per scrape, about a fifth of the agent's busy time. Everything else goes to a worker: TLS (its
handshake, and every read and write of a TLS connection, stays off the loop), a first request (accepted
connections go to a worker), a request whose answer is not ready (quick says None), a malformed one, one to be
answered with a close, and pipelined ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import math
import queue
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl

LOG = logging.getLogger("outrider.http_server")


@dataclass(frozen=True)
class Limits:
    workers: int = 4
    max_connections: int = 256
    backlog: int = 512  # the kernel caps it at net.core.somaxconn (4096 on current kernels)
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 120.0  # longer than a 60 s scrape interval, so Prometheus's connection is kept
    write_timeout_s: float = 30.0
    max_header_bytes: int = 32768
    methods: tuple[str, ...] = ("GET", "HEAD")
    max_body_bytes: int = 0  # a request body taken whole up to this (0: bodies are not taken)
    max_bodies_bytes: int = 0  # request bodies held at once, all connections together (0: 4 x max_body_bytes)


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: Mapping[str, str]  # names in lower case; repeated headers joined with ", "
    client: str
    version: str = "HTTP/1.1"
    body: bytes = b""  # whole, where the server takes bodies (Limits.max_body_bytes)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], Response]
QuickHandler = Callable[[Request], "Response | None"]  # None: not at once (a worker calls the handler)


class _BadRequest(Exception):
    def __init__(self, status: int, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(status)
        self.status = status
        self.headers = headers


class _Conn:
    """One connection's state. Owned by the loop while parked in the selector, by one worker while in the queue or
    being served: never by two threads at once."""

    __slots__ = ("awaiting", "body", "body_length", "client", "close_after_write", "deadline", "handshaking", "inbuf",
                 "last_active", "lingering", "out", "pending", "request_started", "reserved", "served", "sock", "tls",
                 "want")

    def __init__(self, sock: socket.socket, client: str, now: float, header_timeout_s: float, tls: bool) -> None:
        self.sock = sock
        self.client = client
        self.handshaking = tls
        self.inbuf = bytearray()
        self.out: list[memoryview] = []  # what is left of the response being written
        self.close_after_write = False
        self.lingering = False
        self.request_started = now  # the first request's clock starts at accept (a silent peer is timed too)
        self.deadline = now + header_timeout_s
        self.last_active = now  # bytes last read, or the last response written
        self.served = 0
        self.want = selectors.EVENT_READ
        self.tls = tls
        self.pending: Request | _BadRequest | None = None  # parsed by the loop, left for a worker to answer
        self.awaiting: Request | None = None  # a request whose body is being read into `body`
        self.body = bytearray()
        self.body_length = 0
        self.reserved = 0  # bytes of the server's bodies budget this connection holds


_PARK, _CLOSE = "park", "close"
_WHOLE = 0  # a request body read to its end (neither selector event)


class _Errors:
    """What a non-blocking socket raises for "not now" and "the peer is gone", with the ssl module's exceptions only
    where TLS is on: a plain server never imports ssl, which loads OpenSSL (about 4 MiB of RSS)."""

    def __init__(self, tls: bool) -> None:
        again: tuple[type[BaseException], ...] = (BlockingIOError, InterruptedError)
        none: tuple[type[BaseException], ...] = ()
        self.want_read = self.want_write = self.tls_closed = none
        self.broken: tuple[type[BaseException], ...] = (OSError,)
        if tls:
            import ssl

            self.want_read, self.want_write = (ssl.SSLWantReadError,), (ssl.SSLWantWriteError,)
            self.tls_closed = (ssl.SSLZeroReturnError, ssl.SSLEOFError)
            self.broken = (OSError, ssl.SSLError)
        self.again_read = again + self.want_read  # nothing to read yet (or TLS needs to read first)
        self.peer_gone: tuple[type[BaseException], ...] = (*self.tls_closed, ConnectionResetError)
        self.again_write = again + self.want_write
FIRST_WRITE = 65536
LINGER_S = 2.0
ACCEPT_PAUSE_MIN_S = 0.05
ACCEPT_PAUSE_MAX_S = 1.0
WARN_EVERY_S = 60.0
# accept() errors that belong to one connection (it went before we took it): the next one is tried at once
_CONNECTION_ERRORS = (errno.ECONNABORTED, errno.EPROTO, errno.EPERM)


def connection_budget(limit: int) -> int:
    """At most a quarter of the soft descriptor limit for connections: the rest is the agent's own (spool shards,
    /proc, exporters)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return limit
    return max(8, min(limit, soft // 4))


class HttpServer:
    """Binds on construction (so a busy port is an error at once); `start()` runs the loop and the workers."""

    def __init__(self, host: str, port: int, handler: Handler, tls: Callable[[], ssl.SSLContext] | None = None,
                 limits: Limits | None = None, quick: QuickHandler | None = None) -> None:
        """tls: gives the TLS context of each new connection, on the loop thread (a rotated certificate's, once
        loaded); quick: answers on the loop thread what it can without waiting (module docstring), else None."""
        self.handler = handler
        self.quick = quick
        self.tls = tls
        self.limits = limits or Limits()
        self._errors = _Errors(tls is not None)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(self.limits.backlog)
            self._listener.setblocking(False)
            bound = self._listener.getsockname()
        except OSError:
            self._listener.close()
            raise
        self._address = (str(bound[0]), int(bound[1]))  # kept: a run's report names it after the server stopped
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._work: queue.SimpleQueue[_Conn | None] = queue.SimpleQueue()
        self._returned: list[tuple[_Conn, str]] = []
        self._lock = threading.Lock()  # guards _returned and _closed
        self._closed = False
        self._live: set[_Conn] = set()  # every open connection (loop thread only)
        self._parked: dict[_Conn, None] = {}  # waiting in the selector (loop thread only)
        self._accepting = False
        self._next_expiry = 0.0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.evicted = 0  # connections closed to make room for a new one
        self.timed_out = 0  # connections closed at a deadline
        self.accept_errors: dict[str, int] = {}  # accept() failures by reason (errno name, lower case)
        self._max_connections = connection_budget(self.limits.max_connections)
        self._paused_until = 0.0  # monotonic time accepting resumes after a failure (0: not paused)
        self._pause_s = 0.0
        self._failures = 0  # accept failures since the last success
        self._warned_at = -WARN_EVERY_S
        self._said_failing = False  # the current run of accept failures was logged (so is its end)
        self._loop_errors = 0
        self.answered_on_loop = 0  # requests the loop thread answered itself
        self.aborted = 0  # requests whose peer went before sending the whole of them
        self.refused: dict[int, int] = {}  # requests the server answered itself, by status (413, 503, ...)
        self._bodies_budget = self.limits.max_bodies_bytes or 4 * self.limits.max_body_bytes
        self._bodies_held = 0
        self._budget_lock = threading.Lock()  # guards _bodies_held and refused (workers and the loop)

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    def start(self) -> None:
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._accepting = True
        self._threads = [threading.Thread(target=self._loop, name="outrider-http", daemon=True)]
        self._threads += [threading.Thread(target=self._worker, name=f"outrider-http-{i}", daemon=True)
                          for i in range(self.limits.workers)]
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._wake()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = []
        if not self._closed:  # never started, or the loop is stuck: close what is left from here
            self._shut()

    # --- the loop ---------------------------------------------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # already woken (the pipe is full), or closed
            self._wake_w.send(b"\0")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                # asleep until the next deadline (or the end of an accept pause), or until a socket, a worker or
                # stop() wakes it: an idle server (one kept-alive connection, scraped every 15 s) never wakes idly
                wake_at = min(self._next_expiry, self._paused_until or math.inf)
                timeout = None if wake_at == math.inf else max(0.0, wake_at - time.monotonic())
                for key, _ in self._selector.select(timeout):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._take_returned()
                    else:
                        conn: _Conn = key.data
                        if not self._answer_on_loop(conn):
                            self._selector.unregister(conn.sock)
                            del self._parked[conn]
                            self._work.put(conn)
                now = time.monotonic()
                if now >= self._next_expiry:
                    self._expire(now)
                if self._paused_until and now >= self._paused_until:
                    self._paused_until = 0.0
                    self._resume_accepting()
                self._loop_errors = 0
            except Exception:  # the loop must outlive anything one connection does, without spinning or flooding
                self._loop_errors += 1
                if self._should_warn():
                    LOG.exception("HTTP server loop (failing %d times in a row)", self._loop_errors)
                time.sleep(min(ACCEPT_PAUSE_MAX_S, 0.01 * 2 ** min(self._loop_errors, 7)))
        self._shut()

    def _should_warn(self) -> bool:
        now = time.monotonic()
        if now - self._warned_at < WARN_EVERY_S:
            return False
        self._warned_at = now
        return True

    def _answer_on_loop(self, conn: _Conn) -> bool:
        """A parked kept-alive plain connection has something to read: answer it here when quick can, and park it
        again; False hands it to a worker (with a request parsed here in conn.pending), which does the rest."""
        if (self.quick is None or conn.tls or conn.lingering or conn.close_after_write or conn.out
                or conn.want != selectors.EVENT_READ or not conn.served or conn.awaiting is not None):
            return False
        try:  # one read: a request head is far smaller than a socket buffer (a second read would only raise)
            chunk = conn.sock.recv(self.limits.max_header_bytes + 1 - len(conn.inbuf))
        except self._errors.again_read:
            chunk = None
        except OSError:
            return False  # a worker closes it, as it closes any connection whose peer is gone
        if chunk == b"":
            return False  # the peer closed
        if chunk:
            now = time.monotonic()
            if not conn.inbuf:  # a later request: its own header clock starts at its first byte
                conn.request_started = now
            conn.last_active = now
            conn.inbuf += chunk
        request = self._parse(conn)
        if request is None:  # a request head still arriving (or nothing): wait on, at the same deadlines
            deadline = (conn.request_started + self.limits.header_timeout_s if conn.inbuf
                        else conn.last_active + self.limits.idle_timeout_s)
            self._repark(conn, selectors.EVENT_READ, deadline)
            return True
        if isinstance(request, _BadRequest) or conn.inbuf:  # an error to answer with a close; pipelined requests
            conn.pending = request
            return False
        try:
            response = self.quick(request)
        except Exception:
            LOG.exception("HTTP quick handler failed for %s", request.path)
            response = None
        keep_alive = _keep_alive(request)
        if response is None or not keep_alive or request.method not in self.limits.methods:
            conn.pending = request
            return False
        if LOG.isEnabledFor(logging.DEBUG):
            LOG.debug("%s %s %s %d (loop)", request.client, request.method, request.path, response.status)
        conn.served += 1
        self.answered_on_loop += 1
        conn.out = _serialise(response, True, head_only=request.method == "HEAD",
                              http10=request.version == "HTTP/1.0")
        if not self._flush(conn):
            self._repark(conn, conn.want, time.monotonic() + self.limits.write_timeout_s)
            return True
        conn.last_active = conn.request_started = time.monotonic()
        self._repark(conn, selectors.EVENT_READ, conn.last_active + self.limits.idle_timeout_s)
        return True

    def _repark(self, conn: _Conn, want: int, deadline: float) -> None:
        """A connection the loop served stays in the selector (registered for reading, as _answer_on_loop takes
        it): what it waits for now, and until when."""
        if want != selectors.EVENT_READ:
            self._selector.modify(conn.sock, want, conn)
        conn.want = want
        conn.deadline = deadline
        self._next_expiry = min(self._next_expiry, deadline)

    def _accept(self) -> None:
        while self._accepting:
            if len(self._live) >= self._max_connections and not self._evict():
                self._stop_accepting()  # the backlog holds the rest until a slot frees
                return
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _CONNECTION_ERRORS:
                    continue
                self._accept_failed(e)  # EMFILE and friends: pause, keep serving the connections we have
                return
            if self._failures:
                if self._said_failing:
                    LOG.warning("HTTP server accepts connections again (after %d failures)", self._failures)
                self._failures, self._pause_s, self._said_failing = 0, 0.0, False
            try:
                sock.setblocking(False)
                if sock.family in (socket.AF_INET, socket.AF_INET6):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.tls is not None:
                    sock = self.tls().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError) as e:
                LOG.debug("HTTP server: dropping a new connection from %s: %s", addr[0], e)
                sock.close()
                continue
            conn = _Conn(sock, str(addr[0]), time.monotonic(), self.limits.header_timeout_s, self.tls is not None)
            self._live.add(conn)
            self._work.put(conn)

    def _accept_failed(self, e: OSError) -> None:
        reason = errno.errorcode.get(e.errno or 0, "error").lower()
        self.accept_errors[reason] = self.accept_errors.get(reason, 0) + 1
        self._failures += 1
        self._pause_s = min(ACCEPT_PAUSE_MAX_S, 2 * self._pause_s) if self._pause_s else ACCEPT_PAUSE_MIN_S
        self._paused_until = time.monotonic() + self._pause_s
        self._stop_accepting()
        if self._should_warn():
            self._said_failing = True
            LOG.warning("HTTP server cannot accept connections: %s; pausing (up to %g s at a time) while it lasts "
                        "(counted in outrider_agent_accept_errors_total; said at most once a minute)", e,
                        ACCEPT_PAUSE_MAX_S)

    def _stop_accepting(self) -> None:
        if self._accepting:
            self._selector.unregister(self._listener)
            self._accepting = False

    def _evict(self) -> bool:
        """Close the least recently active waiting connection; False if every connection is being served."""
        if not self._parked:
            return False
        conn = min(self._parked, key=lambda c: c.last_active)
        self._selector.unregister(conn.sock)
        del self._parked[conn]
        self.evicted += 1  # counted first: whoever sees the close sees the count
        self._close(conn)
        return True

    def _take_returned(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        with self._lock:
            returned, self._returned = self._returned, []
        for conn, action in returned:
            if action == _CLOSE:
                self._close(conn)
                continue
            self._parked[conn] = None
            self._selector.register(conn.sock, conn.want, conn)
            self._next_expiry = min(self._next_expiry, conn.deadline)
        if self._parked:
            self._resume_accepting()  # there is a connection to evict now, for whoever waits in the backlog

    def _expire(self, now: float) -> None:
        """Close parked connections past their deadline, and note when the next one falls due."""
        for conn in [c for c in self._parked if c.deadline <= now]:
            self._selector.unregister(conn.sock)
            del self._parked[conn]
            self.timed_out += 1
            self._close(conn)
        self._next_expiry = min((c.deadline for c in self._parked), default=math.inf)

    def _close(self, conn: _Conn) -> None:
        self._live.discard(conn)
        self._release(conn)
        with contextlib.suppress(OSError):
            conn.sock.close()
        self._resume_accepting()

    def _resume_accepting(self) -> None:
        """Accept again, unless paused after a failure, stopping, or full with no waiting connection to evict."""
        if self._accepting or self._stop.is_set() or self._paused_until:
            return
        if len(self._live) >= self._max_connections and not self._parked:
            return
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._accepting = True

    def _shut(self) -> None:
        with self._lock:
            self._closed = True
            returned, self._returned = self._returned, []
        for conn in list(self._live) + [c for c, _ in returned]:
            with contextlib.suppress(OSError):
                conn.sock.close()
        self._live.clear()
        self._parked.clear()
        for _ in range(self.limits.workers):
            self._work.put(None)
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()
        self._selector.close()

    # --- the workers ------------------------------------------------------------------------------------------------

    def _worker(self) -> None:
        while True:
            conn = self._work.get()
            if conn is None:
                return
            try:
                action = self._advance(conn)
            except Exception as e:  # a broken peer (reset, bad TLS) or a handler bug: that connection only
                LOG.debug("HTTP connection from %s: %s: %s", conn.client, type(e).__name__, e)
                action = _CLOSE
            with self._lock:
                if self._closed:
                    conn.sock.close()
                    continue
                self._returned.append((conn, action))
            self._wake()

    def _park(self, conn: _Conn, want: int, deadline: float) -> str:
        conn.want = want
        conn.deadline = deadline
        return _PARK

    def _advance(self, conn: _Conn) -> str:
        """Do everything the socket allows now; returns whether to park the connection or close it."""
        if conn.handshaking:
            try:
                conn.sock.do_handshake()  # type: ignore[attr-defined]  # an SSLSocket: handshaking only with TLS
            except self._errors.want_read:
                return self._park(conn, selectors.EVENT_READ, conn.deadline)
            except self._errors.want_write:
                return self._park(conn, selectors.EVENT_WRITE, conn.deadline)
            conn.handshaking = False
        if conn.out and not self._flush(conn):
            return self._park(conn, conn.want, conn.deadline)
        if conn.lingering or conn.close_after_write:
            return self._linger(conn)
        while True:
            if conn.awaiting is not None:  # its body is on its way
                state = self._fill_body(conn)
                if state is None:
                    self.aborted += 1  # the peer left mid-request: counted, not traced
                    return _CLOSE
                if state != _WHOLE:
                    return self._park(conn, state, conn.request_started + self.limits.header_timeout_s)
                request: Request | _BadRequest = dataclasses.replace(conn.awaiting, body=bytes(conn.body))
                conn.awaiting, conn.body = None, bytearray()
            else:
                parsed, conn.pending = conn.pending, None
                if parsed is None:
                    parsed = self._parse(conn)
                if parsed is None:
                    was_empty = not conn.inbuf
                    got, eof, want = self._fill(conn)
                    if got:
                        conn.last_active = time.monotonic()
                        if was_empty and conn.served:  # a later request: its header clock starts at its first byte
                            conn.request_started = time.monotonic()
                        continue
                    if eof:
                        if conn.inbuf:
                            self.aborted += 1
                        return _CLOSE
                    if conn.inbuf or not conn.served:
                        return self._park(conn, want, conn.request_started + self.limits.header_timeout_s)
                    return self._park(conn, want, conn.last_active + self.limits.idle_timeout_s)
                request = parsed
                if self.limits.max_body_bytes and isinstance(request, Request) and _has_body(request):
                    refused = self._expect_body(conn, request)
                    if refused is None:
                        continue  # its body next
                    request = refused
            response, keep_alive = self._respond(request)
            self._release(conn)  # the body's bytes are the handler's no longer
            conn.served += 1
            conn.out = response
            conn.close_after_write = not keep_alive
            if not self._flush(conn):
                return self._park(conn, conn.want, time.monotonic() + self.limits.write_timeout_s)
            if not keep_alive:
                return self._linger(conn)
            conn.last_active = conn.request_started = time.monotonic()

    def _expect_body(self, conn: _Conn, request: Request) -> _BadRequest | None:
        """Make ready to read the request's body (None), or why it is refused: no Content-Length (chunked bodies are
        not taken), a method not served, a body over max_body_bytes, or no room in the bodies budget now."""
        if "transfer-encoding" in request.headers:
            return _BadRequest(411)
        try:
            length = int(request.headers.get("content-length", ""))
        except ValueError:
            return _BadRequest(400)
        if length < 0:
            return _BadRequest(400)
        if request.method not in self.limits.methods:
            return _BadRequest(405, (("Allow", ", ".join(self.limits.methods)),))
        if length > self.limits.max_body_bytes:
            return _BadRequest(413)
        with self._budget_lock:
            if self._bodies_held + length > self._bodies_budget:
                return _BadRequest(503, (("Retry-After", "1"),))
            self._bodies_held += length
        conn.reserved = length
        conn.awaiting, conn.body_length = request, length
        conn.body = bytearray(conn.inbuf[:length])  # what came with the head
        del conn.inbuf[:length]
        return None

    def _fill_body(self, conn: _Conn) -> int | None:
        """Read the body on: _WHOLE once it is all in, what to wait for while it is not, None if the peer left."""
        while len(conn.body) < conn.body_length:
            try:
                chunk = conn.sock.recv(min(65536, conn.body_length - len(conn.body)))
            except self._errors.again_read:
                return selectors.EVENT_READ
            except self._errors.want_write:
                return selectors.EVENT_WRITE
            except self._errors.peer_gone:
                return None
            if not chunk:
                return None
            conn.body += chunk
            conn.last_active = time.monotonic()
        return _WHOLE

    def _release(self, conn: _Conn) -> None:
        """Give back the bodies budget a connection holds (its request answered, or the connection closed)."""
        if conn.reserved:
            with self._budget_lock:
                self._bodies_held -= conn.reserved
            conn.reserved = 0
            conn.awaiting, conn.body = None, bytearray()

    def _linger(self, conn: _Conn) -> str:
        """Close after a response: send FIN, then read and drop what the peer still sends until it closes (or
        LINGER_S passes), since closing with unread input makes the kernel send a reset that can destroy the
        response before the peer reads it (a 431 answered while the header is still arriving)."""
        if not conn.lingering:
            conn.lingering = True
            conn.inbuf.clear()
            conn.deadline = time.monotonic() + LINGER_S
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                return _CLOSE
        for _ in range(16):  # at most 16 x 64 KiB per turn; the deadline bounds the rest
            try:
                if not conn.sock.recv(65536):
                    return _CLOSE
            except self._errors.again_read:
                return self._park(conn, selectors.EVENT_READ, conn.deadline)
            except self._errors.broken:
                return _CLOSE
        return self._park(conn, selectors.EVENT_READ, conn.deadline)

    def _fill(self, conn: _Conn) -> tuple[bool, bool, int]:
        """Read what has arrived: (got any bytes, peer closed, what to wait for next)."""
        got = False
        while len(conn.inbuf) <= self.limits.max_header_bytes:
            try:  # never more than a request head's worth: a connection's buffer is bounded by max_header_bytes
                chunk = conn.sock.recv(self.limits.max_header_bytes + 1 - len(conn.inbuf))
            except self._errors.again_read:
                return got, False, selectors.EVENT_READ
            except self._errors.want_write:
                return got, False, selectors.EVENT_WRITE
            except self._errors.peer_gone:
                return got, True, selectors.EVENT_READ
            if not chunk:
                return got, True, selectors.EVENT_READ
            conn.inbuf += chunk
            got = True
        return got, False, selectors.EVENT_READ

    def _flush(self, conn: _Conn) -> bool:
        """Write what the socket takes; True once the whole response is out."""
        while conn.out:
            try:
                sent = conn.sock.send(conn.out[0])
            except self._errors.again_write:
                conn.want = selectors.EVENT_WRITE
                return False
            except self._errors.want_read:
                conn.want = selectors.EVENT_READ
                return False
            rest = conn.out[0][sent:]
            if rest:
                conn.out[0] = rest
            else:
                del conn.out[0]
        return True

    def _parse(self, conn: _Conn) -> Request | _BadRequest | None:
        buf = conn.inbuf
        while buf[:2] == b"\r\n" or buf[:1] == b"\n":  # RFC 9112 2.2: ignore empty lines before a request
            del buf[:2 if buf[:2] == b"\r\n" else 1]
        end = buf.find(b"\r\n\r\n")
        size = end + 4
        if end < 0:
            end = buf.find(b"\n\n")
            size = end + 2
        if end < 0:
            return _BadRequest(431) if len(buf) > self.limits.max_header_bytes else None
        if end > self.limits.max_header_bytes:
            return _BadRequest(431)
        head = bytes(buf[:end]).decode("latin-1")
        del buf[:size]
        lines = head.replace("\r\n", "\n").split("\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1]:
            return _BadRequest(400)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip() or " " in name or "\t" in name:
                return _BadRequest(400)
            key = name.lower()
            value = value.strip(" \t")
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        return Request(parts[0], parts[1], headers, conn.client, parts[2])

    def _respond(self, request: Request | _BadRequest) -> tuple[list[memoryview], bool]:
        """The response as buffers to write in order, and whether the connection stays open."""
        if isinstance(request, _BadRequest):
            with self._budget_lock:
                self.refused[request.status] = self.refused.get(request.status, 0) + 1
            return _serialise(Response(request.status, HTTPStatus(request.status).phrase.encode() + b"\n",
                                       request.headers), False, head_only=False), False
        http10 = request.version == "HTTP/1.0"
        keep_alive = _keep_alive(request, body_read=bool(self.limits.max_body_bytes))
        if request.method not in self.limits.methods:
            response = Response(405, b"method not allowed\n", (("Allow", ", ".join(self.limits.methods)),))
            keep_alive = False
        else:
            try:
                response = self.handler(request)
            except Exception:
                LOG.exception("HTTP handler failed for %s", request.path)
                response = Response(500, b"internal error\n")
        if LOG.isEnabledFor(logging.DEBUG):
            LOG.debug("%s %s %s %d", request.client, request.method, request.path, response.status)
        return _serialise(response, keep_alive, head_only=request.method == "HEAD", http10=http10), keep_alive


def _keep_alive(request: Request, body_read: bool = False) -> bool:
    """Whether the connection stays open after this request's response (body_read: the server read its body)."""
    connection = request.headers.get("connection", "").lower()
    http10 = request.version == "HTTP/1.0"  # closes unless it asks to keep the connection
    keep_alive = "keep-alive" in connection if http10 else "close" not in connection
    if not body_read and _has_body(request):
        keep_alive = False  # a body we do not read: answer, then close rather than parse it as a request
    return keep_alive


def _has_body(request: Request) -> bool:
    return request.headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in request.headers


_PHRASES = {status.value: status.phrase for status in HTTPStatus}
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_date: tuple[int, str] = (0, "")


def http_date(now: float) -> str:
    """The Date header's IMF-fixdate (RFC 9110 5.6.7), in English whatever the locale; formatted once a second.
    (email.utils.formatdate does the same, and importing the email package cost 1 MiB of RSS.)"""
    global _date
    second = int(now)
    if _date[0] != second:
        t = time.gmtime(second)
        _date = (second, f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
                         f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")
    return _date[1]


def _serialise(response: Response, keep_alive: bool, head_only: bool, http10: bool = False) -> list[memoryview]:
    """Status line and headers with the start of the body in one buffer, so a response up to FIRST_WRITE bytes is
    one write; the rest of a larger body stays a view of the handler's bytes (the exposition, shared by every
    scrape of a sweep), so a client that reads slowly holds no copy of it."""
    phrase = _PHRASES.get(response.status, "")
    lines = [f"HTTP/1.1 {response.status} {phrase}", "Server: outrider", f"Date: {http_date(time.time())}"]
    lines += [f"{k}: {v}" for k, v in response.headers]
    if not any(k.lower() == "content-type" for k, _ in response.headers):
        lines.append("Content-Type: text/plain; charset=utf-8")
    lines.append(f"Content-Length: {len(response.body)}")
    if not keep_alive:
        lines.append("Connection: close")
    elif http10:
        lines.append("Connection: keep-alive")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    if head_only:
        return [memoryview(head)]
    body = memoryview(response.body)
    out = [memoryview(head + body[:FIRST_WRITE])]
    if len(body) > FIRST_WRITE:
        out.append(body[FIRST_WRITE:])
    return out
