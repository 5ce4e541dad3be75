"""The hook's own settings, read from its handful of OUTRIDER_* variables with the standard library only.

The hook never loads the agent's configuration: a pod that shares one environment between the workload and the
sidecar may set any agent key (OUTRIDER_COLLECTORS, ...), which the agent validates and the hook ignores. Each
value is parsed on its own: a bad one keeps its default and is reported, never dropping the others. The agent's
configuration (outrider.config) takes these keys' defaults and bounds from KEYS, so both sides agree.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

ENV_PREFIX = "OUTRIDER_"
ROLES = ("", "training", "inference")
MAX_TEXT = 128


@dataclass(frozen=True)
class Bounds:
    low: float
    high: float


# Numeric settings the hook reads and their inclusive bounds: beyond them a value is refused with a clear message
# rather than, say, an interval of 1e308 s that kills the publisher thread or one of 1e-300 s that spins a core.
BOUNDS: dict[str, Bounds] = {
    "flush_interval_s": Bounds(0.05, 3600.0),
    "hook_max_series_per_metric": Bounds(1, 100_000),
    "stall_factor": Bounds(1.0, 10_000.0),
    "stall_floor_s": Bounds(1.0, 30 * 86400.0),
    "first_step_timeout_s": Bounds(1.0, 30 * 86400.0),
    "phase_timeout_s": Bounds(1.0, 30 * 86400.0),
    "profile_hz": Bounds(0.0, 1000.0),
}


@dataclass(frozen=True)
class HookSettings:
    spool_dir: str = ""  # empty: the private per-user default (outrider.spool.default_dir)
    flush_interval_s: float = 1.0
    hook_max_series_per_metric: int = 100
    stall_factor: float = 10.0
    stall_floor_s: float = 300.0
    first_step_timeout_s: float = 1800.0
    phase_timeout_s: float = 3600.0
    standalone: bool = True
    listen: str = ""  # the in-process agent's /metrics address; empty: the agent's default
    training_job: str = ""  # groups the ranks of one training job; else TORCHELASTIC_RUN_ID
    role: str = ""  # training, inference, or empty: judged from what the process does
    spool_trusted_uids: tuple[int, ...] = ()  # owners of a configured spool besides this user and root
    profile_hz: float = 50.0  # samples a second of the loop thread's stack (hook/profiler.py); 0: off


KEYS: dict[str, Any] = {f.name: f.default for f in fields(HookSettings)}


def parse_bool(raw: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("true or false")


def parse_number(b: Bounds, raw: Any, integer: bool = False) -> float:
    """A number within the bounds; ValueError saying what was expected."""
    what = f"{'a whole number' if integer else 'a number'} from {b.low:g} to {b.high:g}"
    if isinstance(raw, bool):
        raise ValueError(what)
    try:
        value = float(raw) if not integer else float(int(str(raw).strip()) if not isinstance(raw, int) else raw)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(what) from None
    if not math.isfinite(value) or not b.low <= value <= b.high:
        raise ValueError(what)
    return value


def parse_uids(raw: Any) -> tuple[int, ...]:
    items = raw.split(",") if isinstance(raw, str) else list(raw) if isinstance(raw, (list, tuple)) else [raw]
    uids = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        if isinstance(item, bool) or not text.isdigit() or int(text) > 2**32 - 2:
            raise ValueError("a comma-separated list of numeric uids")
        uids.append(int(text))
    return tuple(uids)


def read(env: Mapping[str, str] | None = None) -> tuple[HookSettings, list[str]]:
    """The settings from the environment, and one message per value that was refused (its default kept)."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, default in KEYS.items():
        name = ENV_PREFIX + key.upper()
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            if isinstance(default, bool):
                values[key] = parse_bool(raw)
            elif isinstance(default, int):
                values[key] = int(parse_number(BOUNDS[key], raw, integer=True))
            elif isinstance(default, float):
                values[key] = parse_number(BOUNDS[key], raw)
            elif key == "spool_trusted_uids":
                values[key] = parse_uids(raw)
            elif key == "role":
                if raw.strip().lower() not in ROLES:
                    raise ValueError("training or inference")
                values[key] = raw.strip().lower()
            else:
                if len(raw) > 4096 or "\x00" in raw:
                    raise ValueError("a path or name without NUL, at most 4096 characters")
                values[key] = raw
        except ValueError as e:
            problems.append(f"{name}={raw[:80]!r}: expected {e}; using the default {default!r}")
    if "training_job" not in values:
        run_id = env.get("TORCHELASTIC_RUN_ID", "")
        if run_id and run_id != "none":  # torchrun's placeholder when no rendezvous id was given
            values["training_job"] = run_id
    if len(values.get("training_job", "")) > MAX_TEXT:
        values["training_job"] = values["training_job"][:MAX_TEXT]
    return HookSettings(**values), problems
