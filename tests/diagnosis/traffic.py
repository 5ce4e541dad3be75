"""What a service under test talks to, from the test's own process (outside the watched tree): the downstream
service it calls, which answers after the delay asked for (`GET /wait?ms=50`), and a client that sends requests
at a known rate and times each one itself."""

from __future__ import annotations

import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType


class _Slow(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        time.sleep(float(query.get("ms", ["0"])[0]) / 1000)
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class Downstream:
    """A downstream service on 127.0.0.1 (a thread per request): `url` answers after `ms` milliseconds."""

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/wait"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Downstream:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.server.shutdown()
        self.server.server_close()


def drive(url: str, rate: float, going: Callable[[], bool], concurrency: int = 32) -> list[float]:
    """Requests to `url` at `rate` a second (each sent at its time, whatever the others are doing, up to
    `concurrency` at once) while `going()`; each one's latency as the client timed it (failed ones left out)."""
    latencies: list[float] = []

    def one() -> None:
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                r.read()
        except OSError:
            return
        latencies.append(time.perf_counter() - t0)

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        sent = 0
        while going():
            due = start + sent / rate
            now = time.monotonic()
            if due > now:
                time.sleep(min(due - now, 0.05))
                continue
            pool.submit(one)
            sent += 1
    return latencies
