"""Human numbers: the one place that turns a value in base units (seconds, bytes, ratios, per-second rates) into
what a person reads, `25.4 s`, `752 MiB`, `42%`, `3,200 samples/s`, for the run summary, the report, the
comparison and `outrider top`.

Three significant digits and no trailing zeros: enough to tell two runs apart, few enough to read at a glance.
A key named by the house convention (`step_time_s`, `rss_bytes`, `data_wait_fraction`, `samples_per_s`,
`process_cpu_cores`) is formatted by its suffix (`by_key`), so a number added later is never shown raw.
"""

from __future__ import annotations

import math

IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
RATIO_SUFFIXES = ("_fraction", "_ratio", "_util", "_activity")


def number(v: float) -> str:
    """Three significant digits (two below 1), thousands separated, no trailing zeros: 25.4, 752, 3,215, 0.56, 2."""
    if not math.isfinite(v):
        return "-" if math.isnan(v) else ("∞" if v > 0 else "-∞")
    a = abs(v)
    if a >= 100 or a == 0:
        text = f"{v:,.0f}"
    elif a >= 10:
        text = f"{v:.1f}"
    elif a >= 1:
        text = f"{v:.2f}"
    else:
        text = f"{v:.2g}"
        if "e" in text:  # below 0.0001: a person reads the exponent better than zeros
            return text
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def seconds(v: float) -> str:
    """A duration, in the unit that reads best: 850 ns, 12.3 µs, 42.1 ms, 25.4 s, 4 min 12 s, 2 h 5 min."""
    if not math.isfinite(v):
        return number(v)
    a = abs(v)
    if a == 0:
        return "0 s"
    if a < 1e-6:
        return f"{number(v * 1e9)} ns"
    if a < 1e-3:
        return f"{number(v * 1e6)} µs"
    if a < 0.9995:
        return f"{number(v * 1e3)} ms"
    if a < 59.95:
        return f"{number(v)} s"
    sign = "-" if v < 0 else ""
    whole = round(a)
    if whole < 3600:
        m, s = divmod(whole, 60)
        return f"{sign}{m} min {s} s" if s else f"{sign}{m} min"
    h, rest = divmod(whole, 3600)
    m = round(rest / 60)
    if m == 60:
        h, m = h + 1, 0
    return f"{sign}{h} h {m} min" if m else f"{sign}{h} h"


def bytes_iec(v: float) -> str:
    """A size in powers of 1024: 0 B, 512 B, 3.2 KiB, 752 MiB, 1.5 GiB."""
    if not math.isfinite(v):
        return number(v)
    scaled, unit = iec_scale(abs(v))
    return f"{number(math.copysign(abs(v) / scaled, v))} {unit}"


def iec_scale(v: float) -> tuple[float, str]:
    """(divisor, unit) for showing v bytes: the largest power of 1024 not above it."""
    i = 0
    while i + 1 < len(IEC) and v >= 1024 ** (i + 1) * 0.9995:
        i += 1
    return float(1024**i), IEC[i]


def percent(ratio: float) -> str:
    """A ratio (0..1) as a percentage: 42%, 4.2%, 0.42%, 0%; under a hundredth of a percent, <0.01% (a share that
    small is there, and its digits say nothing more)."""
    if not math.isfinite(ratio):
        return number(ratio)
    p = 100 * ratio
    a = abs(p)
    if a == 0 or a >= 9.95:
        return f"{p:.0f}%"
    if a >= 0.995:
        return f"{p:.1f}".rstrip("0").rstrip(".") + "%"
    if a < 0.00995:
        return "<0.01%" if p > 0 else "-<0.01%"
    return f"{number(p)}%"


def rate(v: float, what: str) -> str:
    """A per-second rate: 3,200 samples/s, 12.5 steps/s, 0.35 req/s."""
    return f"{number(v)} {what}/s"


SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def flop_rate(v: float) -> str:
    """FLOPs a second, with an SI prefix: 45.2 GFLOP/s, 989 TFLOP/s."""
    for scale, prefix in SI:
        if abs(v) >= scale:
            return f"{number(v / scale)} {prefix}FLOP/s"
    return f"{number(v)} FLOP/s"


def cores(v: float) -> str:
    return f"{number(v)} core" if v == 1 else f"{number(v)} cores"


def count(v: float, what: str = "") -> str:
    text = f"{v:,.0f}" if float(v).is_integer() else number(v)
    return f"{text} {what}" if what else text


def by_key(key: str, value: float) -> str:
    """A value formatted by the suffix of its name (the house naming convention); a plain number otherwise."""
    if key.endswith("_bytes"):
        return bytes_iec(value)
    if key.endswith("_per_s"):
        return rate(value, key[: -len("_per_s")].rsplit("_", 1)[-1])
    if key.endswith("_s") or key.endswith("_seconds"):
        return seconds(value)
    if key.endswith(RATIO_SUFFIXES):
        return percent(value)
    if key.endswith("_cores"):
        return cores(value)
    return number(value)


def label_of(key: str) -> str:
    """A readable label for a key without a better one: `run_delay_fraction` -> `run delay`."""
    for suffix in ("_per_s", "_seconds", "_bytes", "_s", "_cores", *RATIO_SUFFIXES):
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
            break
    return key.replace("_", " ")


def run_time(v: float) -> str:
    """An offset from a run's start, as a clock reads: 0:05, 12:30, 1:02:03."""
    whole = max(0, round(v)) if math.isfinite(v) else 0
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
