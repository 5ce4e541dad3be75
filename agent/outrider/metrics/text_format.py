"""The Prometheus text exposition format (0.0.4, and the OpenMetrics text that servers answer with instead),
read: what a workload's own /metrics endpoint serves.

`parse(text)` gives the families a page declares (`# TYPE`, `# HELP`) and its samples, each line on its own: a
malformed line is skipped and reported, never the whole page. OpenMetrics additions are read as far as they matter:
`# EOF` ends the page, `# UNIT` is ignored, an exemplar (` # {...} value` after a sample) is dropped. Timestamps are
ignored (the agent exports what it read at this sweep). Label values are unescaped (`\\\\`, `\\"`, `\\n`); a label
given twice on one sample is malformed.

`families(page)` groups the samples by family: a histogram's `_bucket`, `_sum` and `_count`, a counter's `_total` (or
its bare name, as older clients write it), a summary's quantiles, `_sum` and `_count`; samples of no declared family
are untyped. The patterns below are linear: no alternative overlaps another, so no input backtracks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Generic, TypeVar

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,?)')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
TYPES = ("counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset", "gaugehistogram")
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count", "_created"), "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
            "summary": ("", "_sum", "_count", "_created"), "counter": ("_total", "", "_created"), "info": ("_info",)}


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


S = TypeVar("S")


@dataclass
class ParsedFamily(Generic[S]):
    """A family as a page declares it: its samples are this format's (Sample), or the protobuf format's
    (metrics/protobuf_format.Series: a histogram whole)."""

    name: str
    type: str = "untyped"
    help: str = ""
    samples: list[S] = field(default_factory=list)


@dataclass
class Page:
    types: dict[str, str] = field(default_factory=dict)
    helps: dict[str, str] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "line N: why", the first few only
    bad_lines: int = 0


MAX_ERRORS = 10


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), text) if "\\" in text else text


def parse_sample(line: str) -> Sample:
    """One sample line; ValueError when it is malformed."""
    m = _NAME.match(line)
    if m is None:
        raise ValueError("no metric name")
    name, pos = m.group(0), m.end()
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        pos += 1
        while True:
            while pos < len(line) and line[pos] in " \t":
                pos += 1
            if pos < len(line) and line[pos] == "}":
                pos += 1
                break
            lm = _LABEL.match(line, pos)
            if lm is None:
                raise ValueError("a malformed label")
            if lm.group(1) in labels:
                raise ValueError(f"label {lm.group(1)!r} given twice")
            labels[lm.group(1)] = _unescape(lm.group(2))
            pos = lm.end()
            if not lm.group(3):  # no comma: the block must end here
                if pos < len(line) and line[pos] == "}":
                    pos += 1
                    break
                raise ValueError("labels not closed")
    rest = line[pos:]
    if "#" in rest:
        rest = rest[:rest.index("#")]  # an OpenMetrics exemplar
    fields = rest.split()
    if not 1 <= len(fields) <= 2 or (rest and rest[0] not in " \t"):
        raise ValueError("expected a value and an optional timestamp after the name")
    text = fields[0]
    if "_" in text:  # float() takes 1_000; the format does not
        raise ValueError(f"value {text!r}")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"value {text!r}") from None
    return Sample(name, labels, value)


def parse(text: str) -> Page:
    page = Page()

    def bad(number: int, why: str) -> None:
        page.bad_lines += 1
        if len(page.errors) < MAX_ERRORS:
            page.errors.append(f"line {number}: {why}")

    for number, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 2 and parts[1] == "EOF":
                break
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP"):
                if not _NAME.fullmatch(parts[2]):
                    bad(number, f"metric name {parts[2][:80]!r}")
                elif parts[1] == "TYPE":
                    kind = parts[3].strip().lower() if len(parts) > 3 else ""
                    if kind not in TYPES:
                        bad(number, f"type {kind[:40]!r}")
                    elif parts[2] in page.types:
                        bad(number, f"a second TYPE for {parts[2]}")
                    else:
                        page.types[parts[2]] = kind
                else:
                    page.helps.setdefault(parts[2], _unescape(parts[3]) if len(parts) > 3 else "")
            continue  # other comments
        try:
            page.samples.append(parse_sample(line))
        except ValueError as e:
            bad(number, str(e))
    return page


def families(page: Page) -> list[ParsedFamily[Sample]]:
    """The page's samples by family, in the order families first appear."""
    out: dict[str, ParsedFamily[Sample]] = {}
    for sample in page.samples:
        family = _family_of(sample.name, page.types)
        fam = out.get(family)
        if fam is None:
            fam = out[family] = ParsedFamily(family, page.types.get(family, "untyped"), page.helps.get(family, ""))
        fam.samples.append(sample)
    return list(out.values())


def _family_of(sample: str, types: dict[str, str]) -> str:
    kind = types.get(sample)
    if kind is not None and "" in SUFFIXES.get(kind, ("",)):
        return sample
    for suffix in ("_bucket", "_sum", "_count", "_total", "_created", "_gsum", "_gcount", "_info"):
        if sample.endswith(suffix):
            base = sample[: -len(suffix)]
            if suffix in SUFFIXES.get(types.get(base, ""), ()):
                return base
    return sample
