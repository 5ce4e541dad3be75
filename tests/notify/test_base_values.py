"""What every notifier shares, at its edges: secrets read from a variable or a file (never the config), receiver URLs
checked with a message that never echoes them, Retry-After's bounds, timestamps, and a receiver's words on one line."""

from __future__ import annotations

import os
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest

from outrider.notify.base import (
    DELIVERED,
    Notifier,
    NotifyConfigError,
    Outcome,
    _retry_after,
    check_url,
    one_line,
    read_secret,
    rfc3339,
)
from tests.helpers import self_signed


def test_a_secret_from_a_variable_is_stripped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_BASE_KEY", "  k3y\n")
    assert read_secret({"key_env": "TEST_BASE_KEY"}, "key", "r") == "k3y"


def test_a_secret_from_a_file_is_stripped(tmp_path: Path) -> None:
    p = tmp_path / "k"
    p.write_text("\n s3cret \n")
    assert read_secret({"key_file": str(p)}, "key", "r") == "s3cret"


@pytest.mark.parametrize(("spec", "message"), [
    ({"key": "x"}, "receiver 'r': put key in a file (key_file) or an environment variable (key_env), not in the "
                   "configuration"),
    ({"key_env": "TEST_BASE_KEY", "key_file": "/x"}, "receiver 'r': set one of key_env and key_file"),
    ({"key_env": "TEST_BASE_UNSET"}, "receiver 'r': key_env names TEST_BASE_UNSET, which is not set"),
    ({"key_env": "TEST_BASE_BLANK"}, "receiver 'r': key_env names TEST_BASE_BLANK, which is not set"),
    ({}, "receiver 'r': needs key_env or key_file"),
])
def test_a_secret_that_cannot_be_read_says_why(spec: dict[str, str], message: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_BASE_KEY", "k")
    monkeypatch.setenv("TEST_BASE_BLANK", "  ")
    monkeypatch.delenv("TEST_BASE_UNSET", raising=False)
    with pytest.raises(NotifyConfigError) as e:
        read_secret(spec, "key", "r")
    assert str(e.value) == message


def test_a_secret_file_that_is_missing_or_empty_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(NotifyConfigError) as e:
        read_secret({"key_file": str(missing)}, "key", "r")
    assert str(e.value) == f"receiver 'r': key_file: cannot read {missing}: No such file or directory"
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    with pytest.raises(NotifyConfigError) as e:
        read_secret({"key_file": str(empty)}, "key", "r")
    assert str(e.value) == f"receiver 'r': key_file {empty} is empty"


def test_a_secret_file_is_utf_8_whatever_the_locale_and_one_that_is_not_says_so(tmp_path: Path) -> None:
    import subprocess
    import sys

    secret = tmp_path / "secret"
    secret.write_bytes("pässwörd\n".encode())
    code = ("import sys; from outrider.notify.base import read_secret\n"
            "print(ascii(read_secret({'key_file': sys.argv[1]}, 'key', 'r')))\n")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    out = subprocess.run([sys.executable, "-c", code, str(secret)], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert (out.returncode, out.stdout.strip()) == (0, ascii("pässwörd")), out.stderr
    latin1 = tmp_path / "latin1"
    latin1.write_bytes("pässwörd".encode("latin-1"))
    with pytest.raises(NotifyConfigError) as e:
        read_secret({"key_file": str(latin1)}, "key", "r")
    assert str(e.value) == f"receiver 'r': key_file {latin1} is not UTF-8 text"


def test_an_optional_secret_left_out_is_empty() -> None:
    assert read_secret({}, "key", "r", required=False) == ""
    assert read_secret({"key_env": ""}, "key", "r", required=False) == ""


@pytest.mark.parametrize(("url", "problem"), [
    ("", "is empty"),
    ("https://h/a b", "contains whitespace or a control character (percent-encode it)"),
    ("https://h/a\x1fb", "contains whitespace or a control character (percent-encode it)"),
    ("https://h/a\x7fb", "contains whitespace or a control character (percent-encode it)"),
    ("https://h/\u00e9", "contains non-ASCII characters (percent-encode them, or use the host's punycode form)"),
    ("https://h:99999/", "is malformed (a bad port or IPv6 address)"),
    ("https://[::1/", "is malformed (a bad port or IPv6 address)"),
    ("ftp://h/", "must start with http:// or https://"),
    ("h/x", "must start with http:// or https://"),
    ("https:///x", "has no host"),
])
def test_a_bad_receiver_url_is_named_by_its_key_never_echoed(url: str, problem: str) -> None:
    with pytest.raises(NotifyConfigError) as e:
        check_url(url, "r", "url")
    assert str(e.value) == f"receiver 'r': url {problem}"


@pytest.mark.parametrize("url", ["http://h", "HTTPS://h:443/p?q", "https://h/~!$&'()*+,;=:@%20"])
def test_a_good_receiver_url_is_split(url: str) -> None:
    assert check_url(url, "r", "url").hostname == "h"


@pytest.mark.parametrize(("header", "seconds"), [
    (None, 0.0), ("", 0.0), ("7", 7.0), ("0.5", 0.5), ("-3", 0.0), ("3600", 3600.0), ("3601", 3600.0),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
])
def test_retry_after_in_seconds_from_none_to_an_hour(header: str | None, seconds: float) -> None:
    assert _retry_after(header) == seconds


def test_timestamps_are_rfc3339_utc_to_the_millisecond() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_700_000_000.1234) == "2023-11-14T22:13:20.123Z"


def test_a_receivers_line_breaks_are_written_out_and_its_ends_stripped() -> None:
    assert one_line("  a\r\nb\n ") == "a\\r\\nb"


def test_only_a_delivered_outcome_is_delivered() -> None:
    assert DELIVERED.delivered and DELIVERED.kind == "delivered"
    assert not Outcome("retry").delivered and not Outcome("rejected").delivered
    assert (DELIVERED.detail, DELIVERED.retry_after_s, DELIVERED.reason) == ("", 0.0, "")


def test_a_notifier_with_an_empty_secret_scrubs_nothing_else() -> None:
    n = Notifier("r", {}, secrets=["", "tok3n"])
    assert n.scrub("a tok3n b") == "a <secret> b"
    assert n.refresh([]) is None
    with pytest.raises(NotImplementedError):
        n.send([])


@pytest.mark.parametrize(("spec", "message"), [
    ({"basic_auth_password_env": "TEST_BASE_PW"}, "basic_auth_password needs basic_auth_username"),
    ({"basic_auth_username": "u"}, "needs basic_auth_password_env or basic_auth_password_file"),
    ({"basic_auth_username": "u", "basic_auth_password_env": "TEST_BASE_PW", "bearer_token_env": "TEST_BASE_TOKEN"},
     "set one of bearer_token and basic_auth"),
])
def test_incomplete_or_doubled_credentials_are_refused_naming_the_receiver(
        spec: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_BASE_PW", "pw")
    monkeypatch.setenv("TEST_BASE_TOKEN", "tok")
    with pytest.raises(NotifyConfigError) as e:
        Notifier("r", spec).http_options()
    assert str(e.value) == f"receiver 'r': {message}"


def test_http_options_set_the_authorization_header_and_its_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_BASE_PW", "pw")
    monkeypatch.setenv("TEST_BASE_TOKEN", "tok")
    n = Notifier("r", {"bearer_token_env": "TEST_BASE_TOKEN"})
    n.http_options()
    assert n.headers == {"Authorization": "Bearer tok"} and n.secrets == ["tok"] and n.context is None
    n = Notifier("r", {"basic_auth_username": "u", "basic_auth_password_env": "TEST_BASE_PW"})
    n.http_options()
    assert n.headers == {"Authorization": "Basic dTpwdw=="} and n.secrets == ["pw", "dTpwdw=="]
    n = Notifier("r", {})
    n.http_options()
    assert n.headers == {} and n.secrets == []


def test_credentials_in_a_url_become_basic_auth_and_leave_the_url() -> None:
    n = Notifier("r", {})
    n.http_options()
    assert n.http_url("https://h:1/p?q") == "https://h:1/p?q" and n.secrets == []
    url = "https://us%40r:p%3Aw@h:1/p?q#f"
    assert n.http_url(url) == "https://h:1/p?q#f"
    assert n.headers["Authorization"] == "Basic dXNAcjpwOnc="  # base64 of us@r:p:w, decoded from the URL
    assert url in n.secrets and "p%3Aw" in n.secrets and "p:w" in n.secrets
    n = Notifier("r", {})
    n.http_options()
    assert n.http_url("https://:pw@h/") == "https://h/" and n.headers["Authorization"] == "Basic OnB3"


def test_a_bad_url_is_named_by_the_key_it_came_from() -> None:
    n = Notifier("r", {})
    n.http_options()
    with pytest.raises(NotifyConfigError) as e:
        n.http_url("ftp://h/", key="webhook_url")
    assert str(e.value) == "receiver 'r': webhook_url must start with http:// or https://"


def test_a_username_alone_in_a_url_is_taken_out_and_sent_as_basic_auth() -> None:
    n = Notifier("r", {})
    n.http_options()
    assert n.http_url("https://u@h/p") == "https://h/p"
    assert n.headers["Authorization"] == "Basic dTo="  # base64 of "u:"


def test_a_urls_secrets_are_added_to_those_the_notifier_already_scrubs() -> None:
    n = Notifier("r", {}, secrets=["r0uting-key"])
    n.http_options()
    n.http_url("https://u:pw@h/")
    assert "r0uting-key" in n.secrets and "pw" in n.secrets


def test_an_exception_is_described_in_its_own_words_unless_urllib_wrapped_it() -> None:
    class Odd(Exception):
        reason = ValueError("not me")

    n = Notifier("r", {})
    assert n.describe(Odd("me")) == "Odd: me", "a reason is urllib's wrapped cause only on a URLError"
    import urllib.error

    assert n.describe(urllib.error.URLError(ConnectionRefusedError(111, "refused"))) == \
        "ConnectionRefusedError: [Errno 111] refused"
    assert n.describe(urllib.error.URLError("no host")) == "URLError: <urlopen error no host>"


def test_the_last_at_sign_ends_a_urls_credentials() -> None:
    n = Notifier("r", {})
    n.http_options()
    assert n.http_url("https://u:p@w@h:1/p") == "https://h:1/p"
    assert n.headers["Authorization"] == "Basic dTpwQHc="  # base64 of "u:p@w"


# --- the opener: TLS with the receiver's own CA, and the whole call bounded on both schemes ----------------------

class Trickle:
    """A receiver on 127.0.0.1 (TLS with `tls`) that answers 200 and then its body one byte each `gap_s`: every
    read is quick, the whole answer slow (`total` bytes). `fast` sends the body at once."""

    def __init__(self, tls: ssl.SSLContext | None = None, total: int = 40, gap_s: float = 0.1) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.stop = threading.Event()
        self.tls, self.total, self.gap_s = tls, total, gap_s
        self.sent = 0  # body bytes sent before the client closed (or all of them)
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body) of each request
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.listener.getsockname()[1]}/hook"

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                conn.settimeout(5)
                if self.tls:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536) or b"\r\n\r\n"
                head, _, body = request.partition(b"\r\n\r\n")
                length = int(next((ln.split(b":")[1] for ln in head.split(b"\r\n")
                                   if ln.lower().startswith(b"content-length:")), b"0"))
                while len(body) < length:
                    body += conn.recv(65536) or b"." * length
                self.requests.append((head, body))
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {self.total}\r\n\r\n".encode())
                for _ in range(self.total):
                    if self.stop.wait(self.gap_s):
                        break
                    conn.sendall(b"x")
                    self.sent += 1
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.listener.close()


