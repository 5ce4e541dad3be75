"""What every notifier shares: the notification a receiver gets, the outcome of one delivery attempt, HTTP
delivery with its outcome classified, and secrets read from the environment or a file (never from the config).

Outcomes: 2xx is delivered; 429, 5xx, timeouts and connection errors are retried with backoff (honouring
Retry-After); any other 4xx is rejected: the message is dropped, logged and counted, since sending the same
request again cannot succeed.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, ClassVar

from outrider.rules.notification import Notification as Notification  # the notifiers' input, defined by rules


class NotifyConfigError(ValueError):
    """A bad receiver definition; the message names the receiver and the key."""


@dataclass(frozen=True)
class Outcome:
    kind: str  # delivered | retry | rejected
    detail: str = ""
    retry_after_s: float = 0.0

    @property
    def delivered(self) -> bool:
        return self.kind == "delivered"


DELIVERED = Outcome("delivered")


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
        if not value:
            raise NotifyConfigError(f"receiver {receiver!r}: {key}_file {path} is empty")
        return value
    if required:
        raise NotifyConfigError(f"receiver {receiver!r}: needs {key}_env or {key}_file")
    return ""


@dataclass
class Notifier:
    """One receiver. Subclasses set `type` and build requests in `send`; `batch` is how many queued
    notifications one request may carry."""

    name: str
    spec: Mapping[str, Any]
    timeout_s: float = 10.0
    secrets: list[str] = field(default_factory=list)  # values scrubbed from every message this notifier logs

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
            self.secrets.append(password)
            encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.secrets.append(encoded)
            self.headers["Authorization"] = f"Basic {encoded}"
        self.context: ssl.SSLContext | None = None
        ca_file = self.spec.get("ca_file")
        if ca_file:
            try:
                self.context = ssl.create_default_context(cafile=str(ca_file))
            except (OSError, ssl.SSLError) as e:
                raise NotifyConfigError(f"receiver {self.name!r}: ca_file {ca_file}: {e}") from None

    def send(self, notifications: list[Notification]) -> Outcome:
        raise NotImplementedError

    def refresh(self, firing: list[Notification]) -> None:
        """Called every resend interval with the alerts still firing, while nothing is queued (Alertmanager)."""

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            if secret:
                text = text.replace(secret, "<secret>")
        return text

    def post_json(self, url: str, body: Any, headers: Mapping[str, str] | None = None) -> Outcome:
        data = json.dumps(body, separators=(",", ":")).encode()
        request = urllib.request.Request(url, data=data, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": "outrider", **getattr(self, "headers", {}),
            **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s,
                                        context=getattr(self, "context", None)) as response:
                response.read(65536)
                return DELIVERED
        except urllib.error.HTTPError as e:
            text = e.read(512).decode("utf-8", "replace").strip()
            detail = self.scrub(f"HTTP {e.code}: {text[:200]}")
            if e.code == 429 or e.code >= 500:
                return Outcome("retry", detail, _retry_after(e.headers.get("Retry-After")))
            return Outcome("rejected", detail)
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            return Outcome("retry", self.scrub(f"{type(reason).__name__}: {reason}"))


def _retry_after(value: str | None) -> float:
    if not value:
        return 0.0
    try:
        return max(0.0, min(float(value), 3600.0))
    except ValueError:
        return 0.0
