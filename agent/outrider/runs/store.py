"""The embedded run store: one SQLite file (runs.db) under runs_dir.

Per run: its KPIs per sweep (samples), its verdict changes (the timeline), its verdict so far (run_verdicts, kept
current while it runs, so a run cut short still has one), the alerts that fired and resolved during it, events
(stalls), and its duration distributions (distributions: what the run's step, data-wait and request histograms
recorded from its first sweep to its latest, whole and without its warm-up, runs/distributions.py; kept current
too). Tables are only ever added, so an older runs.db opens as it is, and its records have no distributions."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outrider.ground.clock import SYSTEM, Clock
from outrider.metrics import units
from outrider.metrics.family import HistogramValue
from outrider.runs.distributions import RUN, STEADY, from_json, to_json
from outrider.runs.verdict import RunVerdict, Segment, from_timeline

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, command TEXT, started REAL, ended REAL, exit_code INTEGER,
                                 summary TEXT);
CREATE TABLE IF NOT EXISTS samples (run_id TEXT, t REAL, name TEXT, value REAL);
CREATE INDEX IF NOT EXISTS samples_run ON samples (run_id, name, t);
CREATE TABLE IF NOT EXISTS verdicts (run_id TEXT, t REAL, class TEXT, reason TEXT, evidence TEXT);
CREATE TABLE IF NOT EXISTS events (run_id TEXT, t REAL, kind TEXT, text TEXT);
CREATE TABLE IF NOT EXISTS run_verdicts (run_id TEXT PRIMARY KEY, verdict TEXT);
CREATE TABLE IF NOT EXISTS alerts (run_id TEXT, fingerprint TEXT, name TEXT, labels TEXT, summary TEXT, fired REAL,
                                   resolved REAL);
CREATE TABLE IF NOT EXISTS alert_pending (run_id TEXT, fingerprint TEXT, fired REAL, pending REAL);
CREATE TABLE IF NOT EXISTS distributions (run_id TEXT, name TEXT, part TEXT, value TEXT,
                                          PRIMARY KEY (run_id, name, part));
"""


class RunNotFound(LookupError):
    pass


def default_runs_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "outrider"


@dataclass(frozen=True)
class AlertRecord:
    """An alert the agent's own rule evaluation fired during a run (resolved: None while it still fired at the end;
    fired: when it began firing, after its `for`; pending: when it became active, which may be before the run for an
    alert carried over in the agent's state, and equals fired where the alert has no `for` or the time is unknown)."""

    name: str
    labels: dict[str, str]
    summary: str
    fired: float
    resolved: float | None
    pending: float | None = None

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "")

    @property
    def active_since(self) -> float:
        """When it became active (pending), or when it fired where that is not known."""
        return self.fired if self.pending is None else min(self.pending, self.fired)

    def text(self, t0: float) -> str:
        """`ContainerMemoryNearLimit (warning) pending at 0:02, fired at 0:07, resolved at 0:09 after 2 s: <its
        summary>`, run time from t0: the page went out at the firing time, not when the alert became pending."""
        head = self.name + (f" ({self.severity})" if self.severity else "")

        def at(t: float) -> str:
            return f"at {units.run_time(t - t0)}" if t >= t0 else "before the run"

        fired = f"fired {at(self.fired)}"
        if self.active_since < self.fired:
            fired = f"pending {at(self.active_since)}, {fired}"
        if self.resolved is None:
            when = f"{fired}, still firing at the end"
        else:
            when = f"{fired}, resolved at {units.run_time(self.resolved - t0)} after " \
                   f"{units.seconds(self.resolved - self.fired)}"
        return f"{head} {when}" + (f": {self.summary}" if self.summary else "")


