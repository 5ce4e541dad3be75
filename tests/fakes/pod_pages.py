"""Pods' metrics endpoints for tests: real HTTP servers on loopback addresses (127.0.0.x) in the test's own
process, each serving a page or answering as a test's handler does."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable


class Pages:
    """HTTP servers on loopback addresses in this process, each a pod's endpoint: `serve(ip, page)` serves a page
    (or `answer(handler)` writes the response); `hits` counts each server's requests in the order they came."""

    def __init__(self) -> None:
        self.servers: list[http.server.ThreadingHTTPServer] = []
        self.hits: list[str] = []
        self.release = threading.Event()

    def serve(self, ip: str, page: str | None = None,
              answer: Callable[[http.server.BaseHTTPRequestHandler], None] | None = None, status: int = 200) -> int:
        body = (page or "").encode()
        pages = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                pages.hits.append(f"{ip}{self.path}")
                if answer is not None:
                    answer(self)
                    return
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer((ip, 0), Handler)
        server.block_on_close = False
        threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
        self.servers.append(server)
        return int(server.server_address[1])

    def hang(self, h: http.server.BaseHTTPRequestHandler) -> None:
        self.release.wait(30)

    def close(self) -> None:
        self.release.set()
        for s in self.servers:
            s.shutdown()
            s.server_close()

    def __enter__(self) -> Pages:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
