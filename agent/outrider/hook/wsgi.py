"""WSGI middleware (Flask, Django, gunicorn): request duration by route template and status class, in-flight
requests, and for streamed (iterated) responses the time to first chunk and between chunks.

    app.wsgi_app = OutriderWSGIMiddleware(app.wsgi_app)

The route label comes from `route_getter(environ)`; by default Flask's matched url_rule and Django's resolved
route are used when the framework put them in the environ, else "unmatched": never the raw path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from time import perf_counter
from typing import Any

from outrider.hook import api

Environ = dict[str, Any]


def default_route(environ: Environ) -> str:
    request = environ.get("werkzeug.request")
    rule = getattr(getattr(request, "url_rule", None), "rule", None)
    if rule:
        return str(rule)
    match = environ.get("outrider.route")  # set by the app when it knows the template
    return str(match) if match else "unmatched"


class OutriderWSGIMiddleware:
    def __init__(self, app: Callable[..., Iterable[bytes]],
                 route_getter: Callable[[Environ], str] = default_route) -> None:
        self.app = app
        self.route_getter = route_getter
        api.instrument()

    def __call__(self, environ: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        start = perf_counter()
        status = ["500"]
        in_flight = api.in_flight("all")
        in_flight.add(1)

        def start_response_wrapper(status_line: str, headers: Any, exc_info: Any = None) -> Any:
            status[0] = status_line.split(" ", 1)[0]
            return start_response(status_line, headers, exc_info)

        try:
            body = self.app(environ, start_response_wrapper)
        except BaseException:
            in_flight.add(-1)
            api.record_request(perf_counter() - start, self._route(environ), 500)
            raise
        return self._iterate(body, environ, start, status, in_flight)

    def _route(self, environ: Environ) -> str:
        try:
            return self.route_getter(environ)
        except Exception:
            return "unmatched"

    def _iterate(self, body: Iterable[bytes], environ: Environ, start: float, status: list[str],
                 in_flight: Any) -> Iterator[bytes]:
        count, previous = 0, start
        try:
            for chunk in body:
                now = perf_counter()
                if count == 0:
                    first = now - start
                elif count == 1:
                    api.record_time_to_first_token(first, self._route(environ))
                    api.record_inter_token_latency(now - previous, self._route(environ))
                else:
                    api.record_inter_token_latency(now - previous, self._route(environ))
                count += 1
                previous = now
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
            in_flight.add(-1)
            api.record_request(perf_counter() - start, self._route(environ), status[0])