@dataclass
class RunRecord:
    id: str
    command: list[str]
    started: float
    ended: float | None
    exit_code: int | None
    summary: dict[str, Any]
    samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    verdicts: list[tuple[float, str, str, dict[str, float]]] = field(default_factory=list)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    alerts: list[AlertRecord] = field(default_factory=list)
    verdict: RunVerdict | None = None  # None for a record written before runs kept their verdict
    # name -> part (run, steady) -> what the run recorded (runs/distributions.py); empty for a record written before
    # runs kept them
    distributions: dict[str, dict[str, HistogramValue]] = field(default_factory=dict)

    def values(self, name: str) -> list[float]:
        return [v for _, v in self.samples.get(name, [])]

    @property
    def end(self) -> float:
        """When the run ended; for one still running (or cut short), its latest sample or verdict."""
        if self.ended:
            return self.ended
        times = [t for pts in self.samples.values() for t, _ in pts[-1:]] + [t for t, *_ in self.verdicts[-1:]]
        return max([self.started, *times])

    def run_verdict(self) -> RunVerdict:
        """The verdict the recorder kept; for an older record, the same rule applied to its timeline."""
        if self.verdict is not None:
            return self.verdict
        return from_timeline(self.verdicts, self.end).result()

    def timeline(self) -> list[Segment]:
        return from_timeline(self.verdicts, self.end).segments


