"""The spool contract (outrider/shared/spool.py): the shard format round trip, every way a shard can be bad, and the
safety rules: private directories, no links followed, no file read that an untrusted user owns."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from outrider.collectors import hook as hook_collector
from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.ground.config import Config
from outrider.metrics.exposition import render
from outrider.shared import spool
from tests.helpers import reap, samples, value, wait_until

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="changing a file's owner needs root (CI runs as root)")
STRANGER = 54321  # a uid that is neither this user, root, nor trusted


def write_one(spool_dir: Path, pid: int = 4242, series: list[list[object]] | None = None,
              values: list[float] | None = None) -> spool.ShardWriter:
    w = spool.ShardWriter(str(spool_dir), pid, 1_000)
    directory = json.dumps({"meta": {"rank": "3"}, "series": series if series is not None else [
        ["outrider_train_steps_total", "counter", {}, 0, []],
        ["h_seconds", "histogram", {"model": "a"}, 1, [0.1, 1.0]],
    ]}).encode()
    w.write(directory, values if values is not None else [7.0, 1.0, 2.0, 3.0, 4.5], flags=0, pid=pid, stalls=0,
            start_ns=1_000, heartbeat_ns=2_000, last_step_ns=1_500, steps=7, stalled_since_ns=0)
    return w


def reader(spool_dir: Path, trusted: bool = True) -> spool.ShardReader:
    return spool.ShardReader(str(spool_dir), lambda uid, pid: trusted or uid == os.geteuid())


def test_round_trip_through_the_files(tmp_path: Path) -> None:
    w = write_one(tmp_path)
    assert os.path.getsize(w.path) == spool.SHARD_BYTES, "all blocks reserved up front"
    r = reader(tmp_path)
    assert r.paths() == [w.path]
    snap = r.read(w.path)
    assert snap is not None and snap.header.steps == 7 and snap.header.pid == 4242 and snap.header.seq % 2 == 0
    assert snap.meta == {"rank": "3"} and snap.uid == os.geteuid()
    assert snap.series[1] == ("h_seconds", "histogram", {"model": "a"}, [1.0, 2.0, 3.0, 4.5], (0.1, 1.0))
    assert spool.decode(Path(w.path).read_bytes()).series == snap.series


def test_shard_and_default_spool_are_private(tmp_path: Path) -> None:
    private = tmp_path / "spool"
    spool.prepare_dir(str(private), private=True)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    w = write_one(private)
    assert stat.S_IMODE(Path(w.path).stat().st_mode) == 0o600


@pytest.mark.parametrize("damage", ["truncated", "magic", "newer", "directory", "lengths", "meta_type",
                                    "series_type"])
def test_damaged_shards_raise_format_errors_with_their_reason(tmp_path: Path, damage: str) -> None:
    data = bytearray(Path(write_one(tmp_path).path).read_bytes())
    reason = "corrupt"
    if damage == "truncated":
        data, reason = data[:40], "truncated"
    elif damage == "magic":
        data[0:8] = b"NOTASHRD"
    elif damage == "newer":
        struct.pack_into("<I", data, 8, spool.VERSION + 1)
        reason = "newer_version"
    elif damage == "directory":
        data[spool.HEADER_BYTES:spool.HEADER_BYTES + 5] = b"\xff{{{["
    elif damage == "lengths":
        struct.pack_into("<I", data, 68, spool.MAX_VALUES + 1)
    else:
        doc = {"meta": [1, 2], "series": []} if damage == "meta_type" else {"meta": {}, "series": {"a": 1}}
        text = json.dumps(doc).encode()
        data[spool.HEADER_BYTES:spool.HEADER_BYTES + len(text)] = text
        struct.pack_into("<I", data, 64, len(text))
    with pytest.raises(spool.ShardFormatError) as e:
        spool.decode(bytes(data))
    assert e.value.reason == reason
    path = tmp_path / "outrider-1-1.shard"
    path.write_bytes(bytes(data))
    with pytest.raises(spool.ShardFormatError) as e:
        reader(tmp_path).read(str(path))
    assert e.value.reason == reason


@pytest.mark.parametrize(("entry", "values", "why"), [
    (["a metric", "counter", {}, 0, []], [1.0], "invalid metric name"),
    (["a-b", "counter", {}, 0, []], [1.0], "invalid metric name"),
    (["__name__", "counter", {}, 0, []], [1.0], "invalid metric name"),
    (["x_total", "counter", {"a-b": "v"}, 0, []], [1.0], "invalid or reserved label name"),
    (["x_total", "counter", {"__name__": "v"}, 0, []], [1.0], "invalid or reserved label name"),
    (["h", "histogram", {"le": "1"}, 0, [1.0]], [1.0, 0.0, 1.0], "invalid or reserved label name"),
    (["x_total", "counter", {"rank": "9"}, 0, []], [1.0], "invalid or reserved label name"),
    (["h", "histogram", {}, 0, [1.0]], [float("nan"), 0.0, 1.0], "NaN or infinite"),
    (["h", "histogram", {}, 0, [1.0]], [float("inf"), 0.0, 1.0], "NaN or infinite"),
    (["h", "histogram", {}, 0, [1.0]], [-1.0, 0.0, 1.0], "negative or fractional"),
    (["x_total", "counter", {}, 0, []], [-5.0], "a counter is negative"),
    (["x_total", "counter", {}, 99999, []], [1.0], "offset outside"),
    (["x_total", "counter", "labels", 0, []], [1.0], "labels are not an object"),
    (["x_total", "summary", {}, 0, []], [1.0], "unknown kind"),
    (["h", "histogram", {}, 0, [2.0, 1.0]], [0.0, 0.0, 0.0, 0.0], "not finite and increasing"),
    ("not a list", [1.0], "an entry is not"),
])
def test_a_bad_series_is_dropped_alone_and_the_rest_of_the_shard_is_read(tmp_path: Path, entry: object,
                                                                       values: list[float], why: str) -> None:
    good = ["good_total", "counter", {"k": "v"}, len(values), []]
    w = write_one(tmp_path, series=[entry, good], values=[*values, 3.0])  # type: ignore[list-item]
    snap = reader(tmp_path).read(w.path)
    assert snap is not None
    assert snap.series == [("good_total", "counter", {"k": "v"}, [3.0], ())]
    assert len(snap.rejected) == 1 and why in snap.rejected[0]


def test_a_label_value_that_is_not_utf8_drops_the_series(tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 1, 1)
    directory = b'{"meta":{},"series":[["x_total","counter",{"path":"caf\\udce9"},0,[]]]}'  # a lone surrogate
    w.write(directory, [1.0], flags=0, pid=1, stalls=0, start_ns=1, heartbeat_ns=1, last_step_ns=0, steps=0,
            stalled_since_ns=0)
    snap = reader(tmp_path).read(w.path)
    assert snap is not None and snap.series == [] and "not valid UTF-8" in snap.rejected[0]


def test_writer_refuses_more_than_the_format_holds(tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 1, 1)
    with pytest.raises(ValueError, match="shard full"):
        w.write(b"{}", [0.0] * (spool.MAX_VALUES + 1), flags=0, pid=1, stalls=0, start_ns=1, heartbeat_ns=1,
                last_step_ns=0, steps=0, stalled_since_ns=0)


def test_a_shard_truncated_under_the_reader_is_an_error_for_that_shard_only(tmp_path: Path) -> None:
    w = write_one(tmp_path)
    r = reader(tmp_path)
    assert r.read(w.path) is not None  # the reader now holds the file open
    os.truncate(w.path, 100)  # what once killed a mapping reader with SIGBUS
    with pytest.raises(spool.ShardTruncated):
        r.read(w.path)
    os.truncate(w.path, 0)
    with pytest.raises(spool.ShardTruncated):
        r.read(w.path)


def test_links_fifos_and_foreign_files_in_the_spool_are_never_followed_or_read(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    secret = Path(write_one(other).path)  # a valid shard, outside the spool
    sp = tmp_path / "spool"
    sp.mkdir()
    (sp / "outrider-1-1.shard").symlink_to(secret)
    os.mkfifo(sp / "outrider-2-2.shard")
    r = reader(sp)
    for path in r.paths():
        with pytest.raises(spool.ShardFormatError):
            r.read(path)  # returns at once: a FIFO is never opened for reading


@needs_root
def test_shards_and_stack_dumps_of_untrusted_owners_are_not_read(tmp_path: Path) -> None:
    w = write_one(tmp_path)
    os.chown(w.path, STRANGER, STRANGER)
    with pytest.raises(spool.ShardUntrusted):
        reader(tmp_path, trusted=False).read(w.path)
    w2 = write_one(tmp_path, pid=77)
    stacks = Path(spool.stacks_path(w2.path))
    stacks.write_text("planted")
    os.chown(stacks, STRANGER, STRANGER)
    assert reader(tmp_path).read_stacks(w2.path, os.geteuid()) is None, "a dump not of the shard's owner"


def test_a_stack_dump_planted_as_a_link_is_neither_followed_nor_overwritten(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("root-only contents")
    sp = tmp_path / "spool"
    sp.mkdir()
    w = write_one(sp)
    link = Path(spool.stacks_path(w.path))
    link.symlink_to(target)
    assert reader(sp).read_stacks(w.path, os.geteuid()) is None, "the agent does not follow it"
    w.write_stacks("# header\n", lambda fh: fh.write("stacks\n"))
    assert target.read_text() == "root-only contents", "the writer replaced the link, never wrote through it"
    assert not link.is_symlink() and "stacks" in link.read_text()


def test_a_planted_lock_link_is_not_followed(tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    sp.mkdir(mode=0o700)
    (sp / spool.LOCK_NAME).symlink_to(tmp_path / "created-by-the-agent")
    said: list[str] = []
    fd = spool.try_lock(str(sp), notice=said.append)
    assert fd is not None and said and "a symbolic link" in said[0], "replaced by a lock file of ours"
    os.close(fd)
    assert not (tmp_path / "created-by-the-agent").exists()
    assert stat.S_ISREG(os.lstat(sp / spool.LOCK_NAME).st_mode)


def test_the_private_spool_refuses_a_directory_someone_else_prepared(tmp_path: Path) -> None:
    open_dir = tmp_path / "world"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(spool.SpoolError, match="open to other users"):
        spool.prepare_dir(str(open_dir), private=True)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "private-target")
    (tmp_path / "private-target").mkdir(mode=0o700)
    with pytest.raises(spool.SpoolError, match="symbolic link"):
        spool.prepare_dir(str(link), private=True)
    with pytest.raises(spool.SpoolError, match="symbolic link"):
        spool.prepare_dir(str(link), private=False)


@needs_root
def test_a_configured_spool_may_be_a_shared_volume_but_not_a_strangers_directory(tmp_path: Path) -> None:
    empty_dir = tmp_path / "emptydir"  # what Kubernetes mounts: root's, mode 0777
    empty_dir.mkdir()
    empty_dir.chmod(0o777)
    assert spool.prepare_dir(str(empty_dir), private=False) == str(empty_dir)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, STRANGER, STRANGER)
    with pytest.raises(spool.SpoolError, match="not trusted"):
        spool.prepare_dir(str(theirs), private=False)
    assert spool.prepare_dir(str(theirs), private=False, trusted_uids=frozenset({STRANGER})) == str(theirs)
    with pytest.raises(spool.SpoolError, match="belongs to uid"):
        spool.prepare_dir(str(theirs), private=True)


# A process publishing one custom name in one shape, until `stop` exists.
SHAPED = """
import pathlib, sys, time
import outrider
kind, stop = sys.argv[1], pathlib.Path(sys.argv[2])
if kind == "counter":
    outrider.counter("workload_jobs", {"queue": "a"}).inc(5)  # exported as workload_jobs_total
