"""Metric families as collectors produce them: a catalog definition and its samples of one sweep."""

from __future__ import annotations

from outrider.metrics.catalog import CATALOG, MetricDef


class Family:
    """The samples of one metric from one sweep. Built fresh every sweep (departed series simply vanish)."""

    __slots__ = ("defn", "samples")

    def __init__(self, name: str) -> None:
        self.defn: MetricDef = CATALOG[name]
        self.samples: list[tuple[tuple[str, ...], float]] = []

    def add(self, value: float, *label_values: str) -> Family:
        if len(label_values) != len(self.defn.labels):
            raise ValueError(f"{self.defn.name}: expected labels {self.defn.label_names}, got {label_values!r}")
        self.samples.append((label_values, float(value)))
        return self

    def __repr__(self) -> str:
        return f"Family({self.defn.name!r}, {len(self.samples)} samples)"
