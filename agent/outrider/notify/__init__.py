"""Notifiers, one per file (Alertmanager, PagerDuty, Slack, webhook, log), the durable outbox, and the
dispatcher that routes alert transitions to receivers and delivers them without losing one."""

from outrider.notify.base import Notification, NotifyConfigError, Outcome
from outrider.notify.dispatcher import NOTIFIERS, Dispatcher, load_receivers, parse_receivers

__all__ = ["NOTIFIERS", "Dispatcher", "Notification", "NotifyConfigError", "Outcome", "load_receivers",
           "parse_receivers"]
