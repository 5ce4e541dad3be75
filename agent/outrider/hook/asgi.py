"""ASGI middleware (FastAPI, Starlette, any ASGI server): request duration by route template and status class,
in-flight requests, and for streamed responses the time to first chunk (first token) and between chunks.

    app = OutriderMiddleware(app)                  # or app.add_middleware(OutriderMiddleware)

The route label is the matched route's template (Starlette puts the route in the scope), never the raw path, so
/items/123 and /items/456 are one series; unmatched requests are labelled "unmatched".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from time import perf_counter
from typing import Any

from outrider.hook import api

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def route_of(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None) or getattr(route, "path_format", None)
    return str(path) if path else "unmatched"


class OutriderMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        api.instrument()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        start = perf_counter()
        status = [500]
        chunks = [0, 0.0]  # count of body chunks, time of the previous one
        in_flight = api.in_flight("all")
        in_flight.add(1)

        async def send_wrapper(message: Message) -> None:
            try:
                kind = message.get("type")
                if kind == "http.response.start":
                    status[0] = int(message.get("status", 500))
                elif kind == "http.response.body" and (message.get("more_body") or chunks[0]):
                    now = perf_counter()
                    if chunks[0] == 0:
                        api.record_time_to_first_token(now - start, route_of(scope))
                    else:
                        api.record_inter_token_latency(now - chunks[1], route_of(scope))
                    chunks[0] += 1
                    chunks[1] = now
            except Exception:
                pass
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            in_flight.add(-1)
            api.record_request(perf_counter() - start, route_of(scope), status[0])
