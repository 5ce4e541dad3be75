"""ASGI middleware (FastAPI, Starlette, any ASGI server): request duration by route template, method, scheme and
status code, in-flight requests, and for streamed responses the time to first chunk (first token) and between
chunks.

    from outrider import OutriderMiddleware
    app.add_middleware(OutriderMiddleware)         # or app = OutriderMiddleware(app)

The attributes are OpenTelemetry's (http.route, http.request.method, url.scheme, http.response.status_code;
gen_ai.operation.name and gen_ai.provider.name on the streaming latencies, from `gen_ai_operation` and
`gen_ai_provider`). Their values are bounded: the method is one of the nine known ones or _OTHER, the scheme http or
https, the status code 100-599.

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
    def __init__(self, app: ASGIApp, gen_ai_operation: str = api.GEN_AI_OPERATION,
                 gen_ai_provider: str = api.GEN_AI_PROVIDER) -> None:
        self.app = app
        self.gen_ai = (gen_ai_operation, gen_ai_provider)
        api.instrument()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        start = perf_counter()
        status = [500]
        chunks = [0, 0.0]  # count of body chunks, time of the previous one
        method, scheme = str(scope.get("method", "")), str(scope.get("scheme", ""))
        in_flight = api.in_flight("all", method, scheme)
        in_flight.add(1)

        async def send_wrapper(message: Message) -> None:
            try:
                kind = message.get("type")
                if kind == "http.response.start":
                    status[0] = int(message.get("status", 500))
                elif kind == "http.response.body" and message.get("body") and (message.get("more_body") or chunks[0]):
                    # a chunk with content of a streamed response (the empty closing message is no token)
                    now = perf_counter()
                    if chunks[0] == 0:
                        api.record_time_to_first_token(now - start, route_of(scope), *self.gen_ai)
                    else:
                        api.record_inter_token_latency(now - chunks[1], route_of(scope), *self.gen_ai)
                    chunks[0] += 1
                    chunks[1] = now
            except Exception:
                pass
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            in_flight.add(-1)
            api.record_request(perf_counter() - start, route_of(scope), status[0], method, scheme)
