"""What every notifier shares: the notification a receiver gets, the outcome of one delivery attempt, HTTP
delivery with its outcome classified, receiver URLs checked when receivers load, and secrets read from the
environment or a file (never from the config).

Outcomes: 2xx is delivered; any other 4xx is rejected: the message is dropped, logged and counted, since sending
the same request again cannot succeed. Everything else is retried with backoff (honouring Retry-After): 429, 5xx,
timeouts, connection, DNS and TLS errors, any exception delivery raises, and redirects. A redirect is never
followed: the request carries credentials (a bearer token, a PagerDuty key in the body) meant for the configured
host only, and a receiver that moved is a configuration to fix, not a place to send them.

Secrets never leave in a message: every detail a notifier reports is scrubbed of them (`scrub`), and a URL is
never echoed in a configuration error, since a Slack webhook URL is itself the secret.

http.client, urllib.request and ssl are imported when a receiver first needs them (a CA file, a delivery): they load
OpenSSL and the email package, about 6 MiB of RSS, which an agent whose only receiver is the log never needs.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from outrider.adapters.outbound import Deadline
from outrider.rules.notification import Notification as Notification  # the notifiers' input, defined by rules

if TYPE_CHECKING:
    import ssl
    import urllib.request


class NotifyConfigError(ValueError):
    """A bad receiver definition; the message names the receiver and the key."""


@dataclass(frozen=True)
class Outcome:
    kind: str  # delivered | retry | rejected
    detail: str = ""
    retry_after_s: float = 0.0
    reason: str = ""  # a failure's reason where it says more than its kind (deadline: counted apart)

    @property
    def delivered(self) -> bool:
        return self.kind == "delivered"


DELIVERED = Outcome("delivered")
MAX_REPLY_BYTES = 65536  # of a receiver's reply, read before the connection is closed


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def read_secret(spec: Mapping[str, Any], key: str, receiver: str, required: bool = True) -> str:
    """`KEY_env` (a variable's name) or `KEY_file` (a path); a literal `KEY` is refused so that secrets never sit
    in a config file, a ConfigMap or `outrider config show`."""
    if key in spec:
        raise NotifyConfigError(f"receiver {receiver!r}: put {key} in a file ({key}_file) or an environment "
                                f"variable ({key}_env), not in the configuration")
    env_name, path = spec.get(key + "_env"), spec.get(key + "_file")
    if env_name and path:
        raise NotifyConfigError(f"receiver {receiver!r}: set one of {key}_env and {key}_file")
    if env_name:
        value = os.environ.get(str(env_name), "").strip()
        if not value:
            raise NotifyConfigError(f"receiver {receiver!r}: {key}_env names {env_name}, which is not set")
        return value
    if path:
        try:
            with open(str(path), encoding="utf-8") as fh:
                value = fh.read().strip()
        except OSError as e:
            raise NotifyConfigError(f"receiver {receiver!r}: {key}_file: cannot read {path}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise NotifyConfigError(f"receiver {receiver!r}: {key}_file {path} is not UTF-8 text") from None
        if not value:
            raise NotifyConfigError(f"receiver {receiver!r}: {key}_file {path} is empty")
        return value
    if required:
        raise NotifyConfigError(f"receiver {receiver!r}: needs {key}_env or {key}_file")
    return ""


def check_url(url: str, receiver: str, key: str) -> urllib.parse.SplitResult:
    """An absolute http(s) URL with a host, or NotifyConfigError saying what is wrong with it (never the URL: it
    may be a secret, or carry one)."""
    where = f"receiver {receiver!r}: {key}"
    if not url:
        raise NotifyConfigError(f"{where} is empty")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise NotifyConfigError(f"{where} contains whitespace or a control character (percent-encode it)")
    if not url.isascii():
        raise NotifyConfigError(f"{where} contains non-ASCII characters (percent-encode them, or use the "
                                f"host's punycode form)")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0-65535
    except ValueError:
        raise NotifyConfigError(f"{where} is malformed (a bad port or IPv6 address)") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise NotifyConfigError(f"{where} must start with http:// or https://")
    if not parts.hostname:
        raise NotifyConfigError(f"{where} has no host")
    return parts


def url_secrets(url: str) -> list[str]:
    """The forms in which a secret URL can show up in an error, longest first (each is replaced before its parts):
    whole, without its scheme, its path with and without its query (a Slack webhook's path is all secret: team, bot
    and token), its last path segment (the token), its query, its userinfo's password (as written and decoded)."""
    parts = urllib.parse.urlsplit(url)
    forms = [url, url.split("://", 1)[-1]]
    if parts.query:
        forms.append(parts.path + "?" + parts.query)
    if len(parts.path) > 1:
        forms.append(parts.path)
    last = parts.path.rstrip("/").rsplit("/", 1)[-1]
    if len(last) >= 8:
        forms.append(last)
    if parts.query:
        forms.append(parts.query)
    if parts.password:
        forms += [parts.password, urllib.parse.unquote(parts.password)]
    return forms


def _opener(context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    """An opener that verifies TLS with `context` (the default CAs when None) and follows no redirect: a 3xx comes
    back as an HTTPError."""
    import urllib.request

    from outrider.adapters.outbound import connection_classes

    plain, tls = connection_classes()  # sockets registered with the call's Deadline

    class RefuseRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                             headers: Any, newurl: str) -> urllib.request.Request | None:
            return None

    class BoundedHTTP(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> Any:
            return self.do_open(plain, req)  # type: ignore[arg-type]

    class BoundedHTTPS(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> Any:
            return self.do_open(tls, req, context=context)  # type: ignore[arg-type]

    return urllib.request.build_opener(RefuseRedirects(), BoundedHTTP(), BoundedHTTPS(context=context))


@dataclass
class Notifier:
    """One receiver. Subclasses set `type` and build requests in `send`; `batch` is how many queued
    notifications one request may carry."""

    name: str
    spec: Mapping[str, Any]
    timeout_s: float = 10.0
    secrets: list[str] = field(default_factory=list)  # values scrubbed from every message this notifier logs
    _opener: urllib.request.OpenerDirector | None = field(default=None, init=False, repr=False)

    type: ClassVar[str] = ""
    batch: ClassVar[int] = 1
    # How long the first queued notification waits for others to share its request (receivers that post one
    # message per request, where a storm of messages is the problem). A receiver's group_wait_s overrides it.
    default_group_wait_s: ClassVar[float] = 0.0
    durable: ClassVar[bool] = True  # queued on disk (the log notifier needs no outbox)

    def __post_init__(self) -> None:
        """Subclasses read their settings and secrets here (a bad one raises NotifyConfigError)."""

    def http_options(self) -> None:
        """Options every HTTP receiver takes: bearer_token_{env,file}, basic_auth_username with
        basic_auth_password_{env,file}, and ca_file (a private CA for the receiver's TLS certificate)."""
        self.headers: dict[str, str] = {}
        token = read_secret(self.spec, "bearer_token", self.name, required=False)
        if token:
            self.secrets.append(token)
            self.headers["Authorization"] = f"Bearer {token}"
        user = str(self.spec.get("basic_auth_username", ""))
        password = read_secret(self.spec, "basic_auth_password", self.name, required=bool(user))
        if password and not user:
            raise NotifyConfigError(f"receiver {self.name!r}: basic_auth_password needs basic_auth_username")
        if user:
            if token:
                raise NotifyConfigError(f"receiver {self.name!r}: set one of bearer_token and basic_auth")
            self._basic_auth(user, password)
        self.context: ssl.SSLContext | None = None
        ca_file = self.spec.get("ca_file")
        if ca_file:
            import ssl

            try:
                self.context = ssl.create_default_context(cafile=str(ca_file))
            except (OSError, ssl.SSLError) as e:
                raise NotifyConfigError(f"receiver {self.name!r}: ca_file {ca_file}: {e}") from None

    def _basic_auth(self, user: str, password: str) -> None:
        self.secrets.append(password)
        encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.secrets.append(encoded)
        self.headers["Authorization"] = f"Basic {encoded}"

    def http_url(self, url: str, key: str = "url") -> str:
        """The receiver's URL, checked, with credentials in it (`https://user:password@host`) taken out and sent
        as basic auth instead (urllib would not send them; and a URL is shown where a password must not be).
        Call after http_options."""
        parts = check_url(url, self.name, key)
        if parts.username is None and parts.password is None:
            return url
        self.secrets += url_secrets(url)
        if "Authorization" in self.headers:
            raise NotifyConfigError(f"receiver {self.name!r}: credentials both in {key} and in "
                                    f"bearer_token/basic_auth: keep one")
        self._basic_auth(urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or ""))
        host = parts.netloc.rsplit("@", 1)[1]
        return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))

    def send(self, notifications: list[Notification]) -> Outcome:
        raise NotImplementedError

    def refresh(self, firing: list[Notification]) -> Outcome | None:
        """Called every resend interval with the alerts still firing, while nothing is queued (Alertmanager)."""
        return None

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            if secret:
                text = text.replace(secret, "<secret>")
        return text

    def post_json(self, url: str, body: Any, headers: Mapping[str, str] | None = None) -> Outcome:
        import http.client
        import urllib.request

        data = json.dumps(body, separators=(",", ":")).encode()
        request = urllib.request.Request(url, data=data, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": "outrider", **getattr(self, "headers", {}),
            **(headers or {})})
        opener = self._opener
        if opener is None:
            opener = self._opener = _opener(getattr(self, "context", None))
        deadline = Deadline(self.timeout_s)  # timeout_s bounds the whole call, not each read
        try:
            with deadline, opener.open(request, timeout=self.timeout_s) as response:
                response.read(MAX_REPLY_BYTES)  # the reply is not needed: what is unread is dropped with the socket
                return DELIVERED
        except urllib.error.HTTPError as e:
            try:
                text = e.read(512).decode("utf-8", "replace").strip()
            except (OSError, http.client.HTTPException):
                text = ""
            if 300 <= e.code < 400:
                return Outcome("retry", f"HTTP {e.code}: the receiver redirects, and redirects are not followed "
                                        f"(they would carry its credentials elsewhere): fix its URL")
            detail = self.scrub(one_line(f"HTTP {e.code}: {text[:200]}"))
            if e.code == 429 or e.code >= 500:
                return Outcome("retry", detail, _retry_after(e.headers.get("Retry-After")))
            return Outcome("rejected", detail)
        except Exception as e:  # any failure to deliver (DNS, TLS, reset, a malformed answer) is retried
            if deadline.expired:
                return Outcome("retry", f"no complete answer within {self.timeout_s:g} s (the receiver's timeout_s "
                                        f"bounds the whole delivery)", reason="deadline")
            return Outcome("retry", self.describe(e))

    def describe(self, e: BaseException) -> str:
        """An exception as one line with the secrets scrubbed (urllib wraps the cause in URLError.reason)."""
        reason = getattr(e, "reason", None) if isinstance(e, urllib.error.URLError) else None
        cause = reason if isinstance(reason, BaseException) else e
        return self.scrub(one_line(f"{type(cause).__name__}: {cause}"))


def one_line(text: str) -> str:
    """A receiver's words as one log line: what it sent after a line break would read as a line of the agent's own.
    Breaks are written as \\r and \\n (no secret has one: each is scrubbed afterwards, whole)."""
    return text.strip().replace("\r", "\\r").replace("\n", "\\n")


def _retry_after(value: str | None) -> float:
    if not value:
        return 0.0
    try:
        return max(0.0, min(float(value), 3600.0))
    except ValueError:
        return 0.0