@pytest.fixture
def tls_server(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    cert, key = self_signed(tmp_path / "tls")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, cert


def post(url: str, **spec: Any) -> Outcome:
    n = Notifier("r", spec, timeout_s=float(spec.pop("timeout_s", 5.0)))
    n.http_options()
    return n.post_json(n.http_url(url), {"a": 1})


def test_a_receiver_behind_tls_with_its_own_ca_is_delivered_to(tls_server: tuple[ssl.SSLContext, Path]) -> None:
    context, cert = tls_server
    server = Trickle(context, total=2, gap_s=0.0)
    try:
        assert post(server.url, ca_file=str(cert)) == DELIVERED
        refused = post(server.url)  # the default CAs do not know it
        assert refused.kind == "retry" and "CERTIFICATE_VERIFY_FAILED" in refused.detail, refused
    finally:
        server.close()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_an_answer_trickling_past_the_timeout_is_cut_at_the_deadline(
        scheme: str, tls_server: tuple[ssl.SSLContext, Path]) -> None:
    """Each byte comes well within timeout_s, the whole reply (4 s) far past it: the deadline ends the call (its
    socket shut down), not each read's timeout, on both schemes; a call bounded only by each read would read the
    whole reply before returning."""
    context, cert = tls_server
    server = Trickle(context if scheme == "https" else None, total=40, gap_s=0.1)
    try:
        outcome = post(server.url, ca_file=str(cert), timeout_s=0.5)
        sent = server.sent
    finally:
        server.close()
    # the status came before the deadline: delivered, unless the cut landed inside a TLS record (a deadline retry)
    assert outcome == DELIVERED or (outcome.kind, outcome.reason) == ("retry", "deadline"), outcome
    assert sent < server.total, f"the call returned before the reply ended ({sent} of {server.total} bytes)"


def test_the_request_is_compact_json_with_its_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_BASE_TOKEN", "tok")
    server = Trickle(total=0)
    try:
        n = Notifier("r", {"bearer_token_env": "TEST_BASE_TOKEN"})
        n.http_options()
        assert n.post_json(server.url, {"a": 1, "b": [1, 2]}, headers={"X-Extra": "e"}) == DELIVERED
    finally:
        server.close()
    ((head, body),) = server.requests
    assert body == b'{"a":1,"b":[1,2]}'
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /hook HTTP/1.1"
    for header in ("Content-Type: application/json", "User-Agent: outrider", "Authorization: Bearer tok",
                   "X-Extra: e", f"Content-Length: {len(body)}"):
        assert header in lines, (header, lines)



class Stall:
    """A receiver on 127.0.0.1 that answers `status` with a body longer than it sends: `sent` bytes at once, then
    nothing until it is closed (or, with `handshake=False`, that accepts a connection and never says a word: a TLS
    client waits for its handshake)."""

    def __init__(self, status: int = 200, length: int = 0, sent: int = 0, speak: bool = True,
                 body: bytes = b"e") -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.stop = threading.Event()
        self.status, self.length, self.sent, self.speak, self.body = status, length, sent, speak, body
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()
        self.port = self.listener.getsockname()[1]

    def serve(self) -> None:
        held: list[socket.socket] = []
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            held.append(conn)
            if not self.speak:
                continue
            try:
                conn.settimeout(5)
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536) or b"\r\n\r\n"
                conn.sendall(f"HTTP/1.1 {self.status} X\r\nContent-Length: {self.length}\r\n\r\n".encode()
                             + (self.body * self.sent)[:self.sent])
            except OSError:
                pass
        for conn in held:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.listener.close()


