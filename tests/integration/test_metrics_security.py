"""TLS and basic auth on /metrics, with a real HTTPS client; health endpoints stay open for probes; the password
never shows in logs or metrics; half a configuration is a clear error."""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port, outrider_cmd, reap, self_signed, wait_until

pytestmark = pytest.mark.integration
PASSWORD = "s3cret-planted-Xq9"


def get(url: str, context: ssl.SSLContext, auth: tuple[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, context=context, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_tls_and_basic_auth(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")
    env = {"OUTRIDER_TLS_CERT_FILE": str(cert), "OUTRIDER_TLS_KEY_FILE": str(key),
           "OUTRIDER_BASIC_AUTH_USERNAME": "prometheus", "OUTRIDER_BASIC_AUTH_PASSWORD_FILE": str(password_file)}
    # AgentProcess polls plain HTTP: start the agent by hand and poll it over TLS instead.
    port = free_port()
    log = tempfile.TemporaryFile()  # noqa: SIM115 - read after the agent stops
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    proc = subprocess.Popen(outrider_cmd("agent", "--listen", f"127.0.0.1:{port}", "--interval", "0.5"),
                            env={**base, **env}, stdout=log, stderr=subprocess.STDOUT)
    context = ssl.create_default_context(cafile=str(cert))
    url = f"https://127.0.0.1:{port}"
    try:
        wait_until(lambda: get(url + "/readyz", context)[0] == 200, timeout_s=30, what="the TLS agent")
        assert get(url + "/healthz", context)[0] == 200, "probes need no credentials"
        assert get(url + "/metrics", context)[0] == 401
        assert get(url + "/metrics", context, ("prometheus", "wrong"))[0] == 401
        assert get(url + "/metrics", context, ("someone", PASSWORD))[0] == 401
        assert get(url + "/api/v1/alerts", context)[0] == 401  # the alerts (and their annotations) too
        assert get(url + "/api/v1/alerts", context, ("prometheus", PASSWORD))[0] == 200
        status, body = get(url + "/metrics", context, ("prometheus", PASSWORD))
        assert status == 200 and b"outrider_host_cpu_seconds_total" in body
        assert PASSWORD.encode() not in body
        with pytest.raises(urllib.error.URLError):  # a client that does not trust the certificate
            urllib.request.urlopen(url + "/metrics", context=ssl.create_default_context(), timeout=5)
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):  # plain HTTP to the TLS port
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        proc.terminate()
        reap([proc], timeout_s=20)
        log.seek(0)
        output = log.read().decode(errors="replace")
    assert PASSWORD not in output, "the password never reaches the log"


@pytest.mark.parametrize(("env", "message"), [
    ({"OUTRIDER_TLS_CERT_FILE": "/x.crt"}, "go together"),
    ({"OUTRIDER_BASIC_AUTH_USERNAME": "p"}, "go together"),
    ({"OUTRIDER_BASIC_AUTH_USERNAME": "p", "OUTRIDER_BASIC_AUTH_PASSWORD_FILE": "/nonexistent"}, "cannot read"),
    ({"OUTRIDER_TLS_CERT_FILE": "/nonexistent.crt", "OUTRIDER_TLS_KEY_FILE": "/nonexistent.key"},
     "cannot load TLS certificate"),
])
def test_half_or_broken_security_configuration_is_a_clear_error(env: dict[str, str], message: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    r = subprocess.run(outrider_cmd("agent", "--listen", "127.0.0.1:0"), env={**base, **env}, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode in (1, 2) and message in r.stderr and "Traceback" not in r.stderr, r.stderr
