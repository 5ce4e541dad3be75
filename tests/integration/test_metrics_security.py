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

from tests.helpers import SecretVolume, free_port, outrider_cmd, reap, self_signed, wait_until

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


def test_a_rotated_certificate_and_password_take_effect_without_a_restart(tmp_path: Path) -> None:
    """The chart's Secrets, updated as the kubelet updates a Secret volume (exporters/rotation.py): within the 15 s
    the agent is given, new connections get the new certificate, the new password works and the old one gets
    401."""
    tls_dir, auth_dir = SecretVolume(tmp_path / "tls", ("tls.crt", "tls.key")), \
        SecretVolume(tmp_path / "auth", ("username", "password"))
    first, second = self_signed(tmp_path / "first"), self_signed(tmp_path / "second")
    tls_dir.write({"tls.crt": first[0].read_bytes(), "tls.key": first[1].read_bytes()})
    auth_dir.write({"username": b"prometheus", "password": PASSWORD.encode()})
    env = {"OUTRIDER_TLS_CERT_FILE": tls_dir.path("tls.crt"), "OUTRIDER_TLS_KEY_FILE": tls_dir.path("tls.key"),
           "OUTRIDER_BASIC_AUTH_USERNAME_FILE": auth_dir.path("username"),
           "OUTRIDER_BASIC_AUTH_PASSWORD_FILE": auth_dir.path("password")}
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    proc = subprocess.Popen(outrider_cmd("agent", "--listen", f"127.0.0.1:{port}", "--interval", "0.5"),
                            env={**base, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trusts_first = ssl.create_default_context(cafile=str(first[0]))
    trusts_second = ssl.create_default_context(cafile=str(second[0]))
    url = f"https://127.0.0.1:{port}"

    def answers(context: ssl.SSLContext, auth: tuple[str, str] | None = None) -> int | None:
        try:
            return get(url + "/metrics", context, auth)[0]
        except (urllib.error.URLError, ConnectionError, OSError):
            return None  # the handshake failed: the certificate is not the one this client trusts

    try:
        wait_until(lambda: get(url + "/readyz", trusts_first)[0] == 200, timeout_s=30, what="the TLS agent")
        assert answers(trusts_first, ("prometheus", PASSWORD)) == 200 and answers(trusts_second) is None
        tls_dir.write({"tls.crt": second[0].read_bytes(), "tls.key": second[1].read_bytes()})
        auth_dir.write({"username": b"scraper", "password": b"rotated-Zk2"})
        wait_until(lambda: answers(trusts_second) is not None, timeout_s=15, what="the new certificate served")
        assert answers(trusts_first) is None, "the replaced certificate is served no more"
        wait_until(lambda: answers(trusts_second, ("scraper", "rotated-Zk2")) == 200, timeout_s=15,
                   what="the new credentials accepted")
        assert answers(trusts_second, ("prometheus", PASSWORD)) == 401, "the old password stops working"
        assert answers(trusts_second, ("prometheus", "rotated-Zk2")) == 401, "and the old user"
    finally:
        proc.terminate()
        reap([proc], timeout_s=20)


@pytest.mark.parametrize(("env", "message"), [
    ({"OUTRIDER_TLS_CERT_FILE": "/x.crt"}, "go together"),
    ({"OUTRIDER_BASIC_AUTH_USERNAME": "p"}, "go together"),
    ({"OUTRIDER_BASIC_AUTH_USERNAME": "p", "OUTRIDER_BASIC_AUTH_PASSWORD_FILE": "/nonexistent"},
     "basic_auth_password_file: cannot read /nonexistent"),
    ({"OUTRIDER_BASIC_AUTH_USERNAME": "p", "OUTRIDER_BASIC_AUTH_USERNAME_FILE": "/u",
      "OUTRIDER_BASIC_AUTH_PASSWORD_FILE": "/p"}, "set one of them"),
    ({"OUTRIDER_BASIC_AUTH_USERNAME_FILE": "/nonexistent-user", "OUTRIDER_BASIC_AUTH_PASSWORD_FILE": "/etc/hostname"},
     "basic_auth_username_file: cannot read /nonexistent-user"),
    ({"OUTRIDER_TLS_CERT_FILE": "/nonexistent.crt", "OUTRIDER_TLS_KEY_FILE": "/nonexistent.key"},
     "cannot load TLS certificate"),
])
def test_half_or_broken_security_configuration_is_a_clear_error(env: dict[str, str], message: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    r = subprocess.run(outrider_cmd("agent", "--listen", "127.0.0.1:0"), env={**base, **env}, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode in (1, 2) and message in r.stderr and "Traceback" not in r.stderr, r.stderr