class RunStore:
    def __init__(self, directory: str | Path | None = None, clock: Clock = SYSTEM) -> None:
        self.clock = clock
        self.directory = Path(directory) if directory else default_runs_dir()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = self.directory / "runs.db"
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def start_run(self, command: list[str]) -> str:
        now = self.clock.wall()
        base = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f"-{os.getpid() % 10000:04d}"
        with self._lock, self._db:
            # the same process starting two runs within a second (or a PID reused within one): -2, -3, ... after
            # the second's id, so that no run is refused or overwritten
            taken = {row[0] for row in self._db.execute("SELECT id FROM runs WHERE id = ? OR id LIKE ?",
                                                        (base, base + "-%"))}
            run_id = base
            n = 1
            while run_id in taken:
                n += 1
                run_id = f"{base}-{n}"
            self._db.execute("INSERT INTO runs (id, command, started) VALUES (?, ?, ?)",
                             (run_id, json.dumps(command), now))
        return run_id

    def add_samples(self, run_id: str, t: float, values: dict[str, float]) -> None:
        with self._lock, self._db:
            self._db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?)",
                                 [(run_id, t, k, float(v)) for k, v in values.items()])

    def add_verdict(self, run_id: str, t: float, cls: str, reason: str, evidence: dict[str, float]) -> None:
        with self._lock, self._db:
            self._db.execute("INSERT INTO verdicts VALUES (?, ?, ?, ?, ?)",
                             (run_id, t, cls, reason, json.dumps(evidence)))

    def add_event(self, run_id: str, t: float, kind: str, text: str) -> None:
        with self._lock, self._db:
            self._db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (run_id, t, kind, text))

    def set_run_verdict(self, run_id: str, verdict: RunVerdict) -> None:
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO run_verdicts VALUES (?, ?)",
                             (run_id, json.dumps(verdict.to_json())))

    def alert_fired(self, run_id: str, fingerprint: str, labels: dict[str, str], summary: str, fired: float,
                    pending: float | None = None) -> None:
        with self._lock, self._db:
            self._db.execute("INSERT INTO alerts VALUES (?, ?, ?, ?, ?, ?, NULL)",
                             (run_id, fingerprint, labels.get("alertname", ""), json.dumps(labels), summary, fired))
            self._pending(run_id, fingerprint, fired, pending)

    def alert_resolved(self, run_id: str, fingerprint: str, labels: dict[str, str], summary: str, fired: float,
                       resolved: float, pending: float | None = None) -> None:
        """Close the alert's open row; one that fired before the run (restored from the agent's state) gets a row
        of its own."""
        with self._lock, self._db:
            cur = self._db.execute("UPDATE alerts SET resolved = ? WHERE run_id = ? AND fingerprint = ? AND "
                                   "resolved IS NULL", (resolved, run_id, fingerprint))
            if cur.rowcount == 0:
                self._db.execute("INSERT INTO alerts VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (run_id, fingerprint, labels.get("alertname", ""), json.dumps(labels), summary,
                                  fired, resolved))
                self._pending(run_id, fingerprint, fired, pending)

    def _pending(self, run_id: str, fingerprint: str, fired: float, pending: float | None) -> None:
        # A table of its own (tables are only ever added): an older agent keeps writing the alerts table as it was.
        if pending is not None and pending < fired:
            self._db.execute("INSERT INTO alert_pending VALUES (?, ?, ?, ?)", (run_id, fingerprint, fired, pending))

    def set_distribution(self, run_id: str, name: str, whole: HistogramValue, steady: HistogramValue) -> None:
        with self._lock, self._db:
            self._db.executemany("INSERT OR REPLACE INTO distributions VALUES (?, ?, ?, ?)",
                                 [(run_id, name, RUN, to_json(whole)), (run_id, name, STEADY, to_json(steady))])

    def finish_run(self, run_id: str, exit_code: int, summary: dict[str, Any]) -> None:
        with self._lock, self._db:
            self._db.execute("UPDATE runs SET ended = ?, exit_code = ?, summary = ? WHERE id = ?",
                             (self.clock.wall(), exit_code, json.dumps(summary), run_id))

    def list_runs(self) -> list[tuple[str, float, float | None, int | None, list[str]]]:
        rows = self._db.execute("SELECT id, started, ended, exit_code, command FROM runs ORDER BY started").fetchall()
        return [(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows]

    def resolve(self, ref: str) -> str:
        """A run id from an id, a unique prefix of one, or 'last'."""
        ids = [r[0] for r in self.list_runs()]
        if ref == "last" and ids:
            return ids[-1]
        if ref in ids:  # an exact id, though a later run's id in the same second extends it
            return ref
        matches = [i for i in ids if i.startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise RunNotFound(f"no run {ref!r} in {self.path} (outrider runs lists them)")
        raise RunNotFound(f"{ref!r} matches {len(matches)} runs: {', '.join(matches[:5])}")

    def load(self, ref: str) -> RunRecord:
        run_id = self.resolve(ref)
        r = self._db.execute("SELECT id, command, started, ended, exit_code, summary FROM runs WHERE id = ?",
                             (run_id,)).fetchone()
        rec = RunRecord(r[0], json.loads(r[1]), r[2], r[3], r[4], json.loads(r[5]) if r[5] else {})
        for t, name, value in self._db.execute("SELECT t, name, value FROM samples WHERE run_id = ? ORDER BY t",
                                               (run_id,)):
            rec.samples.setdefault(name, []).append((t, value))
        rec.verdicts = [(t, c, reason, json.loads(ev)) for t, c, reason, ev in self._db.execute(
            "SELECT t, class, reason, evidence FROM verdicts WHERE run_id = ? ORDER BY t", (run_id,))]
        rec.events = list(self._db.execute("SELECT t, kind, text FROM events WHERE run_id = ? ORDER BY t", (run_id,)))
        rec.alerts = [AlertRecord(name, json.loads(labels), summary, fired, resolved, pending)
                      for name, labels, summary, fired, resolved, pending in self._db.execute(
                          "SELECT a.name, a.labels, a.summary, a.fired, a.resolved, p.pending FROM alerts a "
                          "LEFT JOIN alert_pending p ON p.run_id = a.run_id AND p.fingerprint = a.fingerprint "
                          "AND p.fired = a.fired WHERE a.run_id = ? ORDER BY a.fired", (run_id,))]
        for name, part, value in self._db.execute("SELECT name, part, value FROM distributions WHERE run_id = ?",
                                                  (run_id,)):
            rec.distributions.setdefault(name, {})[part] = from_json(value)
        row = self._db.execute("SELECT verdict FROM run_verdicts WHERE run_id = ?", (run_id,)).fetchone()
        if row is not None:
            rec.verdict = RunVerdict.from_json(json.loads(row[0]))
        return rec

    def close(self) -> None:
        self._db.close()
