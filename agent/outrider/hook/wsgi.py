"""WSGI middleware (Flask, Django, gunicorn): request duration by route template, method, scheme and status code,
in-flight requests, and for streamed (iterated) responses the time to first chunk and between chunks.

    from outrider import OutriderWSGIMiddleware
    app.wsgi_app = OutriderWSGIMiddleware(app.wsgi_app)

Attributes and their bounds as in outrider.hook.asgi (the method one of the nine known ones or _OTHER, the scheme
http or https, the status code 100-599).

The route label comes from `route_getter(environ)`. By default: for a Flask app (its wsgi_app, or the app itself)
the rule its URL map matches ("/predict/<model>"; Flask keeps the matched rule on its request object, not in the
environ, so the middleware asks the same map); else a template the app put in environ["outrider.route"]; else
"unmatched": never the raw path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from time import perf_counter
from typing import Any

from outrider.hook import api
from outrider.hook.series import GaugeSeries

Environ = dict[str, Any]


def default_route(environ: Environ) -> str:
    request = environ.get("werkzeug.request")
    rule = getattr(getattr(request, "url_rule", None), "rule", None)
    if rule:
        return str(rule)
    match = environ.get("outrider.route")  # set by the app when it knows the template
    return str(match) if match else "unmatched"


def flask_route(url_map: Any) -> Callable[[Environ], str]:
    """The route of a Flask (werkzeug) app: the rule its URL map matches for the request."""
    def route(environ: Environ) -> str:
        try:
            return str(url_map.bind_to_environ(environ).match(return_rule=True)[0].rule)
        except Exception:  # NotFound, MethodNotAllowed, a redirect: no rule of the app's serves this path
            return default_route(environ)
    return route


class OutriderWSGIMiddleware:
    def __init__(self, app: Callable[..., Iterable[bytes]],
                 route_getter: Callable[[Environ], str] = default_route, gen_ai_operation: str = api.GEN_AI_OPERATION,
                 gen_ai_provider: str = api.GEN_AI_PROVIDER) -> None:
        self.app = app
        url_map = getattr(getattr(app, "__self__", app), "url_map", None)  # app.wsgi_app is the Flask app's method
        if route_getter is default_route and url_map is not None and hasattr(url_map, "bind_to_environ"):
            route_getter = flask_route(url_map)
        self.route_getter = route_getter
        self.gen_ai = (gen_ai_operation, gen_ai_provider)
        api.instrument()

    def __call__(self, environ: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        start = perf_counter()
        status = ["500"]
        method, scheme = str(environ.get("REQUEST_METHOD", "")), str(environ.get("wsgi.url_scheme", ""))
        in_flight = api.in_flight("all", method, scheme)
        in_flight.add(1)

        def start_response_wrapper(status_line: str, headers: Any, exc_info: Any = None) -> Any:
            status[0] = status_line.split(" ", 1)[0]
            return start_response(status_line, headers, exc_info)

        try:
            body = self.app(environ, start_response_wrapper)
        except BaseException:
            in_flight.add(-1)
            api.record_request(perf_counter() - start, self._route(environ), 500, method, scheme)
            raise
        return self._iterate(body, environ, start, status, in_flight, (method, scheme))

    def _route(self, environ: Environ) -> str:
        try:
            return self.route_getter(environ)
        except Exception:
            return "unmatched"

    def _iterate(self, body: Iterable[bytes], environ: Environ, start: float, status: list[str],
                 in_flight: GaugeSeries, request: tuple[str, str]) -> Iterator[bytes]:
        count, previous = 0, start
        try:
            for chunk in body:
                now = perf_counter()
                if count == 0:
                    first = now - start
                elif count == 1:
                    api.record_time_to_first_token(first, self._route(environ), *self.gen_ai)
                    api.record_inter_token_latency(now - previous, self._route(environ), *self.gen_ai)
                else:
                    api.record_inter_token_latency(now - previous, self._route(environ), *self.gen_ai)
                count += 1
                previous = now
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
            in_flight.add(-1)
            api.record_request(perf_counter() - start, self._route(environ), status[0], *request)
