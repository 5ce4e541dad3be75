"""Routing and delivery: each alert transition goes to every receiver whose matchers it satisfies, through that
receiver's outbox, on that receiver's own thread (a slow or dead receiver never holds up another).

A failed delivery that can succeed later (429, 5xx, a redirect, a timeout, a connection, DNS or TLS error, any
exception a notifier raises) is counted and retried with exponential backoff and jitter (50-100% of the step),
honouring Retry-After, with the queue held in order; a rejected one (other 4xx) is dropped, logged and counted.
Failures are logged as one scrubbed line, never with a traceback (whose messages could carry a URL or a token).
Delivery metrics: sent, failed (by reason), queued, oldest queued age.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from outrider.ground import regex
from outrider.metrics.family import Family
from outrider.notify.alertmanager import AlertmanagerNotifier
from outrider.notify.base import Notification, Notifier, NotifyConfigError, Outcome
from outrider.notify.log import LogNotifier
from outrider.notify.outbox import DROP_REASONS, Outbox
from outrider.notify.pagerduty import PagerDutyNotifier
from outrider.notify.slack import SlackNotifier
from outrider.notify.webhook import WebhookNotifier
from outrider.rules.notification import HEARTBEAT_SEVERITY

LOG = logging.getLogger("outrider.notify")
NOTIFIERS: dict[str, type[Notifier]] = {
    cls.type: cls for cls in (AlertmanagerNotifier, PagerDutyNotifier, SlackNotifier, WebhookNotifier, LogNotifier)}
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
ROUTE_KEYS = {"name", "type", "match", "match_re", "timeout_s", "group_wait_s", "heartbeats"}


@dataclass
class Route:
    match: dict[str, str] = field(default_factory=dict)
    match_re: dict[str, regex.Pattern] = field(default_factory=dict)
    group_wait_s: float = 0.0
    # Deliver heartbeats (always-firing alerts of severity "none": the Watchdog) without the route naming them.
    # On for Alertmanager, which routes them to a dead man's switch itself; off for pagers, chat and webhooks,
    # which would otherwise get a notification at every start that nobody should act on.
    heartbeats: bool = False

    def accepts(self, labels: Mapping[str, str]) -> bool:
        if labels.get("severity") == HEARTBEAT_SEVERITY and not self.heartbeats and \
                "severity" not in self.match and "severity" not in self.match_re:
            return False
        return all(labels.get(k, "") == v for k, v in self.match.items()) and all(
            p.fullmatch(labels.get(k, "")) is not None for k, p in self.match_re.items())


def parse_receivers(data: Any, source: str) -> list[tuple[Notifier, Route]]:
    """Receivers from a receivers file's data: `receivers: [{name, type, match, match_re, ...}]`."""
    if not isinstance(data, dict) or not isinstance(data.get("receivers"), list):
        raise NotifyConfigError(f"{source}: expected a top-level 'receivers' list")
    out: list[tuple[Notifier, Route]] = []
    names: set[str] = set()
    for i, spec in enumerate(data["receivers"]):
        if not isinstance(spec, dict):
            raise NotifyConfigError(f"{source}: receiver {i} is not a mapping")
        name = str(spec.get("name", ""))
        if not NAME_RE.match(name) or name in names:
            raise NotifyConfigError(f"{source}: receiver {i}: needs a unique name of letters, digits, '_', '.', '-'")
        names.add(name)
        kind = spec.get("type")
        if kind not in NOTIFIERS:
            raise NotifyConfigError(f"{source}: receiver {name!r}: type must be one of {', '.join(NOTIFIERS)}")
        route = Route(heartbeats=_flag(spec.get("heartbeats", kind == "alertmanager"), name, source))
        for key in ("match", "match_re"):
            raw = spec.get(key) or {}
            if not isinstance(raw, dict):
                raise NotifyConfigError(f"{source}: receiver {name!r}: {key} must map label names to values")
            for label, value in raw.items():
                if key == "match":
                    route.match[str(label)] = str(value)
                    continue
                try:  # RE2 (linear time), anchored at both ends as Alertmanager's match_re
                    route.match_re[str(label)] = regex.compile(str(value))
                except regex.RegexError as e:
                    raise NotifyConfigError(f"{source}: receiver {name!r}: match_re {label}: {e}") from None
        cls = NOTIFIERS[str(kind)]
        try:
            timeout = float(spec.get("timeout_s", 10.0))
            route.group_wait_s = float(spec.get("group_wait_s", cls.default_group_wait_s))
        except (TypeError, ValueError):
            raise NotifyConfigError(f"{source}: receiver {name!r}: timeout_s and group_wait_s are seconds") from None
        params = {k: v for k, v in spec.items() if k not in ROUTE_KEYS}
        try:
            notifier = cls(name, params, timeout)
        except NotifyConfigError as e:
            raise NotifyConfigError(f"{source}: {e}") from None
        out.append((notifier, route))
    return out


def _flag(raw: Any, name: str, source: str) -> bool:
    if not isinstance(raw, bool):
        raise NotifyConfigError(f"{source}: receiver {name!r}: heartbeats must be true or false")
    return raw


def load_receivers(path: str) -> list[tuple[Notifier, Route]]:
    from outrider.ground.config import ConfigError, read_yaml_file

    try:
        data = read_yaml_file(path)
    except ConfigError as e:
        raise NotifyConfigError(f"receivers_file: {e}") from None
    return parse_receivers(data, f"receivers_file {path}")


