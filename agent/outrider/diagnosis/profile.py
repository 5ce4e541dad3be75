"""The training loop's profile over a whole run: where its thread's stack samples were (hook/profiler.py) and its
hottest lines, from the final sweep's counters (cumulative since each process started), summed over ranks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from outrider.metrics import units
from outrider.metrics.family import Family

SAMPLES = "outrider_train_loop_samples_total"
FRAMES = "outrider_train_loop_frame_samples_total"
TOP = 20


@dataclass(frozen=True)
class LoopProfile:
    samples: float = 0.0
    where: dict[str, float] = field(default_factory=dict)  # samples by place
    frames: list[tuple[str, str, float]] = field(default_factory=list)  # (where, file:line function, samples)

    def shares(self) -> list[tuple[str, float]]:
        """(place, share of the samples), the largest first."""
        return sorted(((w, n / self.samples) for w, n in self.where.items() if n > 0 and self.samples),
                      key=lambda kv: -kv[1])

    def rows(self) -> list[tuple[str, str]]:
        """Summary lines: the shares, then the three hottest lines."""
        if not self.samples:
            return []
        out = [("loop", f"{units.count(self.samples)} stack samples of the loop thread: "
                        + ", ".join(f"{w} {units.percent(s)}" for w, s in self.shares()))]
        if self.frames:
            out.append(("", "hottest lines: " + "; ".join(
                f"{frame} ({where}, {units.percent(n / self.samples)})" for where, frame, n in self.frames[:3])))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "where": dict(self.where), "frames": [list(f) for f in self.frames]}

    @classmethod
    def from_json(cls, data: Any) -> LoopProfile | None:
        if not isinstance(data, dict):
            return None
        try:
            frames = [(str(w), str(f), float(n)) for w, f, n in data.get("frames", [])]
            return cls(float(data.get("samples", 0.0)), {str(k): float(v) for k, v in data.get("where", {}).items()},
                       frames)
        except (TypeError, ValueError):
            return None


def loop_profile(families: list[Family]) -> LoopProfile | None:
    """The profile in these families; None when no process sampled its loop."""
    where: dict[str, float] = {}
    frames: dict[tuple[str, str], float] = {}
    for f in families:
        if f.defn.name not in (SAMPLES, FRAMES):
            continue
        names = f.defn.label_names
        for values, v in f.samples:
            if not isinstance(v, float | int):
                continue
            lab = dict(zip(names, values))
            if f.defn.name == SAMPLES:
                where[lab.get("where", "")] = where.get(lab.get("where", ""), 0.0) + float(v)
            else:
                key = (lab.get("where", ""), lab.get("frame", ""))
                frames[key] = frames.get(key, 0.0) + float(v)
    total = sum(where.values())
    if not total:
        return None
    top = sorted(((w, fr, n) for (w, fr), n in frames.items()), key=lambda x: -x[2])[:TOP]
    return LoopProfile(total, where, top)
