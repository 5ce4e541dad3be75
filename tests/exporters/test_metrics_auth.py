"""The endpoint's basic auth, rule by rule, on a real server in this process: /metrics and /api/v1/alerts need the
configured user and password (scheme case-insensitive, base64 strict, the password everything after the first
colon); the probes and the index stay open; without basic_auth everything is open."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from outrider.exporters.prometheus import Endpoints, MetricsServer, alerts_api_json
from tests.helpers import http_get

USER, PASSWORD = "prometheus", "pa:ss wörd"


def basic(user: str, password: str, scheme: str = "Basic") -> str:
    return f"{scheme} " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    s = MetricsServer(Endpoints(lambda om, gz: b"m 1\n", lambda: alerts_api_json([]), lambda: True, lambda: True),
                      "127.0.0.1", 0, basic_auth=(USER, PASSWORD))
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize(("header", "status"), [
    (None, 401),
    (basic(USER, PASSWORD), 200),
    (basic(USER, PASSWORD, scheme="basic"), 200),  # the scheme is case-insensitive
    (basic(USER, PASSWORD, scheme="BASIC"), 200),
    ("Basic  " + basic(USER, PASSWORD).split()[1] + " ", 200),  # spaces around the credentials
    (basic(USER, PASSWORD, scheme="Bearer"), 401),
    (basic(USER, "pa:ss"), 401),  # a prefix of the password
    (basic(USER, PASSWORD + "x"), 401),
    (basic(USER + "x", PASSWORD), 401),
    (basic("prometheu", PASSWORD), 401),
    (basic("", PASSWORD), 401),
    ("Basic " + base64.b64encode(f"{USER}{PASSWORD}".encode()).decode(), 401),  # no colon at all
    ("Basic not*base64", 401),
    ("Basic *" + basic(USER, PASSWORD).split()[1], 401),  # strict base64: no character outside its alphabet
    ("Basic " + base64.b64encode(b"\xff\xfe:x").decode(), 401),  # not UTF-8
    ("Basic", 401),
    ("", 401),
])
@pytest.mark.parametrize("path", ["/metrics", "/api/v1/alerts"])
def test_protected_paths_need_the_configured_credentials(server: MetricsServer, path: str, header: str | None,
                                                         status: int) -> None:
    code, headers, _ = http_get(server.url + path, headers={"Authorization": header} if header is not None else None)
    assert code == status, header
    if status == 401:
        assert headers.get("WWW-Authenticate") == 'Basic realm="outrider"'
    assert server.scrapes == (1 if status == 200 and path == "/metrics" else 0), "refused scrapes are not counted"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/"])
def test_probes_and_the_index_stay_open(server: MetricsServer, path: str) -> None:
    assert http_get(server.url + path)[0] == 200


def test_without_basic_auth_everything_is_open() -> None:
    s = MetricsServer(Endpoints(lambda om, gz: b"m 1\n", lambda: b"{}", lambda: True, lambda: True), "127.0.0.1", 0)
    s.start()
    try:
        assert http_get(s.url + "/metrics", headers={"Authorization": "Bearer whatever"})[0] == 200
        assert http_get(s.url + "/api/v1/alerts")[0] == 200
    finally:
        s.stop()