class Delivery:
    """One receiver's queue and the thread that drains it."""

    def __init__(self, notifier: Notifier, route: Route, outbox: Outbox, resend_interval_s: float,
                 firing: Callable[[], list[Notification]], retry_initial_s: float, retry_max_s: float) -> None:
        self.notifier, self.route, self.outbox = notifier, route, outbox
        self.resend_interval_s = resend_interval_s
        self.firing = firing
        self.retry_initial_s, self.retry_max_s = retry_initial_s, retry_max_s
        self.sent = 0
        self.failed: dict[str, int] = {"retry": 0, "rejected": 0}
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"outrider-notify-{notifier.name}", daemon=True)
        self._attempt = 0
        self._last_refresh = time.monotonic()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                delay = self.step()
            except Exception as e:  # a notifier bug must not end delivery: counted, retried like any failure
                LOG.debug("receiver %s: %s", self.notifier.name,
                          self.notifier.scrub("".join(traceback.format_exception(e))))
                delay = self._failed(Outcome("retry", "unexpected " + self.notifier.describe(e)), [])
            self.wake.wait(delay)
            self.wake.clear()

    def step(self) -> float:
        """Try the head of the queue once; returns how long to wait before the next try."""
        self.outbox.persist_pending()
        batch = self.outbox.peek(self.notifier.batch)
        if not batch:
            self._attempt = 0
            if time.monotonic() - self._last_refresh >= self.resend_interval_s:
                self._last_refresh = time.monotonic()
                outcome = self.notifier.refresh([n for n in self.firing() if self.route.accepts(n.labels)])
                if outcome is not None and not outcome.delivered:  # counted; the next resend is the retry
                    reason = outcome.reason or outcome.kind
                    self.failed[reason] = self.failed.get(reason, 0) + 1
                    LOG.warning("receiver %s: re-sending the firing alerts failed (%s); next try in %g s",
                                self.notifier.name, outcome.detail, self.resend_interval_s)
            return max(0.05, self.resend_interval_s - (time.monotonic() - self._last_refresh))
        if len(batch) < self.notifier.batch and self._attempt == 0:
            wait = batch[0].created + self.route.group_wait_s - time.time()
            if wait > 0:  # gather what arrives with it into one request
                return wait
        outcome = self.notifier.send(batch)
        if outcome.delivered:
            self.outbox.ack(len(batch))
            self.sent += len(batch)
            if self._attempt:
                LOG.info("receiver %s: delivering again after %d failed attempts", self.notifier.name, self._attempt)
            self._attempt = 0
            return 0.0
        return self._failed(outcome, batch)

    def _failed(self, outcome: Outcome, batch: list[Notification]) -> float:
        """Count a failed attempt; drop a rejected batch; returns the wait before the next try."""
        reason = outcome.reason or outcome.kind
        self.failed[reason] = self.failed.get(reason, 0) + 1
        if outcome.kind == "rejected":
            LOG.error("receiver %s rejected %s %s (%s): dropped; fix the receiver's configuration (counted in "
                      "outrider_notify_failed_total)", self.notifier.name, batch[0].alertname, batch[0].event,
                      outcome.detail)
            self.outbox.ack(len(batch))
            return 0.0
        self._attempt += 1
        backoff = min(self.retry_max_s, self.retry_initial_s * 2.0 ** min(self._attempt - 1, 20))
        delay: float = max(outcome.retry_after_s, random.uniform(0.5, 1.0) * backoff)
        if self._attempt in (1, 3) or self._attempt % 20 == 0:
            LOG.warning("receiver %s: delivery failed (%s), attempt %d; retrying in %.1f s with %d queued",
                        self.notifier.name, outcome.detail, self._attempt, delay, len(self.outbox))
        return delay


class Dispatcher:
    def __init__(self, receivers: list[tuple[Notifier, Route]], state_dir: str | None,
                 firing: Callable[[], list[Notification]] = list, resend_interval_s: float = 60.0,
                 retry_initial_s: float = 1.0, retry_max_s: float = 300.0) -> None:
        self.deliveries: list[Delivery] = []
        for notifier, route in receivers:
            if isinstance(notifier, AlertmanagerNotifier):
                notifier.lease_s = 4 * resend_interval_s
            directory = os.path.join(state_dir, "outbox", notifier.name) if state_dir and notifier.durable else None
            self.deliveries.append(Delivery(notifier, route, Outbox(directory), resend_interval_s, firing,
                                            retry_initial_s, retry_max_s))

    def notify(self, n: Notification) -> None:
        for d in self.deliveries:
            if d.route.accepts(n.labels):
                d.outbox.put(n)
                d.wake.set()

    def start(self) -> None:
        for d in self.deliveries:
            d.thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        deadline = time.monotonic() + timeout_s
        for d in self.deliveries:
            d.stop.set()
            d.wake.set()
        for d in self.deliveries:
            if d.thread.is_alive():
                d.thread.join(max(0.0, deadline - time.monotonic()))

    def idle(self) -> bool:
        return all(len(d.outbox) == 0 for d in self.deliveries)

    def families(self) -> list[Family]:
        sent, failed = Family("outrider_notify_sent_total"), Family("outrider_notify_failed_total")
        queued, oldest = Family("outrider_notify_queued"), Family("outrider_notify_oldest_queued_age_seconds")
        write_errors = Family("outrider_notify_outbox_write_errors_total")
        dropped = Family("outrider_notify_dropped_total")
        for d in self.deliveries:
            name, kind = d.notifier.name, d.notifier.type
            sent.add(d.sent, name, kind)
            for reason in DROP_REASONS:  # each known reason from 0, so that increase() sees the first drop
                dropped.add(d.outbox.dropped.get(reason, 0), name, kind, reason)
            for reason, count in sorted(d.failed.items()):
                failed.add(count, name, kind, reason)
            queued.add(len(d.outbox), name, kind)
            oldest.add(d.outbox.oldest_age_s(), name, kind)
            write_errors.add(d.outbox.write_errors, name, kind)
        return [sent, failed, queued, oldest, write_errors, dropped]