def test_a_reply_past_its_cap_is_delivered_without_waiting_for_the_rest() -> None:
    """64 KiB of a longer 200 reply arrive at once and the rest never: the notifier reads up to its cap and is done
    (reading the whole reply would wait for the deadline and call a delivered alert a failure)."""
    server = Stall(200, length=65_536 + 1000, sent=65_536)
    try:
        outcome = post(f"http://127.0.0.1:{server.port}/hook", timeout_s=10.0)
    finally:
        server.close()
    assert outcome == DELIVERED, outcome


def test_an_error_reply_is_quoted_from_its_first_512_bytes_without_waiting_for_the_rest() -> None:
    server = Stall(400, length=10_000, sent=600)
    try:
        outcome = post(f"http://127.0.0.1:{server.port}/hook", timeout_s=10.0)
    finally:
        server.close()
    assert (outcome.kind, outcome.detail) == ("rejected", "HTTP 400: " + "e" * 200)


def test_a_tls_receiver_that_never_answers_the_handshake_is_given_up(tls_server: tuple[ssl.SSLContext, Path]) -> None:
    """The handshake is bounded by the connection's timeout (timeout_s): without it the delivery thread would wait for
    good on a receiver that accepts and says nothing."""
    _, cert = tls_server
    server = Stall(speak=False)
    try:
        outcome = post(f"https://127.0.0.1:{server.port}/hook", ca_file=str(cert), timeout_s=0.5)
    finally:
        server.close()
    assert outcome.kind == "retry", outcome  # it returned: timed out, or the deadline's flag seen first


