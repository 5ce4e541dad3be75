"""The endpoint's rotated secrets (exporters/rotation.py), on a test's clock: files replaced as a Kubernetes Secret
volume replaces them (a new directory, the `..data` link swapped), looked at no more than once a second, the new
set taken at the next look, and a set that cannot be used yet (a key that does not match its certificate, an empty
password file) leaving the last good one in force until the files change again."""

from __future__ import annotations

import base64
import logging
import socket
import ssl
from pathlib import Path

import pytest

from outrider.exporters.prometheus import Endpoints, MetricsServer
from outrider.exporters.rotation import BasicAuthFiles, SecretFileError, TlsFiles
from outrider.ground.clock import ManualClock
from tests.helpers import SecretVolume, http_get, self_signed


def pair(directory: Path) -> dict[str, bytes]:
    cert, key = self_signed(directory)
    return {"tls.crt": cert.read_bytes(), "tls.key": key.read_bytes()}


def served_certificate(context: ssl.SSLContext) -> bytes:
    """The certificate a handshake with this server context presents (DER), over a socket pair."""
    client_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_context.check_hostname, client_context.verify_mode = False, ssl.CERT_NONE
    a, b = socket.socketpair()
    server = context.wrap_socket(a, server_side=True, do_handshake_on_connect=False)
    client = client_context.wrap_socket(b, do_handshake_on_connect=False)
    server.setblocking(False)
    client.setblocking(False)
    try:
        for _ in range(100):
            done = 0
            for s in (client, server):
                try:
                    s.do_handshake()
                    done += 1
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
            if done == 2:
                der = client.getpeercert(binary_form=True)
                assert der is not None
                return der
        raise AssertionError("the handshake did not complete")
    finally:
        server.close()
        client.close()


def der(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode())


def test_a_rotated_certificate_is_served_from_the_next_look_and_a_half_written_pair_keeps_the_last_good(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    volume = SecretVolume(tmp_path / "tls", ("tls.crt", "tls.key"))
    first, second = pair(tmp_path / "first"), pair(tmp_path / "second")
    volume.write(first)
    tls = TlsFiles(volume.path("tls.crt"), volume.path("tls.key"), clock=clock.clock().monotonic)
    assert served_certificate(tls.context()) == der(first["tls.crt"])

    volume.write(second)
    clock.now += 0.5
    assert served_certificate(tls.context()) == der(first["tls.crt"]), "looked at once a second at most"
    clock.now += 0.5
    assert served_certificate(tls.context()) == der(second["tls.crt"]) and tls.reloads == 1

    # A renewal caught between its two files: the new certificate with the old key does not load
    volume.write({"tls.crt": first["tls.crt"], "tls.key": second["tls.key"]})
    clock.now += 1
    with caplog.at_level(logging.WARNING, "outrider.exporters.rotation"):
        assert served_certificate(tls.context()) == der(second["tls.crt"]), "the last good pair, not none"
    assert "cannot be used" in caplog.text and tls.reloads == 1
    clock.now += 1
    tls.context()
    assert caplog.text.count("cannot be used") == 1, "said once per change, not at every look"
    volume.write(first)  # the key follows
    clock.now += 1
    assert served_certificate(tls.context()) == der(first["tls.crt"]) and tls.reloads == 2


def test_rotated_credentials_replace_the_old_ones_and_an_empty_file_keeps_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    volume = SecretVolume(tmp_path / "auth", ("username", "password"))
    volume.write({"username": b"prometheus\n", "password": b"old-password\n"})
    auth = BasicAuthFiles(volume.path("password"), username_file=volume.path("username"),
                          clock=clock.clock().monotonic)
    assert auth.current() == ("prometheus", "old-password")
    volume.write({"username": b"scraper", "password": b"new-password"})
    assert auth.current() == ("prometheus", "old-password")
    clock.now += 1
    assert auth.current() == ("scraper", "new-password") and auth.reloads == 1
    volume.write({"username": b"scraper", "password": b"  \n"})
    clock.now += 1
    with caplog.at_level(logging.WARNING, "outrider.exporters.rotation"):
        assert auth.current() == ("scraper", "new-password")
    assert "is empty" in caplog.text and "new-password" not in caplog.text
    volume.write({"username": b"scraper", "password": b"third"})
    clock.now += 1
    assert auth.current() == ("scraper", "third")


def test_the_first_read_is_strict_and_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "password").write_text("\n")
    with pytest.raises(SecretFileError) as e:
        BasicAuthFiles(str(tmp_path / "password"), username="p")
    assert e.value.path == str(tmp_path / "password") and "is empty" in str(e.value)
    with pytest.raises(SecretFileError) as e:
        BasicAuthFiles(str(tmp_path / "password"), username_file=str(tmp_path / "missing"))
    assert e.value.path == str(tmp_path / "missing")
    with pytest.raises(OSError, match="cannot load TLS certificate"):
        TlsFiles(str(tmp_path / "password"), str(tmp_path / "password"))


def test_the_server_asks_for_the_current_credentials_on_every_request() -> None:
    current = [("prometheus", "one")]
    s = MetricsServer(Endpoints(lambda om, gz: b"m 1\n", lambda: b"{}", lambda: True, lambda: True), "127.0.0.1", 0,
                      basic_auth=lambda: current[0])
    s.start()

    def status(user: str, password: str) -> int:
        header = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        return http_get(s.url + "/metrics", headers={"Authorization": header})[0]

    try:
        assert status("prometheus", "one") == 200
        current[0] = ("prometheus", "two")
        assert (status("prometheus", "one"), status("prometheus", "two")) == (401, 200)
    finally:
        s.stop()
