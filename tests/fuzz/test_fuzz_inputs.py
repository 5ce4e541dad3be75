"""Bad input, fuzzed with hypothesis: spool shards, config files, and label values from users. Every bad input is a
clear error of the documented kind or a counted drop; nothing crashes, and the exposition stays valid."""

from __future__ import annotations

import json
import re
import struct
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from outrider.ground.config import FIELDS, ConfigError, load
from outrider.metrics.catalog import CATALOG
from outrider.metrics.exposition import render
from outrider.metrics.family import Family
from outrider.shared import prometheus_names
from outrider.shared import spool as shard  # the shard format lives in the spool contract
from outrider.shared.spool import ShardWriter
from tests.conftest import need_binary

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def valid_shard(tmp: Path) -> bytes:
    w = ShardWriter(str(tmp), 1, 1)
    directory = json.dumps({"meta": {"rank": "0"}, "series": [
        ["outrider_train_steps_total", "counter", {}, 0, []], ["h_seconds", "histogram", {"a": "b"}, 1, [0.1]]]})
    w.write(directory.encode(), [5.0, 1.0, 2.0, 0.3], flags=0, pid=1, stalls=0, start_ns=1, heartbeat_ns=2,
            last_step_ns=0, steps=5, stalled_since_ns=0)
    return Path(w.path).read_bytes()


COUNTED_REASONS = {"corrupt", "truncated", "newer_version"}  # what the hook collector counts a refused shard as


@FAST
@given(data=st.binary(max_size=5000))
def test_random_bytes_are_a_format_error(data: bytes) -> None:
    try:
        shard.decode(data)
    except shard.ShardFormatError as e:
        assert e.reason in COUNTED_REASONS and str(e), (e.reason, str(e))
        return
    raise AssertionError("random bytes decoded as a shard")


@FAST
@given(flips=st.lists(st.tuples(st.integers(0, shard.DATA_OFFSET + 64), st.integers(0, 255)), max_size=20),
       cut=st.one_of(st.none(), st.integers(0, shard.SHARD_BYTES)))
def test_mutated_and_truncated_shards_are_a_format_error_or_decode(tmp_path_factory: pytest.TempPathFactory,
                                                                   flips: list[tuple[int, int]],
                                                                   cut: int | None) -> None:
    data = bytearray(valid_shard(tmp_path_factory.mktemp("s")))
    for pos, byte in flips:
        data[pos] = byte
    if cut is not None:
        data = data[:cut]
    try:
        snap = shard.decode(bytes(data))
    except shard.ShardFormatError as e:
        assert e.reason in COUNTED_REASONS and str(e), (e.reason, str(e))
        if not flips:  # the shard itself is whole: only the cut can be wrong with it
            assert cut is not None and e.reason == "truncated", str(e)
        return
    for name, kind, labels, values, bounds in snap.series:  # what decodes is well-formed and renders validly
        assert prometheus_names.METRIC_NAME.fullmatch(name) and kind in shard.KINDS
        assert all(prometheus_names.LABEL_NAME.fullmatch(k) and k not in shard.RESERVED_LABELS for k in labels)
        assert all(isinstance(v, float) and v == v and abs(v) != float("inf") for v in values)
        assert len(values) == (len(bounds) + 2 if kind == "histogram" else 1)


def test_a_newer_format_version_is_refused_by_name(tmp_path: Path) -> None:
    data = bytearray(valid_shard(tmp_path))
    struct.pack_into("<I", data, 8, shard.VERSION + 1)
    with pytest.raises(shard.ShardFormatError, match="newer"):
        shard.decode(bytes(data))


yaml_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
                           lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8),
                                                                                             children, max_size=3),
                           max_leaves=8)


@FAST
@given(doc=st.dictionaries(st.sampled_from(["interval_s", "listen", "collectors", "filesystems", "pids",
                                            "otlp_protocol", "process_top_n", "disk_exclude", "log_level",
                                            "standalone", "k8s_labels", "nope", "interval"]), yaml_values,
                           max_size=4))
def test_any_config_file_loads_or_is_a_config_error(tmp_path_factory: pytest.TempPathFactory,
                                                    doc: dict[str, object]) -> None:
    path = tmp_path_factory.mktemp("c") / "outrider.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        loaded = load(file=str(path), env={})
    except ConfigError as e:  # the file and the key, and what it expected
        m = re.match(rf"file {re.escape(str(path))}: (unknown key|key) '([^']*)'", str(e))
        assert m and m.group(2) in doc, str(e)
        assert m.group(1) == ("key" if m.group(2) in FIELDS else "unknown key"), str(e)
        return
    assert all(loaded.sources[k] == f"file {path}" for k in doc), "every key in the file was taken from it"


@FAST
@given(text=st.text(max_size=300))
def test_any_config_text_loads_or_is_a_config_error(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    path = tmp_path_factory.mktemp("c") / "outrider.yaml"
    path.write_text(text)
    try:
        load(file=str(path), env={})
    except ConfigError as e:  # the file, and where in it (a key) or what about it (YAML, not a mapping)
        assert str(e).startswith(f"file {path}: ") and re.match(
            r"(unknown key|key) '|not valid YAML|expected a mapping|nested too deeply",
            str(e)[len(f"file {path}: "):]), str(e)


label_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@FAST
@given(values=st.lists(st.tuples(label_text, label_text), min_size=1, max_size=10, unique=True))
def test_label_values_round_trip_through_the_exposition(values: list[tuple[str, str]]) -> None:
    fam = Family(CATALOG["outrider_process_threads"])
    for i, (pid, name) in enumerate(values):
        fam.add(i, pid, name)
    parsed = {(s.labels.get("pid", ""), s.labels.get("name", "")): s.value  # an empty value is left out
              for f in text_string_to_metric_families(render([fam]).decode()) for s in f.samples}
    assert parsed == {v: float(i) for i, v in enumerate(values)}


@FAST
@given(values=st.lists(st.text(max_size=20), min_size=1, max_size=10, unique=True))
def test_any_text_even_lone_surrogates_renders_valid_utf8(values: list[str]) -> None:
    fam = Family(CATALOG["outrider_process_threads"])
    for i, v in enumerate(values):
        fam.add(i, str(i), v)
    text = render([fam]).decode("utf-8")  # raised UnicodeEncodeError for every scrape before
    assert len(next(iter(text_string_to_metric_families(text))).samples) == len(values)


def test_a_path_that_is_not_utf8_is_escaped_not_fatal() -> None:
    import os

    fam = Family(CATALOG["outrider_process_threads"])
    fam.add(1, "1", os.fsdecode(b"caf\xe9"))
    fam.add(2, "2", "\ud800")
    parsed = {s.labels["pid"]: s.labels["name"] for f in text_string_to_metric_families(render([fam]).decode())
              for s in f.samples}
    assert parsed == {"1": "caf\\xe9", "2": "\\ud800"}, "the byte it stood for, readable and lossless"
    r = subprocess.run([need_binary("promtool"), "check", "metrics"], input=render([fam]), capture_output=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hostile_label_values_pass_promtool() -> None:
    promtool = need_binary("promtool")
    fam = Family(CATALOG["outrider_process_threads"])
    hostile = ['quote " inside', "new\nline", "back\\slash", "ünïcødé ✓ 日本", "}{=,", "tab\there", "\\n literal"]
    for i, value in enumerate(hostile):
        fam.add(i, str(i), value)
    r = subprocess.run([promtool, "check", "metrics"], input=render([fam]).decode(), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
