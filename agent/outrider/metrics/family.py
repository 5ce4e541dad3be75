"""Metric families as collectors produce them: a catalog definition and its samples of one sweep."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from outrider.metrics.catalog import CATALOG, MetricDef
from outrider.shared.sketch import Sketch


@dataclass(frozen=True)
class HistogramValue:
    """A histogram's state: per-bucket counts (not cumulative; the last bucket is +Inf) and the sum; for durations
    the hook records, also the log-bucketed sketch of the same values (outrider/shared/sketch.py: quantiles within
    1.08%, exported as OTLP exponential and Prometheus native histograms), None where the source has only the classic
    buckets (another library's histogram, an older hook)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    sketch: Sketch | None = None

    @property
    def count(self) -> int:
        return sum(self.counts)

    @property
    def sketched(self) -> bool:
        """Has the sketch of the same values (of the classic buckets' count): exportable at its resolution."""
        return self.sketch is not None and self.sketch.count == self.count

    def __add__(self, other: HistogramValue) -> HistogramValue:
        """The two merged (same bounds); the sketch only where both have one, or it would miss values."""
        sketch = self.sketch + other.sketch if self.sketch is not None and other.sketch is not None else None
        return HistogramValue(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts)),
                              self.sum + other.sum, sketch)

    def since(self, earlier: HistogramValue | None) -> HistogramValue:
        """What was recorded after `earlier` (an older copy of this cumulative histogram): per bucket, floored at 0
        (a process that restarted counts from zero); the whole of it when `earlier` is None or of other bounds."""
        if earlier is None or earlier.bounds != self.bounds:
            return self
        sketch = None
        if self.sketch is not None:
            sketch = self.sketch.since(earlier.sketch) if earlier.sketch is not None else None
        return HistogramValue(self.bounds, tuple(max(0, a - b) for a, b in zip(self.counts, earlier.counts)),
                              self.sum - earlier.sum, sketch)

    def cumulative(self) -> list[int]:
        out, total = [], 0
        for c in self.counts:
            total += c
            out.append(total)
        return out


SampleValue = float | HistogramValue


def merged_histogram(families: list[Family], name: str, **match: str) -> HistogramValue | None:
    """The sum of a histogram metric's samples whose labels include `match` (over ranks, routes, processes)."""
    merged: HistogramValue | None = None
    for f in families:
        if f.defn.name != name:
            continue
        names = f.defn.label_names
        for labels, v in f.samples:
            if not isinstance(v, HistogramValue):
                continue
            if any(labels[names.index(k)] != want for k, want in match.items()):
                continue
            merged = v if merged is None else merged + v
    return merged


class Family:
    """The samples of one metric from one sweep. Built fresh every sweep (departed series simply vanish)."""

    __slots__ = ("attributes", "defn", "samples")

    def __init__(self, name: str | MetricDef, attributes: Mapping[str, str] | None = None) -> None:
        self.defn: MetricDef = CATALOG[name] if isinstance(name, str) else name
        self.samples: list[tuple[tuple[str, ...], SampleValue]] = []
        # OTLP-only attributes every sample of this sweep shares, facts rather than identity (hw.driver_version):
        # neither the exposition nor the rule evaluation sees them, so a driver upgrade starts no new series there.
        # Most families have none: they share one empty mapping rather than each allocating a dict.
        self.attributes: Mapping[str, str] = attributes if attributes is not None else _NONE

    def add(self, value: SampleValue, *label_values: str) -> Family:
        defn = self.defn
        if len(label_values) != defn.arity:
            raise ValueError(f"{defn.name}: expected labels {defn.label_names}, got {label_values!r}")
        if defn.type == "histogram":
            if not isinstance(value, HistogramValue):
                raise TypeError(f"{defn.name} is a histogram: add a HistogramValue")
            self.samples.append((label_values, value))
        else:
            self.samples.append((label_values, float(value)))  # type: ignore[arg-type]
        return self

    def __repr__(self) -> str:
        return f"Family({self.defn.name!r}, {len(self.samples)} samples)"


_NONE: Mapping[str, str] = MappingProxyType({})
