"""Wires the agent's own alerting: the rule files it evaluates, the receivers it notifies, and where their
state lives. Every mistake (a rule outside the embedded subset, a receiver without its secret) is a ConfigError
at start, naming the file, the rule or the receiver."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outrider.ground.config import Config, ConfigError, default_state_dir

if TYPE_CHECKING:
    from outrider.rules.engine import StackDumps
    from outrider.rules.rule import Group

# The rule engine, PromQL parser and notifiers are imported only when the agent evaluates rules, so an agent with
# rule_files empty pays nothing for them (the parser alone is about 4 MiB of RSS).
LOG = logging.getLogger("outrider.alerting")


def rule_groups(config: Config) -> list[Group]:
    from outrider.rules.files import default_rules_path
    from outrider.rules.rule import RuleLoadError, load_groups

    groups: list[Group] = []
    interval_ms = int(config.rule_interval_s * 1000)
    try:
        for name in config.rule_files:
            if name == "builtin":
                groups += load_groups([default_rules_path()], interval_ms, list(config.rule_settings))
            else:
                groups += load_groups([Path(name)], interval_ms)
    except RuleLoadError as e:
        raise ConfigError(f"rule_files: {e}") from None
    return groups


def receivers(config: Config) -> list[tuple[Any, Any]]:
    from outrider.notify.alertmanager import AlertmanagerNotifier
    from outrider.notify.base import NotifyConfigError
    from outrider.notify.dispatcher import Route, load_receivers
    from outrider.notify.log import LogNotifier

    out: list[tuple[Any, Any]] = []
    try:
        if config.alert_log:
            out.append((LogNotifier("log", {}), Route()))
        for i, url in enumerate(config.alertmanager_urls):
            out.append((AlertmanagerNotifier(f"alertmanager-{i}", {"url": url}), Route(heartbeats=True)))
        if config.receivers_file:
            out.extend(load_receivers(config.receivers_file))
    except NotifyConfigError as e:
        raise ConfigError(str(e)) from None
    return out


def claim_state_dir(config: Config) -> tuple[str | None, int | None]:
    """The state directory, locked for this agent. A second agent on the same directory gets a private one,
    removed when it stops, rather than sharing an outbox. A directory that cannot be used (a read-only root
    filesystem without the volume) is not fatal: the agent alerts with its state in a temporary directory, and
    says that the state will not outlive it."""
    path = config.state_dir or default_state_dir()
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(path, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        try:
            private = tempfile.mkdtemp(prefix="outrider-state-")
        except OSError:
            private = None
        LOG.error("state_dir %s is unusable (%s): alert state and queued notifications are kept in %s and will "
                  "not survive a restart; set state_dir to a writable volume", path, e.strerror or e,
                  private or "memory")
        return private, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return path, fd
    except OSError:
        os.close(fd)
        private = tempfile.mkdtemp(prefix="agent-", dir=path)
        LOG.warning("another agent holds %s: keeping this agent's alert state in %s", path, private)
        return private, None


class Alerting:
    """The engine and the dispatcher of one agent."""

    def __init__(self, config: Config, stack_dumps: StackDumps | None = None) -> None:
        from outrider.notify.dispatcher import Dispatcher
        from outrider.rules.engine import RuleEngine

        groups = rule_groups(config)
        routes = receivers(config)
        self.state_dir, self._lock_fd = claim_state_dir(config)
        self.engine = RuleEngine(groups, config.rule_interval_s, self.state_dir, job=config.alert_job,
                                 instance=config.alert_instance, stack_dumps=stack_dumps,
                                 compat=config.promql_compat)
        self.dispatcher = Dispatcher(routes, self.state_dir, self.engine.firing_notifications,
                                     config.resend_interval_s)
        self.engine.notify = self.dispatcher.notify

    def start(self) -> None:
        self.dispatcher.start()

    def stop(self, timeout_s: float) -> None:
        self.engine.close()
        self.dispatcher.stop(timeout_s)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        elif self.state_dir and self.dispatcher.idle():
            shutil.rmtree(self.state_dir, ignore_errors=True)  # private and delivered: nothing to keep


def build(config: Config, stack_dumps: StackDumps | None = None) -> Alerting | None:
    if not config.rule_files:
        return None
    return Alerting(config, stack_dumps)
