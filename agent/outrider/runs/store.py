"""The embedded run store: one SQLite file (runs.db) under runs_dir."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, command TEXT, started REAL, ended REAL, exit_code INTEGER,
                                 summary TEXT);
CREATE TABLE IF NOT EXISTS samples (run_id TEXT, t REAL, name TEXT, value REAL);
CREATE INDEX IF NOT EXISTS samples_run ON samples (run_id, name, t);
CREATE TABLE IF NOT EXISTS verdicts (run_id TEXT, t REAL, class TEXT, reason TEXT, evidence TEXT);
CREATE TABLE IF NOT EXISTS events (run_id TEXT, t REAL, kind TEXT, text TEXT);
"""


class RunNotFound(LookupError):
    pass


def default_runs_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "outrider"


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

    def values(self, name: str) -> list[float]:
        return [v for _, v in self.samples.get(name, [])]


class RunStore:
    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory else default_runs_dir()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = self.directory / "runs.db"
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def start_run(self, command: list[str]) -> str:
        run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid() % 10000:04d}"
        with self._lock, self._db:
            self._db.execute("INSERT INTO runs (id, command, started) VALUES (?, ?, ?)",
                             (run_id, json.dumps(command), time.time()))
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

    def finish_run(self, run_id: str, exit_code: int, summary: dict[str, Any]) -> None:
        with self._lock, self._db:
            self._db.execute("UPDATE runs SET ended = ?, exit_code = ?, summary = ? WHERE id = ?",
                             (time.time(), exit_code, json.dumps(summary), run_id))

    def list_runs(self) -> list[tuple[str, float, float | None, int | None, list[str]]]:
        rows = self._db.execute("SELECT id, started, ended, exit_code, command FROM runs ORDER BY started").fetchall()
        return [(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows]

    def resolve(self, ref: str) -> str:
        """A run id from an id, a unique prefix of one, or 'last'."""
        ids = [r[0] for r in self.list_runs()]
        if ref == "last" and ids:
            return ids[-1]
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
        return rec

    def close(self) -> None:
        self._db.close()
