"""The agent's rule engine: feeds every sweep into the bounded store, evaluates the rule groups when due, turns
alert transitions into notifications, and keeps its state across restarts.

Time is the agent's evaluation clock: wall time read once at start, advanced by the monotonic clock, so a wall
clock stepped backwards or forwards while the agent runs changes neither rates nor `for` durations.

State that survives a restart, in state_dir: the alerts (pending and firing, with the time they became active,
as ALERTS_FOR_STATE lets Prometheus restore them), the notifications already sent (so a restart neither repeats
a page nor forgets a resolve), and a snapshot of the sample store (so windows such as rate(...[10m]) do not go
empty and resolve every alert after a restart).
"""

from __future__ import annotations

import base64
import bisect
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from outrider.ground.clock import SYSTEM, Clock
from outrider.metrics.catalog import CATALOG, Label
from outrider.metrics.exposition import format_le
from outrider.metrics.family import Family, HistogramValue
from outrider.rules.notification import Notification
from outrider.rules.promql import Evaluator, normalised_le
from outrider.rules.rule import Alert, AlertingRule, Group, retention
from outrider.rules.store import Labels, Series, SeriesStore, is_stale

LOG = logging.getLogger("outrider.rules")
STATE_VERSION = 1
SNAPSHOT_EVERY_S = 300.0  # and at shutdown: a 1.7 MiB store is about 2.3 MB written per snapshot
STACK_DUMP_CHARS = 8000

# (pid, rank, path, the Python stacks) of processes now stalled, read safely from the spool by the hook collector
StackDumps = Callable[[], list[tuple[int, str, str, str]]]


class EvalClock:
    """Milliseconds since the epoch, anchored to the wall clock once and advanced by the monotonic clock."""

    def __init__(self, clock: Clock = SYSTEM) -> None:
        self._monotonic = clock.monotonic
        self._wall, self._mono = clock.wall(), clock.monotonic()

    def now_ms(self) -> int:
        return int((self._wall + self._monotonic() - self._mono) * 1000)