def test_an_error_reply_is_quoted_from_exactly_its_first_512_bytes() -> None:
    """512 bytes of three-byte characters hold 170 of them and two bytes of the 171st, which decode as one
    replacement character: a byte more or less quotes something else."""
    server = Stall(400, length=900, sent=900, body="€".encode())
    try:
        outcome = post(f"http://127.0.0.1:{server.port}/hook", timeout_s=10.0)
    finally:
        server.close()
    assert (outcome.kind, outcome.detail) == ("rejected", "HTTP 400: " + "€" * 170 + "\ufffd")


def test_an_error_reply_whose_body_never_comes_is_quoted_as_nothing() -> None:
    server = Stall(400, length=100, sent=0)  # the status, then silence: the body's read times out
    try:
        outcome = post(f"http://127.0.0.1:{server.port}/hook", timeout_s=2.0)
    finally:
        server.close()
    assert (outcome.kind, outcome.detail) == ("rejected", "HTTP 400:")


def test_a_300_is_a_redirect_too_and_is_not_followed() -> None:
    for status in (300, 399):
        server = Stall(status, length=0)
        try:
            outcome = post(f"http://127.0.0.1:{server.port}/hook", timeout_s=10.0)
        finally:
            server.close()
        assert (outcome.kind, outcome.detail) == (
            "retry", f"HTTP {status}: the receiver redirects, and redirects are not followed (they would carry its "
                     "credentials elsewhere): fix its URL"), status
