"""Outrider's service middlewares in real servers: FastAPI under uvicorn (OutriderMiddleware) and Flask under a WSGI
server (OutriderWSGIMiddleware), both imported as users do (`from outrider import ...`), real HTTP requests, then
the agent's /metrics and its OTLP export show them with the OpenTelemetry HTTP attributes (the world is in
conftest.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO, value
from tests.integration.conftest import FASTAPI_OK, FLASK_OK, ServiceWorld
from tests.servers import attributes

pytestmark = pytest.mark.integration


def test_fastapi_under_uvicorn_shows_on_metrics_by_route_method_scheme_and_status(services: ServiceWorld) -> None:
    m = services.metrics()
    assert value(m, "outrider_requests_total", **FASTAPI_OK) == 3  # the warm-up and two more
    assert not any("/items/1" in str(labels) for _, labels in m), "the route template, never the raw path"
    assert value(m, "outrider_requests_total", route="/busy", method="GET", scheme="http", status_code="503",
                 status_class="5xx") == 1
    assert value(m, "outrider_requests_total", route="unmatched", method="GET", scheme="http", status_code="404",
                 status_class="4xx") == 1
    assert value(m, "outrider_requests_total", route="/items/{item_id}", method="_OTHER", scheme="http",
                 status_code="405", status_class="4xx") == 1, "an unknown method is _OTHER: a bounded label"
    chat = {"route": "/v1/chat", "operation": "chat", "provider": "vllm"}
    assert value(m, "outrider_inference_time_to_first_token_seconds_count", **chat) == 1
    assert value(m, "outrider_inference_inter_token_latency_seconds_count", **chat) == 2
    assert value(m, "outrider_requests_in_flight", route="all", method="GET", scheme="http") == 0


def test_flask_under_a_wsgi_server_shows_on_metrics(services: ServiceWorld) -> None:
    m = services.metrics()
    assert value(m, "outrider_requests_total", **FLASK_OK) == 3
    assert value(m, "outrider_request_duration_seconds_count", **FLASK_OK) == 3
    generate = {"route": "/generate", "operation": "chat", "provider": "self_hosted"}
    assert value(m, "outrider_inference_time_to_first_token_seconds_count", **generate) == 1
    assert value(m, "outrider_inference_inter_token_latency_seconds_count", **generate) == 2


def test_both_services_in_otlp_with_the_http_semantic_conventions(services: ServiceWorld) -> None:
    points = services.latest_export()
    by_route = {}
    for _, p in points["http.server.request.duration"]:
        a = attributes(p.attributes)
        by_route[(a["http.route"], a["http.request.method"], a["http.response.status_code"])] = (a, p.count)
    fastapi, count = by_route[("/items/{item_id}", "GET", 200)]
    assert count == 3 and fastapi["url.scheme"] == "http"
    assert by_route[("/predict/<model>", "GET", 200)][1] == 3
    assert by_route[("/items/{item_id}", "_OTHER", 405)][1] == 1
    assert not any("outrider.http.status_class" in a or "status_class" in a for a, _ in by_route.values()), \
        "the status class is a Prometheus convenience, not an attribute"
    active = [attributes(p.attributes) for _, p in points["http.server.active_requests"]]
    assert {(a["http.request.method"], a.get("url.scheme")) for a in active} >= {("GET", "http"), ("POST", "http")}
    ttft = [attributes(p.attributes) for _, p in points["gen_ai.server.time_to_first_token"]]
    assert {(a["http.route"], a["gen_ai.operation.name"], a["gen_ai.provider.name"]) for a in ttft} == \
        {("/v1/chat", "chat", "vllm"), ("/generate", "chat", "self_hosted")}


def test_the_middlewares_are_where_users_look_and_load_nothing_until_asked() -> None:
    code = ("import sys, outrider\n"
            "assert 'outrider.hook.asgi' not in sys.modules and 'outrider.hook.wsgi' not in sys.modules\n"
            "from outrider import OutriderMiddleware, OutriderWSGIMiddleware\n"
            "from outrider.hook.asgi import OutriderMiddleware as A\n"
            "from outrider.hook.wsgi import OutriderWSGIMiddleware as W\n"
            "assert OutriderMiddleware is A and OutriderWSGIMiddleware is W\n"
            "assert {'OutriderMiddleware', 'OutriderWSGIMiddleware'} <= set(outrider.__all__) <= set(dir(outrider))\n"
            "heavy = {'fastapi', 'starlette', 'flask', 'werkzeug', 'opentelemetry', 'psutil', 'pynvml', 'torch'}\n"
            "assert not heavy & {m.split('.')[0] for m in sys.modules}, heavy & set(sys.modules)\n"
            "try:\n    outrider.NoSuchThing\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit(1)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(REPO / "agent"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