class RuleEngine:
    def __init__(self, groups: list[Group], interval_s: float, state_dir: str | None = None,
                 notify: Callable[[Notification], None] | None = None, job: str = "outrider",
                 instance: str = "", stack_dumps: StackDumps | None = None,
                 clock: Callable[[], int] | None = None, compat: int = 3) -> None:
        self.groups = groups
        self.interval_ms = int(interval_s * 1000)
        self.retention_ms = retention(groups, self.interval_ms)
        self.store = SeriesStore(self.retention_ms)
        self.evaluator = Evaluator(self.store, compat=compat)
        # A bucket's le as the Prometheus of that version stores it from the agent's page: 2 keeps the text
        # (format_le's "1000000.0"), 3 normalises it ("1e+06"), so a rule's {le="..."} selects what it would there
        self._le = normalised_le if compat >= 3 else format_le
        self.state_dir = state_dir
        self.notify = notify or (lambda n: None)
        self.target = {"job": job, "instance": instance or socket.gethostname()}
        self.stack_dumps = stack_dumps
        self.now_ms = clock or EvalClock().now_ms
        self.alerting = [(g, r) for g in groups for r in g.rules if isinstance(r, AlertingRule)]
        self.notified: dict[str, Notification] = {}
        self.evaluations = 0
        self.failures: dict[str, int] = {}
        self.last_duration_s = 0.0
        # When each group is next due, on the grid of its interval from its first evaluation (as Prometheus keeps
        # its groups), so evaluations average the group's interval whatever the sweeps' period and jitter
        self._due: dict[int, int] = {}
        self._last_ingest = -(2**62)
        self._lock = threading.Lock()
        self._saved_state = ""
        self._last_snapshot = time.monotonic()
        if state_dir:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
            self._restore()

    # --- input ---------------------------------------------------------------------------------------------------

    def on_sweep(self, families: list[Family]) -> None:
        """The sampler's listener: ingest the sweep at most once per rule interval (as a scrape interval would,
        which bounds the store however often the agent sweeps), and evaluate what is due."""
        ts = self.now_ms()
        if ts - self._last_ingest >= self.interval_ms * 0.9:
            self._last_ingest = ts
            self.ingest(families, ts)
        if any(self._is_due(i, ts) for i in range(len(self.groups))):
            self.evaluate(ts)

    def ingest(self, families: list[Family], ts: int) -> None:
        store, target = self.store, self.target
        present: dict[str, set[Labels]] = {}
        for fam in families:
            d = fam.defn
            names = (d.name + "_bucket", d.name + "_sum", d.name + "_count") if d.type == "histogram" else (d.name,)
            if not any(store.wants(n) for n in names):
                continue
            label_names = d.label_names
            for n in names:
                present.setdefault(n, set())
            for values, value in fam.samples:
                base = {k: v for k, v in zip(label_names, values) if v != ""}
                base.update(target)
                if isinstance(value, HistogramValue):
                    self._histogram(d.name, base, value, ts, present)
                else:
                    key = _labels(d.name, base)
                    store.add(key, ts, value)
                    present[d.name].add(key)
        for name, keys in present.items():
            store.mark_stale(name, keys, ts)

    def _histogram(self, name: str, base: dict[str, str], value: HistogramValue, ts: int,
                   present: dict[str, set[Labels]]) -> None:
        store = self.store
        if store.wants(name + "_bucket"):
            for bound, count in zip((*value.bounds, math.inf), value.cumulative()):
                key = _labels(name + "_bucket", {**base, "le": self._le(bound)})
                store.add(key, ts, float(count))
                present[name + "_bucket"].add(key)
        for suffix, v in (("_sum", value.sum), ("_count", float(value.count))):
            if store.wants(name + suffix):
                key = _labels(name + suffix, base)
                store.add(key, ts, v)
                present[name + suffix].add(key)

    # --- evaluation ----------------------------------------------------------------------------------------------

    def _is_due(self, i: int, ts: int) -> bool:
        """Whether group i is due at ts: its grid time, less a tenth of the rule interval for a sweep's jitter (a
        sweep a moment early takes the evaluation; the next stays on the grid)."""
        return ts >= self._due.get(i, 0) - self.interval_ms // 10

    def evaluate(self, ts: int) -> None:
        t0 = time.perf_counter()
        for i, g in enumerate(self.groups):
            if not self._is_due(i, ts):
                continue
            due = self._due.get(i, ts) + g.interval_ms
            # behind by a whole interval or more (a paused agent, a slow sweep): a new grid from now, no burst
            self._due[i] = due if due > ts else ts + g.interval_ms
            g.evaluate(self.evaluator, self.store, ts)
            for rule in g.rules:
                if rule.last_error:
                    self.failures[rule.name] = self.failures.get(rule.name, 0) + 1
                    if self.failures[rule.name] in (1, 100):
                        LOG.warning("rule %s failed to evaluate: %s (counted in "
                                    "outrider_rule_evaluation_failures_total)", rule.name, rule.last_error)
        self.evaluations += 1
        self._transitions(ts)
        self.store.trim(ts)
        self.last_duration_s = time.perf_counter() - t0
        if self.state_dir:
            self._save_state()
            if time.monotonic() - self._last_snapshot >= SNAPSHOT_EVERY_S:
                self.save_snapshot()

    def _transitions(self, ts: int) -> None:
        firing: dict[str, tuple[AlertingRule, Alert]] = {}
        resolved_at: dict[str, int] = {}
        for _, rule in self.alerting:
            for alert in rule.active.values():
                if alert.state == "firing":
                    firing[alert.fingerprint] = (rule, alert)
                elif alert.state == "inactive":
                    resolved_at[alert.fingerprint] = alert.resolved_at
        out: list[Notification] = []
        with self._lock:
            for fp, (rule, alert) in firing.items():
                sent = self.notified.get(fp)
                if sent is not None:  # still firing: re-sends (Alertmanager) carry the current annotations
                    current = {**sent.annotations, **alert.annotations}
                    if current != sent.annotations:
                        self.notified[fp] = replace(sent, annotations=current, value=alert.value)
                    continue
                n = Notification(f"{fp}-{alert.fired_at}-firing", "firing", dict(alert.labels),
                                 self._annotations(rule, alert), alert.active_at / 1000, 0.0, fp, time.time(),
                                 alert.value, alert.fired_at / 1000)
                self.notified[fp] = n
                out.append(n)
            for fp, sent in list(self.notified.items()):
                if fp in firing:
                    continue
                ended = resolved_at.get(fp, ts) / 1000
                out.append(replace(sent, id=sent.id.replace("-firing", "-resolved"), event="resolved",
                                   ends_at=ended, created=time.time()))
                del self.notified[fp]
        for n in out:
            self.notify(n)

    def _annotations(self, rule: AlertingRule, alert: Alert) -> dict[str, str]:
        """The alert's annotations; a stall alert also gets the stalled process's Python stacks."""
        annotations = dict(alert.annotations)
        if self.stack_dumps is None or "outrider_hook_stalled" not in rule.expr_text:
            return annotations
        rank = dict(alert.labels).get("rank", "")
        try:
            dumps = [d for d in self.stack_dumps() if not rank or d[1] == rank]
        except Exception:
            LOG.exception("reading stack dumps failed")
            return annotations
        texts = [f"pid {pid}:\n{text[:STACK_DUMP_CHARS]}" for pid, _, _, text in dumps]
        paths = [path for _, _, path, _ in dumps]
        if texts:
            annotations["stack_dump"] = "\n".join(texts)[:STACK_DUMP_CHARS]
            annotations["stack_dump_file"] = ", ".join(paths)
        return annotations

    def firing_notifications(self) -> list[Notification]:
        """What is firing now, as notified (for Alertmanager's re-sends)."""
        with self._lock:
            return list(self.notified.values())

    def active_alerts(self) -> list[tuple[AlertingRule, Alert]]:
        return [(r, a) for _, r in self.alerting for a in list(r.active.values()) if a.state != "inactive"]

    # --- output --------------------------------------------------------------------------------------------------

    def families(self) -> list[Family]:
        active = self.active_alerts()
        extra: list[str] = sorted({k for _, a in active for k, _ in a.labels} - {"alertname", "alertstate"})
        extra_labels = tuple(Label(n, f"outrider.alert.label.{n}") for n in extra)  # OTLP: Outrider's namespace
        alerts_def = CATALOG["outrider_alerts"]
        alerts_def = replace(alerts_def, labels=alerts_def.labels + extra_labels)
        for_def = CATALOG["outrider_alert_active_since_timestamp_seconds"]
        for_def = replace(for_def, labels=for_def.labels + extra_labels)
        alerts_fam, for_fam = Family(alerts_def), Family(for_def)
        for _, a in active:
            labels = dict(a.labels)
            rest = tuple(labels.get(n, "") for n in extra)
            alerts_fam.add(1, labels["alertname"], a.state, *rest)
            for_fam.add(a.active_at / 1000, labels["alertname"], *rest)
        failures = Family("outrider_rule_evaluation_failures_total")
        for rule, count in sorted(self.failures.items()):
            failures.add(count, rule)
        return [
            alerts_fam, for_fam, failures,
            Family("outrider_rule_evaluations_total").add(self.evaluations),
            Family("outrider_rule_evaluation_duration_seconds").add(self.last_duration_s),
            Family("outrider_rule_store_series").add(self.store.series_count()),
            Family("outrider_rule_store_samples").add(self.store.sample_count()),
            Family("outrider_rule_store_bytes").add(self.store.memory_bytes()),
            Family("outrider_rule_store_out_of_order_samples_total").add(self.store.dropped_out_of_order),
        ]

    # --- persistence ---------------------------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        assert self.state_dir
        return os.path.join(self.state_dir, name)

    def _save_state(self) -> None:
        with self._lock:
            notified = [n.to_json() for n in self.notified.values()]
        state = {
            "version": STATE_VERSION,
            "rules": {f"{g.name}/{r.name}": [a.to_json() for a in r.active.values()] for g, r in self.alerting},
            "notified": notified,
        }
        text = json.dumps(state, sort_keys=True)
        if text == self._saved_state:
            return
        try:
            _atomic_write(self._path("alerts.json"), text.encode())
            self._saved_state = text
        except OSError as e:
            LOG.warning("cannot save alert state in %s: %s", self.state_dir, e.strerror or e)

    def save_snapshot(self) -> None:
        self._last_snapshot = time.monotonic()
        lines = []
        for name in list(self.store.names()):
            for labels, series in list(self.store.candidates(name)):
                lines.append(json.dumps({"l": labels, "t": base64.b64encode(series.times.tobytes()).decode(),
                                         "v": base64.b64encode(series.values.tobytes()).decode()}))
        try:
            _atomic_write(self._path("series.snapshot"), "\n".join(lines).encode())
        except OSError as e:
            LOG.warning("cannot save the rule store snapshot in %s: %s", self.state_dir, e.strerror or e)

    def _restore(self) -> None:
        # A state saved while the wall clock was ahead (corrected backwards since, across the restart) must not put
        # fresh samples "out of order" for as long as the correction, nor start a `for` in the future.
        now = self.now_ms()
        try:
            with open(self._path("alerts.json"), encoding="utf-8") as fh:
                state = json.load(fh)
            if state.get("version") != STATE_VERSION:
                raise ValueError(f"state version {state.get('version')}")
            by_key = {f"{g.name}/{r.name}": r for g, r in self.alerting}
            restored = 0
            for key, alerts in state.get("rules", {}).items():
                rule = by_key.get(key)
                if rule is None:
                    continue
                for data in alerts:
                    alert = Alert.from_json(data)
                    alert.active_at = min(alert.active_at, now)
                    alert.fired_at = min(alert.fired_at, now)
                    rule.active[alert.labels] = alert
                    restored += 1
            for data in state.get("notified", []):
                n = Notification.from_json(data)
                self.notified[n.fingerprint] = n
            LOG.info("restored %d alerts and %d sent notifications from %s", restored, len(self.notified),
                     self.state_dir)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as e:
            LOG.warning("alert state in %s is unreadable (%s): starting without it", self.state_dir, e)
        future = 0
        try:
            with open(self._path("series.snapshot"), encoding="utf-8") as fh:
                for line in fh:
                    data = json.loads(line)
                    labels = tuple((str(k), str(v)) for k, v in data["l"])
                    name = dict(labels).get("__name__", "")
                    if not self.store.wants(name):
                        continue
                    series = Series()
                    series.times.frombytes(base64.b64decode(data["t"]))
                    series.values.frombytes(base64.b64decode(data["v"]))
                    if len(series.times) == len(series.values):
                        keep = bisect.bisect_right(series.times, now)
                        if keep < len(series.times):
                            future += len(series.times) - keep
                            del series.times[keep:], series.values[keep:]
                        series.stale = sum(1 for v in series.values if is_stale(v))
                        self.store.put(labels, series)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as e:
            LOG.warning("rule store snapshot in %s is unreadable (%s): starting without history", self.state_dir, e)
        if future:
            LOG.warning("the rule store snapshot in %s held %d samples newer than now (the clock went back since it "
                        "was saved): left out, so that fresh samples are taken in", self.state_dir, future)

    def close(self) -> None:
        if self.state_dir:
            self._save_state()
            self.save_snapshot()


def _labels(name: str, labels: dict[str, str]) -> Labels:
    return tuple(sorted([*labels.items(), ("__name__", name)]))


def _atomic_write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