else:
    outrider.gauge("workload_jobs_total", {"host": "h1"}).set(42)
while not stop.exists():
    time.sleep(0.05)
"""


def test_a_custom_name_with_two_shapes_shows_the_first_publishers_while_it_lives_then_the_other(
        tmp_path: Path) -> None:
    sp = tmp_path / "spool"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}, "OUTRIDER_SPOOL_DIR": str(sp),
           "OUTRIDER_FLUSH_INTERVAL_S": "0.1", "OUTRIDER_STANDALONE": "false"}
    stop_first, stop_second = tmp_path / "stop-first", tmp_path / "stop-second"

    def view(c: HookCollector) -> dict:  # type: ignore[type-arg]
        return samples(render(c.collect()).decode())

    def collector() -> HookCollector:
        return HookCollector(CollectorContext(Config(spool_dir=str(sp), flush_interval_s=0.1), hold_spool_lock=False))

    c = collector()
    first = subprocess.Popen([sys.executable, "-c", SHAPED, "counter", str(stop_first)], env=env)
    second = None
    try:
        wait_until(lambda: value(view(c), "workload_jobs_total", queue="a") == 5, what="the first shape")
        second = subprocess.Popen([sys.executable, "-c", SHAPED, "gauge", str(stop_second)], env=env)
        wait_until(lambda: c.collect() and len(c.processes) == 2, what="both publishers")
        for _ in range(5):  # several sweeps: the rule holds, and the conflict is counted once, not per sweep
            parsed = view(c)
        assert value(parsed, "workload_jobs_total", queue="a") == 5, "the first shape wins while its publisher lives"
        assert value(parsed, "workload_jobs_total", host="h1") is None
        assert value(parsed, "outrider_hook_shard_errors_total", reason="shape_conflict") == 1
        restarted = collector()  # an agent restarted meanwhile makes the same choice: the longest-running publisher
        try:
            parsed = view(restarted)
            assert value(parsed, "workload_jobs_total", queue="a") == 5
            assert value(parsed, "workload_jobs_total", host="h1") is None
        finally:
            restarted.close()
        stop_first.touch()
        assert first.wait(timeout=30) == 0
        wait_until(lambda: value(view(c), "workload_jobs_total", host="h1") == 42,
                   what="the second shape back once the first publisher is gone")
        assert value(view(c), "workload_jobs_total", queue="a") is None, "the gone shape's retired values go"
    finally:
        stop_first.touch()
        stop_second.touch()
        reap([p for p in (first, second) if p is not None], timeout_s=30)
        c.close()


def test_a_regrown_shard_is_followed_by_a_reader_that_held_the_old_generation(tmp_path: Path) -> None:
    w = write_one(tmp_path)
    r = reader(tmp_path)
    assert r.read(w.path) is not None  # the reader now holds the first file open
    series = [["c_total", "counter", {"i": str(i), "pad": "p" * 100}, i, []] for i in range(30_000)]
    directory = json.dumps({"meta": {"rank": "3"}, "series": series}).encode()
    assert not w.fits(len(directory), 30_000), "larger than the first file"
    bigger = w.grown(len(directory), 30_000)
    assert (bigger.generation, bigger.fits(len(directory), 30_000)) == (1, True)
    assert os.path.exists(w.path), "the old generation stays readable until the new one is complete"
    bigger.write(directory, [float(i) for i in range(30_000)], flags=0, pid=4242, stalls=0, start_ns=1_000,
                 heartbeat_ns=3_000, last_step_ns=1_500, steps=9, stalled_since_ns=0)
    w.close()
    snap = r.read(w.path)
    assert snap is not None and snap.header.generation == 1 and snap.header.steps == 9
    assert len(snap.series) == 30_000 and snap.series[-1][3] == [29_999.0]
    assert [p for p in os.listdir(tmp_path) if p.endswith(".new")] == [], "no stray file"
    bigger.close()
    r.close()


def test_a_shard_in_the_first_layout_says_version_1_and_a_regrown_one_version_2(tmp_path: Path) -> None:
    w = write_one(tmp_path)
    assert spool.decode(Path(w.path).read_bytes()).header.version == 1, "an older agent reads it as before"
    bigger = w.grown(100_000, 10)
    bigger.write(b'{"meta":{},"series":[]}', [], flags=0, pid=4242, stalls=0, start_ns=1_000, heartbeat_ns=1,
                 last_step_ns=0, steps=0, stalled_since_ns=0)
    assert spool.decode(Path(w.path).read_bytes()).header.version == 2
    w.close()
    bigger.close()


def test_a_version_1_shard_is_still_read(tmp_path: Path) -> None:
    data = bytearray(Path(write_one(tmp_path).path).read_bytes())
    struct.pack_into("<I", data, 8, 1)  # version 1: fixed layout, no layout fields
    data[80:104] = bytes(24)
    snap = spool.decode(bytes(data))
    assert snap.header.version == 1 and snap.header.data_offset == spool.DATA_OFFSET
    assert snap.series[1][3] == [1.0, 2.0, 3.0, 4.5]


def test_a_writer_knows_when_its_shard_left_the_spool(tmp_path: Path) -> None:
    w = write_one(tmp_path)
    assert w.intact()
    os.unlink(w.path)
    assert not w.intact(), "deleted"
    w2 = write_one(tmp_path)  # another file now at the same name (as after a remount)
    assert w2.intact() and not w.intact(), "replaced"
    w.close()
    w2.close()


def test_closed_shards_of_two_shapes_found_at_start_make_one_valid_family(tmp_path: Path) -> None:
    # An agent (re)started after both publishers finished: no live process to choose a shape, the exposition must
    # still be valid (one shape per name).
    for pid, kind, labels in ((101, "counter", {"queue": "a"}), (102, "counter", {"host": "h"})):
        w = spool.ShardWriter(str(tmp_path), pid, 5)
        directory = json.dumps({"meta": {}, "series": [["workload_jobs_total", kind, labels, 0, []]]}).encode()
        w.write(directory, [3.0], flags=spool.FLAG_CLOSED, pid=pid, stalls=0, start_ns=5, heartbeat_ns=6,
                last_step_ns=0, steps=0, stalled_since_ns=0)
        w.close()
    c = HookCollector(CollectorContext(Config(spool_dir=str(tmp_path)), hold_spool_lock=False))
    try:
        parsed = samples(render(c.collect()).decode())  # the parser refuses an exposition with mixed shapes
        shown = [labels for (name, labels) in parsed if name == "workload_jobs_total"]
        assert shown == [(("queue", "a"),)], shown
    finally:
        c.close()


def test_a_pending_shard_left_by_a_killed_process_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid is free now (or reused by a process started later: not the same process either)
    stray = tmp_path / f"outrider-{gone.pid}-{time.time_ns() - 10**9}.shard.new"
    stray.write_bytes(b"\0" * 4096)  # killed between creating a larger generation and renaming it
    growing = tmp_path / f"outrider-{os.getpid()}-{time.time_ns()}.shard.new"  # this live process, mid-growth
    growing.write_bytes(b"\0" * 4096)
    c = HookCollector(CollectorContext(Config(spool_dir=str(tmp_path)), hold_spool_lock=False))
    try:
        for _ in range(2 * hook_collector.STRAY_EVERY + 1):
            c.collect()
        assert not stray.exists(), "the dead process's leftover is removed"
        assert growing.exists(), "a live process's shard being written is left alone"
    finally:
        c.close()


def test_a_refused_file_is_closed_at_once_and_not_opened_again_until_it_changes(tmp_path: Path) -> None:
    junk = tmp_path / "outrider-1-1.shard"
    junk.write_bytes(b"garbage" * 1000)
    r = reader(tmp_path)
    with pytest.raises(spool.ShardFormatError) as first:
        r.read(str(junk))
    assert first.value.reason == "corrupt" and not isinstance(first.value, spool.ShardRejected)
    assert r.open_count == 0, "closed at once"
    for _ in range(3):
        with pytest.raises(spool.ShardRejected) as again:
            r.read(str(junk))  # the same file: refused without being opened, and said to be a repeat
        assert again.value.reason == "corrupt"
    assert r.rejected() == {"corrupt": 1}
    os.unlink(junk)
    good = write_one(tmp_path, pid=1)  # the name now holds a real shard (as after a writer fixed it)
    os.rename(good.path, junk)
    assert r.read(str(junk)) is not None and r.rejected() == {}
    os.unlink(junk)
    assert r.paths() == [] and r.open_count == 0


@pytest.mark.parametrize(("plant", "reason"), [
    (lambda p: p.symlink_to("/etc/passwd"), "not_regular"),
    (lambda p: os.mkfifo(p), "not_regular"),
    (lambda p: p.mkdir(), "not_regular"),
    (lambda p: (p.write_bytes(b"x" * 200), p.chmod(0o666)), "bad_mode"),
    (lambda p: (p.write_bytes(b""), os.truncate(p, spool.MAX_SHARD_BYTES + 1)), "too_large"),
    (lambda p: p.write_bytes(spool.MAGIC), "truncated"),
])
def test_what_lstat_rules_out_is_never_opened(tmp_path: Path, plant: object, reason: str) -> None:
    path = tmp_path / "outrider-1-1.shard"
    plant(path)  # type: ignore[operator]
    r = reader(tmp_path)
    opened: list[str] = []
    real_open = os.open

    def watching(p: str, *a: object, **kw: object) -> int:
        opened.append(p)
        return real_open(p, *a, **kw)  # type: ignore[arg-type]

    os.open = watching  # type: ignore[assignment]
    try:
        with pytest.raises(spool.ShardFormatError) as e:
            r.read(str(path))
    finally:
        os.open = real_open
    assert e.value.reason == reason and opened == []


def test_the_reader_keeps_at_most_max_open_descriptors_and_reads_every_shard(tmp_path: Path) -> None:
    writers = [write_one(tmp_path, pid=100 + i) for i in range(12)]
    r = spool.ShardReader(str(tmp_path), lambda uid, pid: True, max_open=4)
    opened: list[str] = []
    real_open = os.open

    def watching(p: str, *a: object, **kw: object) -> int:
        opened.append(p)
        return real_open(p, *a, **kw)  # type: ignore[arg-type]

    for sweep in range(3):
        opened.clear()
        os.open = watching  # type: ignore[assignment]
        try:
            snaps = [r.read(p) for p in r.paths()]
        finally:
            os.open = real_open
        assert [s.header.pid for s in snaps if s] == [100 + i for i in range(12)]
        assert r.open_count == 4
        # The 4 kept stay kept: a sweep in the same order never evicts the next shard it needs (an LRU would,
        # and open all 12 every sweep).
        assert len(opened) == (12 if sweep == 0 else 8), sweep
    r.close()
    assert r.open_count == 0
    for w in writers:
        w.close()
    assert spool.open_budget() <= spool.MAX_OPEN_SHARDS


def test_out_of_descriptors_the_reader_gives_half_back_then_opens_nothing_until_the_next_sweep(
        tmp_path: Path) -> None:
    import resource

    writers = [write_one(tmp_path, pid=100 + i) for i in range(12)]
    for w in writers:
        w.close()
    r = spool.ShardReader(str(tmp_path), lambda uid, pid: True, max_open=100)
    paths = r.paths()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 64, hard))
    filler: list[int] = []

    def fill() -> None:
        with contextlib.suppress(OSError):
            while True:
                filler.append(os.open(os.devnull, os.O_RDONLY))

    try:
        for path in paths[:10]:
            assert r.read(path) is not None
        fill()  # someone else took every descriptor left
        assert r.read(paths[10]) is not None, "half of the reader's own given back made room"
        assert r.open_count == 10 - 5 + 1
        r.close()
        fill()  # now the reader has nothing to give back
        with pytest.raises(OSError) as e:
            r.read(paths[10])
        assert e.value.errno == errno.EMFILE
        for fd in filler[-10:]:
            os.close(fd)
        del filler[-10:]
        with pytest.raises(OSError):
            r.read(paths[11])  # descriptors are back, but nothing is opened again until the next sweep
        r.paths()
        assert r.read(paths[11]) is not None
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        r.close()
