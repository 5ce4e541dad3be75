"""What one delivery attempt says (outrider/notify/base.py), exactly, against a real HTTP receiver on 127.0.0.1: the
outcome of each way delivery fails, as the dispatcher logs it and backs off by it (the exception's own class and
words, the receiver's answer cut to 200 characters, Retry-After and its bounds), the secrets scrubbed to `<secret>`
in every form a receiver's URL takes, and the configuration errors that name the receiver."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from outrider.notify import NotifyConfigError, parse_receivers
from outrider.notify.base import MAX_REPLY_BYTES, Notifier, url_secrets
from tests.helpers import free_port
from tests.notify.test_delivery import alert

# (status, headers, body) for the n-th request
Script = Callable[[int], tuple[int, dict[str, str], bytes]]


class Receiver:
    """Answers each POST as `script(n)` says, and records how much of its answer was read before the close."""

    def __init__(self, script: Script) -> None:
        outer = self
        self.requests = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, headers, body = script(outer.requests)
                outer.requests += 1
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def receiver() -> Iterator[Callable[[Script], Receiver]]:
    started: list[Receiver] = []

    def start(script: Script) -> Receiver:
        started.append(Receiver(script))
        return started[-1]
    yield start
    for r in started:
        r.close()


def webhook(url: str, **spec: Any) -> Notifier:
    ((n, _),) = parse_receivers({"receivers": [{"name": "hook", "type": "webhook", "url": url, "timeout_s": 5,
                                                **spec}]}, "test")
    return n


def answering(status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> Script:
    return lambda n: (status, headers or {}, body)


# --- what each failure says -------------------------------------------------------------------------------------

def test_a_2xx_is_delivered(receiver: Callable[[Script], Receiver]) -> None:
    for status in (200, 202, 204, 299):
        r = receiver(answering(status))
        outcome = webhook(r.url + "/hook").send([alert("A", "firing")])
        assert outcome.delivered and outcome.kind == "delivered", status


@pytest.mark.parametrize(("status", "kind"), [(400, "rejected"), (404, "rejected"), (428, "rejected"),
                                              (429, "retry"), (430, "rejected"), (499, "rejected"),
                                              (500, "retry"), (503, "retry")])
def test_a_4xx_is_rejected_but_429_and_5xx_are_retried_saying_what_the_receiver_answered(
        status: int, kind: str, receiver: Callable[[Script], Receiver]) -> None:
    r = receiver(answering(status, body=b"  no such channel\n"))
    outcome = webhook(r.url + "/hook").send([alert("A", "firing")])
    assert (outcome.kind, outcome.detail, outcome.retry_after_s) == (kind, f"HTTP {status}: no such channel", 0.0)


def test_the_receivers_answer_is_cut_to_200_characters(receiver: Callable[[Script], Receiver]) -> None:
    r = receiver(answering(400, body=b"e" * 5000))
    assert webhook(r.url + "/hook").send([alert("A", "firing")]).detail == "HTTP 400: " + "e" * 200


def test_an_answer_that_is_not_utf8_is_shown_replaced(receiver: Callable[[Script], Receiver]) -> None:
    r = receiver(answering(400, body=b"caf\xe9"))
    assert webhook(r.url + "/hook").send([alert("A", "firing")]).detail == "HTTP 400: caf\ufffd"


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_retried_and_says_to_fix_the_url(status: int, receiver: Callable[[Script], Receiver]) -> None:
    r = receiver(answering(status, {"Location": "http://127.0.0.2:9/elsewhere"}))
    outcome = webhook(r.url + "/hook").send([alert("A", "firing")])
    assert outcome.kind == "retry" and outcome.detail == (
        f"HTTP {status}: the receiver redirects, and redirects are not followed (they would carry its credentials "
        "elsewhere): fix its URL")
    assert r.requests == 1


@pytest.mark.parametrize(("header", "wait_s"), [("7", 7.0), ("0.5", 0.5), ("0", 0.0), ("3599", 3599.0),
                                                ("3600", 3600.0), ("3601", 3600.0), ("1e9", 3600.0), ("-5", 0.0),
                                                ("soon", 0.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), ("", 0.0)])
def test_retry_after_is_honoured_in_seconds_up_to_an_hour(header: str, wait_s: float,
                                                         receiver: Callable[[Script], Receiver]) -> None:
    r = receiver(answering(429, {"Retry-After": header}))
    outcome = webhook(r.url + "/hook").send([alert("A", "firing")])
    assert outcome.kind == "retry" and outcome.retry_after_s == wait_s


def test_without_retry_after_the_wait_is_the_backoffs(receiver: Callable[[Script], Receiver]) -> None:
    r = receiver(answering(503))
    assert webhook(r.url + "/hook").send([alert("A", "firing")]).retry_after_s == 0.0


def test_a_refused_connection_says_so_in_the_causes_own_words() -> None:
    outcome = webhook(f"http://127.0.0.1:{free_port()}/hook").send([alert("A", "firing")])
    assert outcome.kind == "retry" and outcome.reason == ""
    assert outcome.detail == "ConnectionRefusedError: [Errno 111] Connection refused", outcome.detail


def test_a_name_that_does_not_resolve_says_so() -> None:
    outcome = webhook("http://outrider-test.invalid:9/hook").send([alert("A", "firing")])
    assert outcome.kind == "retry" and outcome.detail.startswith("gaierror: [Errno "), outcome.detail


def test_an_answer_that_is_not_http_names_what_http_client_raised() -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HELLO THERE\r\n\r\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        outcome = webhook(f"http://127.0.0.1:{listener.getsockname()[1]}/hook").send([alert("A", "firing")])
    finally:
        t.join(5)
        listener.close()
    assert outcome.kind == "retry" and outcome.detail == "BadStatusLine: HELLO THERE", "one line, no break after it"


def test_a_receivers_words_stay_on_one_log_line(receiver: Callable[[Script], Receiver]) -> None:
    """What a receiver sends after a line break would read as a line the agent wrote: breaks are shown escaped."""
    r = receiver(answering(400, body=b"bad\r\nWARNING outrider.notify forged line\nthird"))
    assert webhook(r.url + "/hook").send([alert("A", "firing")]).detail == (
        "HTTP 400: bad\\r\\nWARNING outrider.notify forged line\\nthird")


def test_a_delivery_past_its_timeout_is_a_deadline(receiver: Callable[[Script], Receiver]) -> None:
    release = threading.Event()

    def slow(n: int) -> tuple[int, dict[str, str], bytes]:
        release.wait(10)
        return 200, {}, b""

    r = receiver(slow)
    try:
        outcome = webhook(r.url + "/hook", timeout_s=0.3).send([alert("A", "firing")])
    finally:
        release.set()
    assert (outcome.kind, outcome.reason) == ("retry", "deadline")
    assert outcome.detail == ("no complete answer within 0.3 s (the receiver's timeout_s bounds the whole delivery)")


def test_the_reply_is_read_up_to_64_kib_and_the_rest_dropped_with_the_connection(
        receiver: Callable[[Script], Receiver]) -> None:
    assert MAX_REPLY_BYTES == 64 << 10
    r = receiver(answering(200, body=b"x" * (4 << 20)))
    assert webhook(r.url + "/hook").send([alert("A", "firing")]).delivered


# --- secrets ------------------------------------------------------------------------------------------------------

PASSWORD = "s3cretPASSWORD"


def test_a_secret_is_replaced_by_exactly_secret(receiver: Callable[[Script], Receiver]) -> None:
    r = receiver(answering(400, body=f"bad credentials outrider:{PASSWORD}".encode()))
    url = r.url.replace("http://", f"http://outrider:{PASSWORD}@") + "/hook"
    assert webhook(url).send([alert("A", "firing")]).detail == "HTTP 400: bad credentials outrider:<secret>"


def test_the_url_without_its_scheme_is_everything_after_the_first_scheme_separator() -> None:
    url = "https://hooks.example.com/v1/hook?next=https://other.example.com/ok"
    assert url_secrets(url)[1] == "hooks.example.com/v1/hook?next=https://other.example.com/ok"


def test_a_path_of_more_than_a_slash_is_a_secret_form() -> None:
    assert "/ab" in url_secrets("https://h.example.com/ab")
    assert "/a" in url_secrets("https://h.example.com/a")
    assert "/" not in url_secrets("https://h.example.com/")


def test_the_token_of_a_url_that_ends_in_a_slash_is_its_last_segment() -> None:
    forms = url_secrets("https://hooks.example.com/services/T0TEAM/B0BOT/sl4ckTOKENX/")
    assert "sl4ckTOKENX" in forms and "sl4ckTOKEN" not in forms


def test_a_bearer_token_written_in_the_configuration_names_the_receiver() -> None:
    with pytest.raises(NotifyConfigError) as e:
        webhook("https://hooks.example.com/x", bearer_token="literal")
    assert str(e.value) == ("test: receiver 'hook': put bearer_token in a file (bearer_token_file) or an environment "
                            "variable (bearer_token_env), not in the configuration")


def test_credentials_in_the_url_and_in_basic_auth_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PASSWORD", PASSWORD)
    with pytest.raises(NotifyConfigError) as e:
        webhook(f"https://outrider:{PASSWORD}@hooks.example.com/x", basic_auth_username="outrider",
                basic_auth_password_env="TEST_PASSWORD")
    assert str(e.value) == ("test: receiver 'hook': credentials both in url and in bearer_token/basic_auth: keep one")
