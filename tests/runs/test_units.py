"""Human numbers: what the summary, the report, the comparison and `outrider top` print (outrider.metrics.units)."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outrider.metrics import units


@pytest.mark.parametrize(("value", "text"), [
    (25.42625041400001, "25.4 s"), (0.0123, "12.3 ms"), (0.0000123, "12.3 µs"), (5e-8, "50 ns"), (0.0, "0 s"),
    (2.0, "2 s"), (252.0, "4 min 12 s"), (7500.0, "2 h 5 min"), (3600.0, "1 h"), (0.9999, "1 s"),
])
def test_durations_read_in_the_unit_that_fits(value: float, text: str) -> None:
    assert units.seconds(value) == text


@pytest.mark.parametrize(("value", "text"), [
    (752 * 2**20, "752 MiB"), (0, "0 B"), (512, "512 B"), (1.5 * 2**30, "1.5 GiB"), (3300, "3.22 KiB"),
    (1023.9 * 2**20, "1 GiB"),
])
def test_sizes_are_in_powers_of_1024(value: float, text: str) -> None:
    assert units.bytes_iec(value) == text


@pytest.mark.parametrize(("value", "text"), [(0.42, "42%"), (0.0658, "6.6%"), (0.0042, "0.42%"), (0, "0%"),
                                             (1, "100%"), (0.0001, "0.01%"), (0.000063, "<0.01%")])
def test_ratios_are_percentages(value: float, text: str) -> None:
    assert units.percent(value) == text


def test_keys_are_formatted_by_their_suffix_so_a_new_one_is_never_raw() -> None:
    assert units.by_key("samples_per_s", 3215.4) == "3,215 samples/s"
    assert units.by_key("peak_rss_bytes", 752 * 2**20) == "752 MiB"
    assert units.by_key("collective_wait_s", 0.0042) == "4.2 ms"
    assert units.by_key("run_delay_fraction", 0.25) == "25%"
    assert units.by_key("main_thread_cores", 0.97) == "0.97 cores"
    assert units.label_of("run_delay_fraction") == "run delay"
    assert units.run_time(65) == "1:05" and units.run_time(3725) == "1:02:05"


@given(st.floats(min_value=1e-9, max_value=1e7, allow_nan=False), st.integers(min_value=0, max_value=2**60))
def test_no_rendering_has_more_than_three_significant_digits_or_drifts(v: float, n: int) -> None:
    for text, back, value in ((units.seconds(v), _parse_seconds, v), (units.bytes_iec(n), _parse_bytes, n)):
        digits = re.sub(r"[^0-9]", "", text.split(" ")[0]).lstrip("0")
        assert len(digits) <= 3 or "," in text or "min" in text or " h" in text, text
        if "min" not in text and " h" not in text:
            assert math.isclose(back(text), value, rel_tol=0.006), (value, text)


def _parse_seconds(text: str) -> float:
    number, unit = text.split(" ")
    return float(number.replace(",", "")) * {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def _parse_bytes(text: str) -> float:
    number, unit = text.split(" ")
    return float(number.replace(",", "")) * 1024 ** units.IEC.index(unit)
