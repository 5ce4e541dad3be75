"""The spool contract value by value (outrider/shared/spool.py): each refusal's exact message and reason (they reach the
agent's log and its counted drops), each branch of the directory checks, the locks and the readers' marks, the
header's layout checks at their edges, the writer's generations and the reader's bookkeeping (descriptors, the
rejected files, the parsed directories it keeps), read back from real files in the test's own directory."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from outrider.shared import spool

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="changing a file's owner needs root (CI runs as root)")
STRANGER = 54321
ME = os.geteuid()

HEADER = {"flags": 0, "pid": 4242, "stalls": 0, "start_ns": 1_000, "heartbeat_ns": 2_000, "last_step_ns": 1_500,
          "steps": 7, "stalled_since_ns": 0}


def directory(series: list[list[object]] | None = None, meta: dict[str, object] | None = None) -> bytes:
    return json.dumps({"meta": meta if meta is not None else {"rank": "3"},
                       "series": series if series is not None else [["x_total", "counter", {}, 0, []]]}).encode()


def published(spool_dir: Path, pid: int = 4242, values: list[float] | None = None, **kw: object) -> spool.ShardWriter:
    w = spool.ShardWriter(str(spool_dir), pid, 1_000)
    w.write(directory(**kw), values if values is not None else [7.0], **{**HEADER, "pid": pid})  # type: ignore[arg-type]
    return w


def reader(spool_dir: Path, max_open: int | None = None, trusted: object = None) -> spool.ShardReader:
    return spool.ShardReader(str(spool_dir), trusted or (lambda uid, pid: True), max_open)  # type: ignore[arg-type]


def spool_time(monkeypatch: pytest.MonkeyPatch, **fns: Callable[..., Any]) -> None:
    """spool's view of the time module with these functions replaced (never the time module itself, which every
    thread of the test process shares)."""
    real = {n: getattr(time, n) for n in dir(time) if not n.startswith("_")}
    monkeypatch.setattr(spool, "time", SimpleNamespace(**{**real, **fns}))


def refusal(fn: object, *args: object) -> spool.ShardFormatError:
    with pytest.raises(spool.ShardFormatError) as e:
        fn(*args)  # type: ignore[operator]
    return e.value


# --- the directory ------------------------------------------------------------------------------------------------

def test_the_default_spool_is_in_a_private_runtime_directory_else_in_tmp(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fallback = f"/tmp/outrider-spool-{ME}"
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    runtime.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert spool.default_dir() == str(runtime / "outrider-spool")
    for mode in (0o750, 0o705, 0o701):  # any access for the group or others: not private
        runtime.chmod(mode)
        assert spool.default_dir() == fallback, oct(mode)
    runtime.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "run")  # relative: not a runtime directory
    assert spool.default_dir() == fallback
    monkeypatch.setenv("XDG_RUNTIME_DIR", "")
    assert spool.default_dir() == fallback
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert spool.default_dir() == fallback
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert spool.default_dir() == fallback
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-file").chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "a-file"))
    assert spool.default_dir() == fallback
    (tmp_path / "link").symlink_to(runtime)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "link"))
    assert spool.default_dir() == fallback, "a symbolic link is not the runtime directory"


@needs_root
def test_a_runtime_directory_of_another_user_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    os.chown(runtime, STRANGER, STRANGER)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert spool.default_dir() == f"/tmp/outrider-spool-{ME}"


def test_prepare_dir_makes_a_private_directory_and_a_configured_one_with_its_parents(tmp_path: Path) -> None:
    made = tmp_path / "spool"
    assert spool.prepare_dir(str(made), private=True) == str(made)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert spool.prepare_dir(str(made), private=True) == str(made), "an existing one is checked, not refused"
    with pytest.raises(FileNotFoundError):
        spool.prepare_dir(str(tmp_path / "no" / "parent"), private=True)
    deep = tmp_path / "a" / "b" / "spool"
    assert spool.prepare_dir(str(deep), private=False) == str(deep)
    assert stat.S_IMODE(deep.stat().st_mode) == 0o700
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(spool.SpoolError):
        spool.prepare_dir(str(tmp_path / "open"), private=True)


def test_check_dir_says_why_it_refuses(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    link = str(tmp_path / "link")
    for private in (True, False):
        with pytest.raises(spool.SpoolError) as e:
            spool.check_dir(link, private=private)
        assert e.value.errno == errno.ELOOP
        assert e.value.strerror == f"spool {link} is a symbolic link: refused (set spool_dir to a real directory)"
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError) as nd:
        spool.check_dir(str(tmp_path / "file"), private=False)
    assert nd.value.errno == errno.ENOTDIR and nd.value.strerror == f"spool {tmp_path / 'file'} is not a directory"
    with pytest.raises(FileNotFoundError):
        spool.check_dir(str(tmp_path / "missing"), private=True)
    for mode in (0o770, 0o707, 0o701, 0o710):
        target.chmod(mode)
        with pytest.raises(spool.SpoolError) as e:
            spool.check_dir(str(target), private=True)
        assert e.value.errno == errno.EPERM
        assert e.value.strerror == (f"spool {target} is open to other users (mode {mode:o}): refused (chmod 700 it, "
                                    "or set spool_dir)")
        spool.check_dir(str(target), private=False)  # a configured spool may be shared
    target.chmod(0o700)
    spool.check_dir(str(target), private=True)


@needs_root
def test_check_dir_refuses_a_strangers_directory_unless_trusted(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, STRANGER, STRANGER)
    with pytest.raises(spool.SpoolError) as e:
        spool.check_dir(str(theirs), private=True, trusted_uids=frozenset({STRANGER}))
    assert e.value.errno == errno.EPERM
    assert e.value.strerror == (f"spool {theirs} belongs to uid {STRANGER}, not to this user ({ME}): refused "
                                "(someone else created it; remove it or set spool_dir)")
    with pytest.raises(spool.SpoolError) as e:
        spool.check_dir(str(theirs), private=False, trusted_uids=frozenset({STRANGER + 1}))
    assert e.value.errno == errno.EPERM
    assert e.value.strerror == (f"spool {theirs} belongs to uid {STRANGER}, which is not trusted: refused (add it "
                                "to spool_trusted_uids if it should be)")
    spool.check_dir(str(theirs), private=False, trusted_uids=frozenset({STRANGER}))
    os.chown(theirs, 0, 0)
    spool.check_dir(str(theirs), private=False)  # root's: a volume Kubernetes mounted


def test_the_file_modes_of_a_shared_spool(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2770)
    assert spool.shared_file_mode(str(shared)) == 0o640, "setgid: readable by the directory's group"
    shared.chmod(0o770)
    assert spool.shared_file_mode(str(shared)) == 0o644, "else readable by all"
    assert spool.shared_file_mode(str(tmp_path / "missing")) == spool.PRIVATE_FILE_MODE == 0o600


def test_the_names_of_a_shard_and_its_stack_dump(tmp_path: Path) -> None:
    path = spool.shard_path("/s", 12, 345)
    assert path == "/s/outrider-12-345.shard" and spool.stacks_path(path) == "/s/outrider-12-345.stacks.txt"
    for pid in (7, 8, 9):
        spool.ShardWriter(str(tmp_path), pid, 1).write(b"", [], **{**HEADER, "pid": pid})
    (tmp_path / "outrider-10-1.shard.new").write_text("")
    (tmp_path / "outrider-x-1.shard").write_text("")
    (tmp_path / spool.LOCK_NAME).write_text("")
    assert sorted(spool.iter_shard_pids(str(tmp_path))) == [7, 8, 9]
    assert list(spool.iter_shard_pids(str(tmp_path / "missing"))) == []
    assert list(spool.iter_shard_pids(str(tmp_path / spool.LOCK_NAME))) == []


# --- locks and readers' marks ---------------------------------------------------------------------------------------

def test_the_agent_lock_is_taken_once_and_by_name(tmp_path: Path) -> None:
    fd = spool.try_lock(str(tmp_path))
    assert fd is not None
    try:
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        assert (tmp_path / "agent.lock").exists()
        assert spool.try_lock(str(tmp_path)) is None, "held by another open file: refused without blocking"
        other = spool.try_lock(str(tmp_path), "reader-0000000000000000.lock")
        assert other is not None, "another name is another lock"
        os.close(other)
    finally:
        os.close(fd)
    again = spool.try_lock(str(tmp_path))
    assert again is not None, "free once its holder closed it"
    os.close(again)
    os.mkfifo(tmp_path / "fifo.lock")
    said: list[str] = []
    fd = spool.try_lock(str(tmp_path), "fifo.lock", notice=said.append)
    assert fd is not None and stat.S_ISREG(os.lstat(tmp_path / "fifo.lock").st_mode), "a FIFO is replaced, not used"
    assert len(said) == 1 and "not a regular file" in said[0]
    os.close(fd)
    with pytest.raises(FileNotFoundError):
        spool.try_lock(str(tmp_path / "missing"))


@needs_root
def test_a_lock_file_of_a_stranger_that_nobody_holds_is_replaced_and_one_held_is_left(tmp_path: Path) -> None:
    lock = tmp_path / "agent.lock"
    lock.write_text("")
    lock.chmod(0o644)
    os.chown(lock, STRANGER, STRANGER)
    held = os.open(lock, os.O_RDONLY)  # the stranger's process holding it: as a sidecar of another uid would
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        said: list[str] = []
        assert spool.try_lock(str(tmp_path), notice=said.append) is None, "held: another agent serves the spool"
        assert said == [] and os.lstat(lock).st_uid == STRANGER
    finally:
        os.close(held)
    fd = spool.try_lock(str(tmp_path), notice=said.append, mode=0o644)
    assert fd is not None, "planted, held by nobody: replaced with ours, which we hold"
    try:
        st = os.lstat(lock)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o644)
        assert (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
        assert said == [f"{lock} was owned by uid {STRANGER}, which is not trusted, and no process held it (planted "
                        "by another user?): replaced with one of this user's"]
        assert spool.try_lock(str(tmp_path)) is None, "ours now, and held"
        assert sorted(os.listdir(tmp_path)) == ["agent.lock"], "nothing left behind"
    finally:
        os.close(fd)
    os.chown(lock, STRANGER, STRANGER)
    fd = spool.try_lock(str(tmp_path), trusted_uids=frozenset({STRANGER}))
    assert fd is not None and os.lstat(lock).st_uid == STRANGER, "a trusted uid's lock file is used as it is"
    os.close(fd)


def without_capabilities(capabilities: str, code: str, *args: str) -> list[str]:
    """What `code` prints, run by this interpreter as root without the given capabilities (capsh): as another user
    is, since other uids cannot run this interpreter here. Skips where capsh (libcap2-bin) is missing."""
    capsh = shutil.which("capsh")
    if capsh is None:
        pytest.skip("capsh (libcap2-bin) drops the capabilities")
    r = subprocess.run([capsh, f"--drop={capabilities}", "--", "-c", 'exec "$0" -c "$@"', sys.executable, code,
                        *args], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def planted(directory: Path, mode: int, owner: int = 0) -> Path:
    """A spool shared by several users, with the other user's empty agent.lock in it."""
    directory.mkdir()
    directory.chmod(mode)
    os.chown(directory, owner, owner)
    lock = directory / "agent.lock"
    lock.write_text("")
    lock.chmod(0o600)
    os.chown(lock, STRANGER, STRANGER)
    return lock


@needs_root
def test_another_users_lock_this_user_cannot_read_is_probed_in_the_kernels_lock_table(tmp_path: Path) -> None:
    """A 0600 lock file of another uid (an older agent's, or planted): held by a live process, it counts as held;
    held by none, it is replaced. "This user" cannot read it: root without the capabilities that read any file."""
    lock = planted(tmp_path / "emptydir", 0o777)
    code = "import sys; from outrider.shared import spool; print(spool.try_lock(sys.argv[1], notice=print) is not None)"
    without = "cap_dac_override,cap_dac_read_search"
    held = os.open(lock, os.O_RDONLY)  # the other uid's agent, alive and holding it
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert without_capabilities(without, code, str(lock.parent)) == ["False"], "held: an agent serves the spool"
    finally:
        os.close(held)
    said, taken = without_capabilities(without, code, str(lock.parent))
    assert taken == "True" and f"owned by uid {STRANGER} and not readable by this user" in said
    assert os.lstat(lock).st_uid == 0


@needs_root
def test_a_planted_lock_that_cannot_be_replaced_is_refused_with_the_reason(tmp_path: Path) -> None:
    """A sticky directory of another user (a shared /tmp-like spool): a process without CAP_FOWNER, as any other
    user is, cannot rename over the stranger's file."""
    lock = planted(tmp_path / "shared", 0o1777, owner=STRANGER)
    code = ("import sys; from outrider.shared import spool\n"
            "try:\n    spool.try_lock(sys.argv[1])\nexcept spool.LockRefused as e:\n    print('refused:', e)")
    (out,) = without_capabilities("cap_fowner", code, str(lock.parent))
    assert out.startswith("refused: "), out
    assert f"{lock} is owned by uid {STRANGER}, which is not trusted, and no process holds it" in out
    assert "remove it, or set spool_dir" in out
    assert sorted(os.listdir(lock.parent)) == ["agent.lock"], "nothing left behind"


def test_a_readers_mark_is_made_whole_then_stamped_by_each_sweep(tmp_path: Path) -> None:
    mark = spool.ReaderMark(str(tmp_path), 0o640)
    name = os.path.basename(mark.path)
    assert spool.READER_NAME_RE.fullmatch(name) and os.path.dirname(mark.path) == str(tmp_path)
    assert sorted(os.listdir(tmp_path)) == [name], "no .new left behind"
    st = os.stat(mark.path)
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_mtime_ns == 0, "no sweep yet"
    assert spool.live_readers(str(tmp_path)) == [0]
    mark.swept(123_456_789_000)
    assert os.stat(mark.path).st_mtime_ns == 123_456_789_000
    assert spool.live_readers(str(tmp_path)) == [123_456_789_000]
    assert mark.intact()
    mark.close()
    assert os.listdir(tmp_path) == [] and not mark.intact()
    mark.close()  # twice: nothing
    assert spool.live_readers(str(tmp_path)) == []
    with pytest.raises(FileNotFoundError):
        spool.ReaderMark(str(tmp_path / "missing"))
    assert spool.ReaderMark(str(tmp_path)).path != spool.ReaderMark(str(tmp_path)).path


def test_a_mark_moved_away_is_not_intact_and_its_closing_leaves_the_new_file(tmp_path: Path) -> None:
    mark = spool.ReaderMark(str(tmp_path))
    assert stat.S_IMODE(os.stat(mark.path).st_mode) == 0o600
    os.rename(mark.path, tmp_path / "moved")
    (tmp_path / os.path.basename(mark.path)).write_text("someone else's")
    assert not mark.intact()
    mark.close()
    assert (tmp_path / os.path.basename(mark.path)).read_text() == "someone else's", "not its file: kept"


def test_a_failed_mark_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "d"
    d.mkdir()
    holder = spool.ReaderMark(str(d))
    os.utime(holder.path, ns=(5, 5))
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    # the rename fails: a directory that is not empty sits at the final name
    mark_name = fixed_random(monkeypatch)
    (blocked / mark_name).mkdir()
    (blocked / mark_name / "x").write_text("")
    with pytest.raises(OSError):
        spool.ReaderMark(str(blocked))
    assert sorted(os.listdir(blocked)) == [mark_name], "the .new file was removed"
    assert spool.live_readers(str(d)) == [5]
    holder.close()


def test_live_readers_drop_marks_nobody_holds_and_ignore_what_is_not_a_mark(tmp_path: Path) -> None:
    held = spool.ReaderMark(str(tmp_path))
    held.swept(42)
    dead = tmp_path / "reader-0123456789abcdef.lock"
    dead.write_text("")
    os.utime(dead, ns=(7, 7))
    (tmp_path / "reader-fedcba9876543210.lock").mkdir()  # not a regular file: skipped, kept
    (tmp_path / "reader-short.lock").write_text("")
    (tmp_path / "reader-0123456789abcdef.lock.new").write_text("")
    assert spool.live_readers(str(tmp_path)) == [42]
    assert not dead.exists(), "its agent is gone: removed"
    assert (tmp_path / "reader-fedcba9876543210.lock").is_dir()
    assert (tmp_path / "reader-short.lock").exists() and (tmp_path / "reader-0123456789abcdef.lock.new").exists()
    assert spool.live_readers(str(tmp_path / "missing")) == []
    assert spool.live_readers(str(tmp_path / "reader-short.lock")) == []
    held.close()


# --- the header ---------------------------------------------------------------------------------------------------

def head(**kw: int) -> bytes:
    fields = {"flags": 1, "seq": 2, "pid": 3, "stalls": 4, "start_ns": 5, "heartbeat_ns": 6, "last_step_ns": 7,
              "steps": 8, "directory_len": 9, "value_count": 10, "stalled_since_ns": 11, **kw}
    return spool.pack_header(**fields)


def test_the_header_round_trips_every_field() -> None:
    h = spool.read_header(head())
    assert (h.version, h.flags, h.seq, h.pid, h.stalls, h.start_ns, h.heartbeat_ns, h.last_step_ns, h.steps,
            h.directory_len, h.value_count, h.stalled_since_ns) == (1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
    assert (h.generation, h.directory_capacity, h.data_offset, h.shard_bytes) == (
        0, spool.DIRECTORY_BYTES, spool.DATA_OFFSET, spool.SHARD_BYTES), "version 1: the first layout"
    grown = spool.read_header(head(generation=3, directory_capacity=8192, data_offset=12288, shard_bytes=20480))
    assert spool.read_header(head(directory_capacity=8192)).generation == 0, "a first file's generation is 0"
    assert (grown.version, grown.generation, grown.directory_capacity, grown.data_offset, grown.shard_bytes) == (
        2, 3, 8192, 12288, 20480)
    assert spool.read_header(head(pid=2**32 + 5, stalls=2**32 + 6)).pid == 5, "pid and stalls wrap to 32 bits"
    assert spool.read_header(head(pid=2**32 + 5, stalls=2**32 + 6)).stalls == 6
    assert spool.HEAD_BYTES == 104 and spool.SEQ_OFFSET == 16
    assert struct.unpack_from("<Q", head(seq=99), spool.SEQ_OFFSET) == (99,)
    for layout in ({"directory_capacity": 8192}, {"data_offset": spool.DATA_OFFSET + 8},
                   {"shard_bytes": spool.SHARD_BYTES + 8}):
        assert struct.unpack_from("<I", head(**layout), 8) == (2,), layout


def test_the_header_says_what_is_wrong_with_it() -> None:
    good = head()
    e = refusal(spool.read_header, good[:79])
    assert (e.reason, str(e)) == ("truncated", "truncated: 79 bytes, the header needs 80")
    assert spool.read_header(good[:80]).version == 1, "version 1's header is 80 bytes"
    e = refusal(spool.read_header, b"OUTRSHD2" + good[8:])
    assert (e.reason, str(e)) == ("corrupt", "not an Outrider shard (bad magic)")
    newer = bytearray(good)
    struct.pack_into("<I", newer, 8, spool.VERSION + 1)
    e = refusal(spool.read_header, bytes(newer))
    assert (e.reason, str(e)) == ("newer_version", "format version 3 is newer than this agent's 2")
    v2 = head(directory_capacity=8192)
    e = refusal(spool.read_header, v2[:103])
    assert (e.reason, str(e)) == ("truncated", "truncated: 103 bytes, the header needs 104")
    assert spool.read_header(v2[:104]).directory_capacity == 8192
    e = refusal(spool.read_header, head(directory_capacity=8192, directory_len=8193))
    assert (e.reason, str(e)) == ("corrupt", "corrupt: directory or data larger than the format allows")
    assert spool.read_header(head(directory_capacity=8192, directory_len=8192)).directory_len == 8192


@pytest.mark.parametrize(("layout", "ok"), [
    ({"directory_capacity": 4096, "data_offset": 8192, "shard_bytes": 8192}, True),  # no room for values at all
    ({"directory_capacity": 4096, "data_offset": 8184, "shard_bytes": 8192}, False),  # data inside the directory
    ({"directory_capacity": 4096, "data_offset": 8200, "shard_bytes": 8192}, False),  # data past the file's end
    ({"directory_capacity": 4096, "data_offset": 8196, "shard_bytes": 9000}, False),  # not a multiple of 8
    ({"directory_capacity": 32 << 20, "data_offset": 4096 + (32 << 20), "shard_bytes": 4096 + (32 << 20)}, True),
    ({"directory_capacity": (32 << 20) + 8, "data_offset": 4104 + (32 << 20),
      "shard_bytes": 4104 + (32 << 20)}, False),
    ({"directory_capacity": 4096, "data_offset": 8192, "shard_bytes": spool.MAX_SHARD_BYTES}, True),
    ({"directory_capacity": 4096, "data_offset": 8192, "shard_bytes": spool.MAX_SHARD_BYTES + 1}, False),
])
def test_a_claimed_layout_must_fit_the_format(layout: dict[str, int], ok: bool) -> None:
    buf = head(directory_len=0, value_count=0, **layout)
    if ok:
        assert spool.read_header(buf).data_offset == layout["data_offset"]
    else:
        e = refusal(spool.read_header, buf)
        assert (e.reason, str(e)) == ("corrupt", "corrupt: the layout does not fit the format")


@pytest.mark.parametrize(("values", "ok"), [(0, True), (1, True), (2, False)])
def test_the_values_must_fit_between_the_data_offset_and_the_end(values: int, ok: bool) -> None:
    buf = head(directory_len=0, value_count=values, directory_capacity=4096, data_offset=8192, shard_bytes=8200)
    if ok:
        assert spool.read_header(buf).value_count == values
    else:
        assert str(refusal(spool.read_header, buf)) == "corrupt: directory or data larger than the format allows"


@pytest.mark.parametrize(("needed", "have", "limit", "out"), [
    (0, 0, 1 << 20, 4096),  # at least a page
    (100, 4096, 1 << 20, 4096),
    (3277, 4096, 1 << 20, 4096),  # 3277 + 819 = 4096: a quarter spare just fits
    (3278, 4096, 1 << 20, 8192),  # 3278 + 819 = 4097: doubled
    (4096, 4096, 1 << 20, 8192),
    (6554, 8192, 1 << 20, 8192),
    (6555, 8192, 1 << 20, 16384),
    (10_000, 4096, 1 << 20, 16384),
    (10_000, 4096, 8192, 8192),  # the limit
    (10_000, 4096, 10_000, 10_000),  # a limit that is no multiple of a page is the limit
    (5000, 5000, 1 << 20, 12288),  # doubled from have (10000), then rounded up to pages
    (100, 6000, 1 << 20, 8192),  # have rounded up to pages
])
def test_a_grown_capacity_doubles_until_a_quarter_is_spare(needed: int, have: int, limit: int, out: int) -> None:
    assert spool.capacity_for(needed, have, limit) == out


# --- the writer ---------------------------------------------------------------------------------------------------

def test_a_writer_lays_out_its_file_from_its_capacities(tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 5, 6, directory_capacity=5000, value_capacity=3, generation=2, seq=9)
    assert w.path == str(tmp_path / "outrider-5-6.shard") and (w.pid, w.start_ns, w.generation) == (5, 6, 2)
    assert w.data_offset == 4096 + 5000 and w.shard_bytes == 4096 + 5000 + 24
    w2 = spool.ShardWriter(str(tmp_path), 5, 7, directory_capacity=5001, value_capacity=3)
    assert w2.data_offset == 4096 + 5008, "rounded up to a multiple of 8"
    assert os.listdir(tmp_path) == ["outrider-5-6.shard.new", "outrider-5-7.shard.new"] or sorted(
        os.listdir(tmp_path)) == ["outrider-5-6.shard.new", "outrider-5-7.shard.new"]
    assert os.path.getsize(w.path + ".new") == w.shard_bytes, "every block reserved"
    assert w.fits(5000, 3) and not w.fits(5001, 3) and not w.fits(5000, 4)
    w.write(b"{}", [1.0, 2.0, 3.0], **HEADER)
    h = spool.read_header(Path(w.path).read_bytes())
    assert h.seq == 12, "from an odd seq: the next even, then +2 for a write"
    assert (h.generation, h.directory_capacity, h.data_offset, h.shard_bytes) == (2, 5000, 9096, 9120)
    assert h.directory_len == 2 and h.value_count == 3 and h.version == 2
    w3 = spool.ShardWriter(str(tmp_path), 5, 8, seq=10)
    w3.write(b"", [], **HEADER)
    assert spool.read_header(Path(w3.path).read_bytes()).seq == 12
    with pytest.raises(ValueError, match=r"^a shard larger than the format allows$"):
        spool.ShardWriter(str(tmp_path), 5, 9, directory_capacity=spool.MAX_DIRECTORY_BYTES + 8)
    spool.ShardWriter(str(tmp_path), 5, 10, directory_capacity=spool.MAX_DIRECTORY_BYTES, value_capacity=1).close()
    with pytest.raises(ValueError, match=r"^a shard larger than the format allows$"):
        spool.ShardWriter(str(tmp_path), 5, 11, value_capacity=(spool.MAX_SHARD_BYTES - spool.DATA_OFFSET) // 8 + 1)
    assert not any(n.startswith("outrider-5-9") or n.startswith("outrider-5-11") for n in os.listdir(tmp_path))


def test_a_writer_takes_over_a_pending_file_its_process_left(tmp_path: Path) -> None:
    stale = tmp_path / "outrider-5-6.shard.new"
    stale.write_bytes(b"half written")
    w = spool.ShardWriter(str(tmp_path), 5, 6)
    assert os.path.getsize(stale) == spool.SHARD_BYTES
    w.write(b"", [], **HEADER)
    assert not stale.exists() and spool.read_header(Path(w.path).read_bytes()).pid == 4242


def test_a_writer_sets_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        w = spool.ShardWriter(str(tmp_path), 5, 6, mode=0o644)
        w.write(b"", [], **HEADER)
        assert stat.S_IMODE(os.stat(w.path).st_mode) == 0o644 and w.mode == 0o644
        stacks = w.write_stacks("# first\n", lambda fh: fh.write("a\n"))
        assert stat.S_IMODE(os.stat(stacks).st_mode) == 0o644
    finally:
        os.umask(old)


def test_a_writer_that_cannot_reserve_its_blocks_leaves_no_file(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError) as e:
        spool.ShardWriter(str(tmp_path), 5, 6)
    assert e.value.errno == errno.ENOSPC and os.listdir(tmp_path) == []


def test_a_writer_publishes_on_its_first_write_and_rewrites_the_directory_only_when_it_changed(
        tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 5, 6)
    assert w.intact(), "not published yet: nothing to lose"
    assert not os.path.exists(w.path)
    w.write(directory(), [1.0], **HEADER)
    assert os.path.exists(w.path) and not os.path.exists(w.path + ".new") and w.intact()
    r = reader(tmp_path)
    snap = r.read(w.path)
    assert snap is not None and snap.series[0][3] == [1.0]
    # Bytes planted in the directory area are not overwritten by a write with the same directory...
    with open(w.path, "r+b") as fh:
        fh.seek(spool.HEADER_BYTES)
        fh.write(b'{"meta":{},"series":[["y_total","counter",{},0,[]]]}')
    w.write(directory(), [2.0], **HEADER)
    with open(w.path, "rb") as fh:
        fh.seek(spool.HEADER_BYTES)
        assert fh.read(4) == b'{"me' and b"y_total" in fh.read(60)
    # ...but are by one whose directory changed
    w.write(directory(meta={"rank": "4"}), [3.0], **HEADER)
    snap = spool.decode(Path(w.path).read_bytes())
    assert snap.meta == {"rank": "4"} and snap.series[0][:2] == ("x_total", "counter") and snap.series[0][3] == [3.0]
    w.write(directory(meta={"rank": "4"}, series=[]), [], **HEADER)
    snap = spool.decode(Path(w.path).read_bytes())
    assert snap.header.value_count == 0 and snap.series == []
    with pytest.raises(ValueError, match=r"^shard full$"):
        w.write(b"x" * (spool.DIRECTORY_BYTES + 1), [], **HEADER)
    w.close()
    assert os.path.exists(w.path), "a published shard stays for the agent"
    w.close()


def test_a_grown_writer_is_the_next_generation_with_room_for_what_did_not_fit(tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 5, 6)
    w.write(b"", [], **HEADER)
    assert w.room_for(100, 100) == (spool.DIRECTORY_BYTES, spool.MAX_VALUES), "it fits: the same"
    assert w.room_for(spool.DIRECTORY_BYTES, 0) == (2 * spool.DIRECTORY_BYTES, spool.MAX_VALUES)
    assert w.room_for(0, spool.MAX_VALUES) == (spool.DIRECTORY_BYTES, 2 * spool.MAX_VALUES)
    assert w.room_for(spool.MAX_DIRECTORY_BYTES * 2, spool.MAX_DATA_BYTES) == (
        spool.MAX_DIRECTORY_BYTES, spool.MAX_DATA_BYTES // 8), "as far as the format allows"
    g = w.grown(spool.DIRECTORY_BYTES, 10)
    assert (g.generation, g.directory_capacity, g.value_capacity, g.pid, g.start_ns, g.mode) == (
        1, 2 * spool.DIRECTORY_BYTES, spool.MAX_VALUES, 5, 6, w.mode)
    g.write(b"", [], **HEADER)
    h = spool.read_header(Path(g.path).read_bytes())
    assert h.generation == 1 and h.seq == 4, "the seq goes on from the old generation's"
    assert not w.intact(), "the old generation's file is no longer at the name"
    assert g.intact()
    abandoned = g.grown(10, 10)
    abandoned.close()
    assert sorted(os.listdir(tmp_path)) == ["outrider-5-6.shard"], "an abandoned growth leaves no file"


def test_a_writer_whose_spool_was_deleted_knows(tmp_path: Path) -> None:
    w = published(tmp_path)
    os.unlink(w.path)
    assert not w.intact()
    w2 = published(tmp_path, pid=9)
    w2.close()
    assert w2.intact(), "closed: nothing more to publish, nothing to lose"


def test_a_stack_dump_replaces_the_last_and_starts_with_its_first_line(tmp_path: Path) -> None:
    w = published(tmp_path)
    path = w.write_stacks("# one\n", lambda fh: fh.write("first dump\n"))
    assert path == spool.stacks_path(w.path)
    assert Path(path).read_text() == "# one\nfirst dump\n" and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    w.write_stacks("# two\n", lambda fh: fh.write("caf\udce9\n"))
    assert Path(path).read_bytes() == b"# two\ncaf\\udce9\n", "what cannot be encoded is escaped, never raised"
    r = reader(tmp_path)
    assert r.has_stacks(w.path)
    assert r.read_stacks(w.path, ME) == "# two\ncaf\\udce9\n"
    assert r.read_stacks(w.path, ME, limit=4) == "# tw"
    assert r.read_stacks(w.path, ME + 1) is None, "not the shard owner's"
    Path(path).write_bytes(b"\xff\xfeok")
    assert r.read_stacks(w.path, ME) == "\ufffd\ufffdok"
    os.unlink(path)
    assert not r.has_stacks(w.path) and r.read_stacks(w.path, ME) is None
    os.mkdir(path)
    assert not r.has_stacks(w.path) and r.read_stacks(w.path, ME) is None, "a directory is no dump"
    os.rmdir(path)
    os.symlink(w.path, path)
    assert not r.has_stacks(w.path), "a link is no dump"


# --- the reader ---------------------------------------------------------------------------------------------------

def test_the_reader_lists_shards_by_name_and_the_pending_ones(tmp_path: Path) -> None:
    for pid in (30, 4, 200):
        published(tmp_path, pid=pid)
    spool.ShardWriter(str(tmp_path), 77, 88)  # created, never written: pending
    (tmp_path / "outrider-1-2.shard.tmp").write_text("")
    (tmp_path / "notes.txt").write_text("")
    r = reader(tmp_path)
    assert r.paths() == [str(tmp_path / f"outrider-{p}-1000.shard") for p in ("200", "30", "4")], "sorted by name"
    assert r.pending() == [(str(tmp_path / "outrider-77-88.shard.new"), 77, 88)]
    assert reader(tmp_path / "missing").paths() == [] and reader(tmp_path / "missing").pending() == []
    assert reader(tmp_path / "notes.txt").paths() == [] and reader(tmp_path / "notes.txt").pending() == []


def test_the_reader_lets_go_of_what_it_held_for_a_shard_no_longer_listed(tmp_path: Path) -> None:
    good = published(tmp_path, pid=1)
    bad = tmp_path / "outrider-2-1.shard"
    bad.write_bytes(b"x" * 200)
    r = reader(tmp_path)
    r.paths()
    assert r.read(good.path) is not None
    with pytest.raises(spool.ShardFormatError):
        r.read(str(bad))
    assert r.open_count == 1 and r.rejected() == {"corrupt": 1}
    assert set(r._directories) == {good.path}
    os.unlink(good.path)
    os.unlink(bad)
    assert r.paths() == []
    assert r.open_count == 0 and r.rejected() == {} and r._directories == {}


def test_rejected_files_are_counted_by_reason(tmp_path: Path) -> None:
    for name, data in (("outrider-1-1.shard", b"x" * 200), ("outrider-2-1.shard", b"y" * 200),
                       ("outrider-3-1.shard", b"z" * 10)):
        (tmp_path / name).write_bytes(data)
    os.mkfifo(tmp_path / "outrider-4-1.shard")
    r = reader(tmp_path)
    for path in r.paths():
        with pytest.raises(spool.ShardFormatError):
            r.read(path)
    assert r.rejected() == {"corrupt": 2, "truncated": 1, "not_regular": 1}
    assert r.open_count == 0, "a file found unusable is closed at once"


def test_what_lstat_rules_out_says_why(tmp_path: Path) -> None:
    r = reader(tmp_path)
    fifo = tmp_path / "outrider-1-1.shard"
    os.mkfifo(fifo)
    e = refusal(r.read, str(fifo))
    assert (e.reason, str(e)) == ("not_regular", f"not a regular file (mode {os.lstat(fifo).st_mode:o})")
    w = published(tmp_path, pid=2)
    for mode in (0o620, 0o602, 0o622):
        os.chmod(w.path, mode)
        e = refusal(reader(tmp_path).read, w.path)
        assert (e.reason, str(e)) == ("bad_mode", f"writable by others than its owner (mode {mode:o})")
    for mode in (0o600, 0o640, 0o644, 0o700, 0o611):
        os.chmod(w.path, mode)
        assert reader(tmp_path).read(w.path) is not None, oct(mode)
    small = tmp_path / "outrider-3-1.shard"
    small.write_bytes(spool.pack_header(**{**HEADER, "seq": 0, "directory_len": 0, "value_count": 0})[:79])
    e = refusal(r.read, str(small))
    assert (e.reason, str(e)) == ("truncated", "truncated: 79 bytes, the header needs 80")
    small.write_bytes(spool.pack_header(**{**HEADER, "seq": 0, "directory_len": 0, "value_count": 0})[:80])
    snap = r.read(str(small))
    assert snap is not None and snap.series == [] and snap.header.pid == 4242
    big = tmp_path / "outrider-4-1.shard"
    with open(big, "wb") as fh:
        fh.truncate(spool.MAX_SHARD_BYTES + 1)
    e = refusal(r.read, str(big))
    assert (e.reason, str(e)) == ("too_large", f"{spool.MAX_SHARD_BYTES + 1} bytes: larger than the format allows")


def test_a_shard_of_an_untrusted_owner_says_which_uid(tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 123, 1_000)  # named for pid 123, its header claims 4242
    w.write(directory(), [7.0], **HEADER)
    seen: list[tuple[int, int]] = []

    def trusted(uid: int, pid: int) -> bool:
        seen.append((uid, pid))
        return False

    e = refusal(reader(tmp_path, trusted=trusted).read, w.path)
    assert (e.reason, str(e)) == ("untrusted", f"owned by uid {ME}, which this agent does not trust")
    assert seen == [(ME, 123)], "asked with the pid the name gives, before anything is opened"
    # a name without a pid (a tool reading one file) is asked with the pid the header claims
    seen.clear()
    named = tmp_path / "copy.bin"
    named.write_bytes(Path(w.path).read_bytes())
    named.chmod(0o600)
    e = refusal(reader(tmp_path, trusted=trusted).read, str(named))
    assert e.reason == "untrusted" and seen == [(ME, 4242)]
    # the header's pid is asked too, after the name's
    seen.clear()
    calls = iter([True, False])
    e = refusal(reader(tmp_path, trusted=lambda uid, pid: (seen.append((uid, pid)), next(calls))[1]).read, w.path)
    assert e.reason == "untrusted" and seen == [(ME, 123), (ME, 4242)]
    assert str(e) == f"owned by uid {ME}, which this agent does not trust"


def test_a_refused_file_is_refused_again_without_opening_until_it_changes(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "outrider-1-1.shard"
    bad.write_bytes(b"x" * 200)
    r = reader(tmp_path)
    first = refusal(r.read, str(bad))
    assert type(first) is spool.ShardFormatError and str(first) == "not an Outrider shard (bad magic)"
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (opened.append(str(p)), real_open(p, *a, **k))[1])
    again = refusal(r.read, str(bad))
    assert type(again) is spool.ShardRejected and again.reason == "corrupt"
    assert str(again) == "unchanged since it was refused: not an Outrider shard (bad magic)"
    assert opened == []
    # after RECHECK_S it is opened again; refused the same way, it says so
    now = time.monotonic()
    spool_time(monkeypatch, monotonic=lambda: now + spool.RECHECK_S + 1)
    again = refusal(r.read, str(bad))
    assert type(again) is spool.ShardRejected and str(again) == "still refused: not an Outrider shard (bad magic)"
    assert again.reason == "corrupt"
    assert opened == [str(bad)]
    # changed, and refused for another reason: the new error itself
    bad.write_bytes(b"x" * 10)
    e = refusal(r.read, str(bad))
    assert type(e) is spool.ShardTruncated
    # changed into a good shard: read, and no longer counted as rejected
    bad.unlink()
    good = published(tmp_path, pid=1)
    os.rename(good.path, bad)
    assert r.read(str(bad)) is not None and r.rejected() == {}


def test_a_shard_that_went_is_none_and_forgotten(tmp_path: Path) -> None:
    w = published(tmp_path)
    r = reader(tmp_path)
    assert r.read(w.path) is not None and r.open_count == 1
    os.unlink(w.path)
    assert r.read(w.path) is None
    assert r.open_count == 0 and r._directories == {}


def test_the_reader_keeps_one_descriptor_per_shard_and_reopens_a_replaced_file(tmp_path: Path) -> None:
    w = published(tmp_path, values=[1.0])
    r = reader(tmp_path)
    assert r.read(w.path).series[0][3] == [1.0]  # type: ignore[union-attr]
    fd = r._fds[w.path][2]
    w.write(directory(), [2.0], **HEADER)
    assert r.read(w.path).series[0][3] == [2.0] and r._fds[w.path][2] == fd, "the same file: the same descriptor"  # type: ignore[union-attr]
    g = w.grown(spool.DIRECTORY_BYTES + 1, 1)
    g.write(directory(), [3.0], **HEADER)
    fds_before = len(os.listdir("/proc/self/fd"))
    assert r.read(w.path).series[0][3] == [3.0] and r.open_count == 1, "a new generation: reopened"  # type: ignore[union-attr]
    assert r._fds[w.path][1] == os.stat(w.path).st_ino, "the new file's"
    assert len(os.listdir("/proc/self/fd")) == fds_before, "the old generation's descriptor was closed"
    r.close()
    assert r.open_count == 0 and r._directories == {}


def test_past_max_open_a_shard_is_opened_for_its_read_and_closed(tmp_path: Path) -> None:
    ws = [published(tmp_path, pid=p) for p in (1, 2, 3)]
    r = reader(tmp_path, max_open=2)
    assert r.max_open == 2
    before = len(os.listdir("/proc/self/fd"))
    for w in ws:
        assert r.read(w.path) is not None
    assert r.open_count == 2 and list(r._fds) == [ws[0].path, ws[1].path]
    assert len(os.listdir("/proc/self/fd")) == before + 2, "the third was closed after its read"
    assert r.read(ws[0].path) is not None and list(r._fds) == [ws[1].path, ws[0].path], "a hit moves to the end"
    assert reader(tmp_path).max_open == spool.open_budget()


def test_out_of_descriptors_the_reader_closes_the_older_half_of_its_own(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ws = [published(tmp_path, pid=p) for p in range(1, 8)]
    r = reader(tmp_path)
    for w in ws[:6]:
        r.read(w.path)
    assert r.open_count == 6
    real_open = os.open
    fails = [errno.EMFILE]

    def scarce(path: str, *a: object, **k: object) -> int:
        if fails:
            raise OSError(fails.pop(), "Too many open files")
        return real_open(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", scarce)
    assert r.read(ws[6].path) is not None
    assert list(r._fds) == [w.path for w in ws[3:7]], "the older half (3 of 6) given back"
    fails[:] = [errno.ENFILE, errno.ENFILE]
    r.forget(ws[6].path)
    with pytest.raises(OSError) as e:
        r.read(ws[6].path)
    assert e.value.errno == errno.ENFILE and r.open_count == 2, "half of 3 is 1: one given back"
    with pytest.raises(OSError) as e:
        r.read(ws[0].path)
    assert e.value.errno == errno.EMFILE and str(e.value) == (
        "[Errno 24] out of descriptors: not opened until the next sweep")
    assert r.read(ws[5].path) is not None, "a shard it still holds is read"
    r.paths()
    assert r.read(ws[0].path) is not None, "the next listing opens again"
    fails[:] = [errno.EACCES]
    with pytest.raises(PermissionError):
        r.read(ws[1].path)
    r.close()


def test_an_empty_reader_out_of_descriptors_still_tries_once_more(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    w = published(tmp_path)
    r = reader(tmp_path)
    real_open = os.open
    fails = [errno.EMFILE]
    monkeypatch.setattr(os, "open", lambda p, *a, **k: real_open(p, *a, **k) if not fails else (_ for _ in ()).throw(
        OSError(fails.pop(), "Too many open files")))
    assert r.read(w.path) is not None


def after_lstat(monkeypatch: pytest.MonkeyPatch, path: str, change: Callable[[], object]) -> None:
    """`change` made to the spool right after the reader's lstat of `path`, before it opens the file (a race)."""
    real_lstat = os.lstat

    def racing(p: str) -> os.stat_result:
        st = real_lstat(p)
        if str(p) == path:
            change()
        return st

    monkeypatch.setattr(os, "lstat", racing)


def test_a_symlink_swapped_in_after_lstat_is_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = published(tmp_path)
    (tmp_path / "x").mkdir()
    target = published(tmp_path / "x", pid=5)
    r = reader(tmp_path)
    after_lstat(monkeypatch, w.path, lambda: (os.unlink(w.path), os.symlink(target.path, w.path)))
    e = refusal(r.read, w.path)
    assert (e.reason, str(e)) == ("not_regular", "a symbolic link")


def test_a_file_replaced_between_lstat_and_open_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = published(tmp_path)
    other = published(tmp_path, pid=5)
    r = reader(tmp_path)
    after_lstat(monkeypatch, w.path, lambda: os.rename(other.path, w.path))
    e = refusal(r.read, w.path)
    assert (e.reason, str(e)) == ("not_regular", "replaced while being opened")
    assert r.open_count == 0


def test_a_shard_removed_between_lstat_and_open_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = published(tmp_path)
    r = reader(tmp_path)
    after_lstat(monkeypatch, w.path, lambda: os.unlink(w.path))
    assert r.read(w.path) is None


def test_a_writer_that_never_settles_is_busy_and_looked_at_again(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    w = published(tmp_path)
    with open(w.path, "r+b") as fh:
        fh.seek(spool.SEQ_OFFSET)
        fh.write(struct.pack("<Q", 5))  # odd: mid-update, for good
    sleeps: list[float] = []
    spool_time(monkeypatch, sleep=sleeps.append)
    r = reader(tmp_path)
    e = refusal(r.read, w.path)
    assert (type(e), str(e)) == (spool.ShardBusy, "the writer never settled (seq kept changing)")
    assert sleeps == [0.0005] * 50, "50 looks, half a millisecond apart"
    assert r.rejected() == {}, "busy is transient: not remembered as refused"
    assert type(refusal(r.read, w.path)) is spool.ShardBusy, "read again, not ShardRejected"
    with open(w.path, "r+b") as fh:
        fh.seek(spool.SEQ_OFFSET)
        fh.write(struct.pack("<Q", 6))
    assert r.read(w.path) is not None


def test_a_copy_torn_by_the_writer_is_taken_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = published(tmp_path, values=[1.0])
    r = reader(tmp_path)
    real_pread = os.pread
    reads: list[int] = []

    def racing(fd: int, n: int, offset: int) -> bytes:
        reads.append(offset)
        if len(reads) == 3:  # the data was read: the writer moves on before the seq is read again
            w.write(directory(), [2.0], **HEADER)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", racing)
    snap = r.read(w.path)
    assert snap is not None and snap.series[0][3] == [2.0] and snap.header.seq == 4
    assert reads == [0, spool.HEADER_BYTES, spool.DATA_OFFSET, spool.SEQ_OFFSET] * 2


def test_a_snapshot_carries_its_owner_and_the_file_it_came_from(tmp_path: Path) -> None:
    w = published(tmp_path)
    snap = reader(tmp_path).read(w.path)
    assert snap is not None and snap.uid == ME
    assert snap.identity == spool.identity(os.lstat(w.path))
    st = os.lstat(w.path)
    assert snap.identity == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid)
    assert reader(tmp_path).identity(w.path) == snap.identity and reader(tmp_path).identity(w.path + "x") is None


def test_the_parsed_directory_is_kept_while_it_stays_the_same(tmp_path: Path) -> None:
    w = published(tmp_path, values=[1.0])
    r = reader(tmp_path)
    first = r.read(w.path)
    kept = r._directories[w.path]
    w.write(directory(), [2.0], **HEADER)
    assert r.read(w.path).series[0][3] == [2.0] and r._directories[w.path] is kept  # type: ignore[union-attr]
    w.write(directory(meta={"rank": "9"}), [3.0], **HEADER)
    snap = r.read(w.path)
    assert snap is not None and snap.meta == {"rank": "9"} and r._directories[w.path] is not kept
    assert first is not None and first.meta == {"rank": "3"}


def test_remove_deletes_a_shard_and_its_dump_and_forgets_them(tmp_path: Path) -> None:
    w = published(tmp_path)
    w.write_stacks("# x\n", lambda fh: None)
    r = reader(tmp_path)
    r.read(w.path)
    r.remove(w.path)
    assert os.listdir(tmp_path) == [] and r.open_count == 0 and r._directories == {}
    r.remove(w.path)  # already gone: nothing
    w2 = published(tmp_path, pid=3)
    r.remove(w2.path)  # no dump beside it
    assert os.listdir(tmp_path) == []


# --- decoding -----------------------------------------------------------------------------------------------------

def test_decode_refuses_a_copy_shorter_than_its_header_promises(tmp_path: Path) -> None:
    w = published(tmp_path, values=[1.0])
    buf = Path(w.path).read_bytes()
    end = spool.DATA_OFFSET + 8
    assert spool.decode(buf[:end]).series[0][3] == [1.0]
    e = refusal(spool.decode, buf[:end - 1])
    assert (e.reason, str(e)) == ("truncated", f"truncated: {end - 1} bytes, the header promises more")
    d = len(directory())
    e = refusal(spool.decode, buf[:spool.HEADER_BYTES + d - 1])
    assert str(e) == f"truncated: {spool.HEADER_BYTES + d - 1} bytes, the header promises more"


def test_a_file_shorter_than_its_header_promises_is_truncated_on_disk_too(tmp_path: Path) -> None:
    w = published(tmp_path, values=[1.0])
    end = spool.DATA_OFFSET + 8
    os.truncate(w.path, end - 1)
    e = refusal(reader(tmp_path).read, w.path)
    assert (e.reason, str(e)) == ("truncated", f"truncated: {end - 1} bytes, the header promises more")
    os.truncate(w.path, end)
    assert reader(tmp_path).read(w.path) is not None


@pytest.mark.parametrize(("text", "why"), [
    (b"[1]", "corrupt directory: not an object"),
    (b'{"meta": 1}', "corrupt directory: meta is not an object"),
    (b'{"series": 1}', "corrupt directory: series is not a list"),
    (b'{"series": "abc"}', "corrupt directory: series is not a list"),
    (b"\xff", "corrupt directory: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
    (b"{", "corrupt directory: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    (b"[" * 100_000, "corrupt directory: maximum recursion depth exceeded while decoding a JSON array from a "
                     "unicode string"),
])
def test_a_bad_directory_says_what_is_wrong(text: bytes, why: str) -> None:
    e = refusal(spool.parse_directory, text)
    assert (e.reason, str(e)[:len(why)]) == ("corrupt", why)
    assert len(str(e)) <= len("corrupt directory: ") + 200


def test_a_directory_without_meta_or_series_is_empty_and_meta_keeps_only_plain_values() -> None:
    assert spool.parse_directory(b"") == ({}, [], [])
    assert spool.parse_directory(b"{}") == ({}, [], [])
    assert spool.parse_directory(b'{"meta": null, "series": null, "sketches": null}') == ({}, [], [])
    assert spool.parse_directory(b'{"meta": {}, "series": []}') == ({}, [], [])
    meta, entries, sketches = spool.parse_directory(
        b'{"meta": {"a": "x", "b": 2, "c": 1.5, "d": [1], "e": {"f": 1}, "g": null, "h": true}, "series": [1, 2],'
        b' "sketches": [[0, 1, 2]]}')
    assert meta == {"a": "x", "b": 2, "c": 1.5, "h": True} and entries == [1, 2] and sketches == [[0, 1, 2]]
    assert spool.parse_directory(b'{"sketches": {"a": 1}}')[2] == [{"a": 1}], "refused later, alone"


def entry_error(entry: object, values: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0)) -> str:
    with pytest.raises((TypeError, ValueError)) as e:
        spool._series(entry, values)
    return str(e.value)


@pytest.mark.parametrize(("entry", "why"), [
    ("x", "an entry is not [name, kind, labels, offset, bounds]"),
    (["x_total", "counter", {}, 0], "an entry is not [name, kind, labels, offset, bounds]"),
    (["x_total", "counter", {}, 0, [], 1], "an entry is not [name, kind, labels, offset, bounds]"),
    ([1, "counter", {}, 0, []], "the metric name is not a string"),
    (["\udce9", "counter", {}, 0, []], "the metric name is not valid UTF-8"),
    (["9x", "counter", {}, 0, []], "invalid metric name '9x'"),
    (["__x", "counter", {}, 0, []], "invalid metric name '__x'"),
    (["up", "gauge", {}, 0, []], "reserved metric name 'up': Prometheus writes a series of that name itself"),
    (["ALERTS", "gauge", {}, 0, []], "reserved metric name 'ALERTS': Prometheus writes a series of that name itself"),
    (["a" * 100 + "-", "counter", {}, 0, []], "invalid metric name '" + "a" * 80 + "'"),
    (["x", "summary" * 5, {}, 0, []], "x: unknown kind 'summarysummarysummar'"),
    (["x", None, {}, 0, []], "x: unknown kind 'None'"),
    (["x", "counter", [], 0, []], "x: labels are not an object"),
    (["x", "counter", {"a": 1}, 0, []], "x: the value of label a is not a string"),
    (["x", "counter", {"a": "\udce9"}, 0, []], "x: the value of label a is not valid UTF-8"),
    (["x", "counter", {"9a": "v"}, 0, []], "x: invalid or reserved label name '9a'"),
    (["x", "counter", {"__a": "v"}, 0, []], "x: invalid or reserved label name '__a'"),
    (["x", "counter", {"b" * 90 + "-": "v"}, 0, []], "x: invalid or reserved label name '" + "b" * 80 + "'"),
    (["x", "counter", {"training_job": "v"}, 0, []], "x: invalid or reserved label name 'training_job'"),
    (["x", "counter", {"quantile": "v"}, 0, []], "x: invalid or reserved label name 'quantile'"),
    (["x", "counter", {"a": "v" * 129}, 0, []], "x: label a longer than 128 characters"),
    (["x", "counter", {}, 0, [1.0]], "x: bounds do not match its kind"),
    (["x", "histogram", {}, 0, []], "x: bounds do not match its kind"),
    (["x", "gauge", {}, 0, "no"], "x: bounds do not match its kind"),
    (["x", "histogram", {}, 0, [1.0, "2"]], "x: bounds are not finite and increasing"),
    (["x", "histogram", {}, 0, [True]], "x: bounds are not finite and increasing"),
    (["x", "histogram", {}, 0, [float("inf")]], "x: bounds are not finite and increasing"),
    (["x", "histogram", {}, 0, [float("nan")]], "x: bounds are not finite and increasing"),
    (["x", "histogram", {}, 0, [1.0, 1.0]], "x: bounds are not finite and increasing"),
    (["x", "counter", {}, -1, []], "x: offset outside the data area"),
    (["x", "counter", {}, 4, []], "x: offset outside the data area"),
    (["x", "counter", {}, 1.0, []], "x: offset outside the data area"),
    (["x", "counter", {}, True, []], "x: offset outside the data area"),
    (["x", "histogram", {}, 2, [1.0]], "x: offset outside the data area"),  # needs 3 values from 2: 4 there
])
def test_a_bad_entry_says_what_is_wrong(entry: object, why: str) -> None:
    assert entry_error(entry) == why


def test_the_values_of_an_entry_are_checked_for_its_kind() -> None:
    s = spool._series
    assert s(["x", "counter", {"a": "v" * 128}, 3, []], (0.0, 0.0, 0.0, 5.0)) == (
        "x", "counter", {"a": "v" * 128}, [5.0], ())
    assert s(["x", "histogram", {}, 1, [1, 2.5]], (9.0, 0.0, 1.0, 2.0, 0.5)) == (
        "x", "histogram", {}, [0.0, 1.0, 2.0, 0.5], (1.0, 2.5)), "the sum may be fractional"
    assert s(["x", "histogram", {}, 0, [1.0]], (0.0, 0.0, -0.5))[3] == [0.0, 0.0, -0.5], "and negative"
    assert s(["x", "gauge", {}, 0, []], (-5.0,))[3] == [-5.0], "a gauge may be negative"
    assert s(["x", "counter", {}, 0, []], (0.0,))[3] == [0.0]
    assert entry_error(["x", "counter", {}, 0, []], (-0.5,)) == "x: a counter is negative"
    assert entry_error(["x", "gauge", {}, 0, []], (float("inf"),)) == "x: a value is NaN or infinite"
    assert entry_error(["x", "histogram", {}, 0, [1.0]], (0.0, 0.0, float("nan"))) == "x: a value is NaN or infinite"
    assert entry_error(["x", "histogram", {}, 0, [1.0]], (0.5, 1.0, 2.0)) == (
        "x: a bucket count is negative or fractional")
    assert entry_error(["x", "histogram", {}, 0, [1.0]], (1.0, -1.0, 2.0)) == (
        "x: a bucket count is negative or fractional")
    assert s(["x:y_z", "counter", {"_a": "", "B9": "é"}, 0, []], (1.0,))[:3] == ("x:y_z", "counter",
                                                                                 {"_a": "", "B9": "é"})


def test_a_rejected_entry_is_kept_as_its_first_200_characters(tmp_path: Path) -> None:
    w = published(tmp_path, series=[["x" * 300 + "-", "counter", {}, 0, []], ["ok_total", "counter", {}, 0, []],
                                    ["ok", "gauge", {}, "z", []]])
    snap = reader(tmp_path).read(w.path)
    assert snap is not None and [s[0] for s in snap.series] == ["ok_total"]
    assert snap.rejected == [("invalid metric name '" + "x" * 80 + "'"), "ok: offset outside the data area"]
    long = ("y" * 150) + "-"
    w2 = published(tmp_path, pid=5, series=[["x", "counter", {long: "v"}, 0, []], ["x", "counter", {}, 0, {}]])
    snap = reader(tmp_path).read(w2.path)
    assert snap is not None and snap.rejected[0] == f"x: invalid or reserved label name '{'y' * 80}'"
    assert snap.rejected[1] == "x: bounds do not match its kind"
    assert spool.decode(Path(w2.path).read_bytes()).rejected == snap.rejected


# --- what the reader and the writer survive: a low descriptor, a failing cleanup, a planted link ---------------------

def descriptor_free(fd: int) -> Iterator[None]:
    """`fd` closed for the test and put back after it: the next file opened gets it."""
    saved = os.dup(fd)
    os.close(fd)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


@pytest.fixture
def at_fd_zero() -> Iterator[None]:
    """Descriptor 0 free, as in a daemon or a workload started with stdin closed."""
    yield from descriptor_free(0)


@pytest.fixture
def at_fd_one() -> Iterator[None]:
    """Descriptor 1 free (an agent started with stdout closed)."""
    yield from descriptor_free(1)


def test_a_shard_on_descriptor_0_still_knows_when_it_left_the_spool(tmp_path: Path, at_fd_zero: object) -> None:
    w = spool.ShardWriter(str(tmp_path), 5, 6)
    assert w._fd == 0
    w.write(b"", [], **HEADER)
    assert w.intact()
    os.unlink(w.path)
    assert not w.intact(), "a deleted spool is noticed whatever the descriptor's number"
    w.close()


def test_a_readers_mark_on_descriptor_0_is_closed_and_removed(tmp_path: Path, at_fd_zero: object) -> None:
    mark = spool.ReaderMark(str(tmp_path))
    assert mark._fd == 0
    mark.close()
    assert os.listdir(tmp_path) == [] and mark._fd < 0


def test_the_files_of_a_mark_and_a_stack_dump_are_not_inherited_by_children(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    mark = spool.ReaderMark(str(tmp_path))
    assert fcntl.fcntl(mark._fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    mark.close()
    w = published(tmp_path)
    flags: list[int] = []
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: (flags.append(fcntl.fcntl(fd, fcntl.F_GETFD)),
                                                           real_fdopen(fd, *a, **k))[1])
    w.write_stacks("# x\n", lambda fh: None)
    assert len(flags) == 1 and flags[0] & fcntl.FD_CLOEXEC


def fixed_random(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(os, "urandom", lambda n: b"\xab" * n)
    return "reader-" + "ab" * 8 + ".lock"


def test_a_link_planted_at_a_marks_temporary_name_is_not_followed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    name = fixed_random(monkeypatch)
    target = tmp_path / "target"
    sp = tmp_path / "spool"
    sp.mkdir()
    (sp / (name + ".new")).symlink_to(target)
    with pytest.raises(FileExistsError):
        spool.ReaderMark(str(sp))
    assert not target.exists()


def test_a_mark_whose_rename_and_cleanup_both_fail_raises_the_first_error(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    name = fixed_random(monkeypatch)
    (tmp_path / name).mkdir()
    (tmp_path / name / "x").write_text("")  # a full directory at the final name: the rename fails
    real_unlink = os.unlink
    monkeypatch.setattr(os, "unlink", lambda p: (_ for _ in ()).throw(PermissionError(errno.EPERM, "no")))
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as e:
        spool.ReaderMark(str(tmp_path))
    assert e.value.errno in (errno.ENOTEMPTY, errno.EISDIR, errno.EEXIST), e.value
    assert set(os.listdir("/proc/self/fd")) == before, "its descriptor closed"
    monkeypatch.setattr(os, "unlink", real_unlink)


def test_a_mark_survives_its_file_failing_under_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mark = spool.ReaderMark(str(tmp_path))
    os.close(mark._fd)  # its descriptor gone (closed by someone else)
    mark.swept(5)  # nothing raised
    mark.close()  # nor here
    assert mark._fd < 0
    mark2 = spool.ReaderMark(str(tmp_path))
    monkeypatch.setattr(os, "unlink", lambda p: (_ for _ in ()).throw(PermissionError(errno.EPERM, "read-only")))
    mark2.close()  # the unlink refused: still closed
    assert mark2._fd < 0


def test_a_lock_or_a_spool_of_root_is_trusted_by_another_user(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    if not ROOT:
        pytest.skip("needs files owned by root")
    (tmp_path / "agent.lock").write_text("")
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setattr(os, "geteuid", lambda: 4321)  # this agent runs as uid 4321; the files are root's
    fd = spool.try_lock(str(tmp_path))
    assert fd is not None, "a lock file of root is used"
    os.close(fd)
    spool.check_dir(str(shared), private=False)  # a volume of root's
    os.chown(tmp_path / "agent.lock", 1, 1)
    os.chown(shared, 1, 1)
    said: list[str] = []
    fd = spool.try_lock(str(tmp_path), notice=said.append)
    assert fd is not None and said and "uid 1, which is not trusted" in said[0], "uid 1 is no one this agent trusts"
    os.close(fd)
    with pytest.raises(spool.SpoolError, match="belongs to uid 1, which is not trusted"):
        spool.check_dir(str(shared), private=False)


def test_a_relative_runtime_directory_is_not_used_even_where_it_would_resolve(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    (tmp_path / "run").chmod(0o700)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "run")
    assert spool.default_dir() == f"/tmp/outrider-spool-{ME}"


def test_live_readers_count_every_mark_past_what_they_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = [spool.ReaderMark(str(tmp_path)) for _ in range(10)]
    for i, m in enumerate(held):
        m.swept(1000 + i)
    for i in range(10):
        (tmp_path / f"reader-{i:016x}.lock").mkdir()  # not regular files: skipped, in scandir's (hash) order
    assert sorted(spool.live_readers(str(tmp_path))) == [1000 + i for i in range(10)]
    # marks that cannot be opened (gone between the listing and the open) are skipped, not the end of the list
    real_open = os.open
    refused = {os.path.basename(m.path) for m in held[:5]}
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (_ for _ in ()).throw(FileNotFoundError(2, "gone"))
                        if os.path.basename(str(p)) in refused else real_open(p, *a, **k))
    assert sorted(spool.live_readers(str(tmp_path))) == [1005 + i for i in range(5)]
    monkeypatch.setattr(os, "open", real_open)
    # a dead mark that another agent removes first: nothing raised, the others counted
    for i in range(10):
        (tmp_path / f"reader-{i:016x}.lock").rmdir()
        (tmp_path / f"reader-{i:016x}.lock").write_text("")
    real_unlink = os.unlink
    monkeypatch.setattr(os, "unlink", lambda p: (real_unlink(p), (_ for _ in ()).throw(FileNotFoundError(2, "x")))[1])
    assert sorted(spool.live_readers(str(tmp_path))) == [1000 + i for i in range(10)]
    monkeypatch.setattr(os, "unlink", real_unlink)
    assert not any((tmp_path / f"reader-{i:016x}.lock").exists() for i in range(10))
    for m in held:
        m.close()


def test_a_grown_capacity_rounds_up_to_whole_pages() -> None:
    assert spool.capacity_for(10, 4097, 1 << 20) == 8192
    assert spool.capacity_for(10, 4095, 1 << 20) == 4096
    assert spool.capacity_for(20 << 20, 60 << 10, 32 << 20) == 30 << 20, "60 KiB doubled 9 times"


def test_the_values_room_is_measured_in_8_byte_values(tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 5, 6)
    assert w.room_for(0, 19_660) == (spool.DIRECTORY_BYTES, spool.MAX_VALUES), "19,660 values + a quarter fit"
    assert w.room_for(0, 19_661) == (spool.DIRECTORY_BYTES, 2 * spool.MAX_VALUES)
    w.close()


def test_a_grown_writer_keeps_the_shared_mode(tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 5, 6, mode=0o640)
    w.write(b"", [], **HEADER)
    g = w.grown(spool.DIRECTORY_BYTES + 1, 0)
    g.write(b"", [], **HEADER)
    assert g.mode == 0o640 and stat.S_IMODE(os.stat(g.path).st_mode) == 0o640


def test_a_writer_whose_cleanup_fails_too_raises_the_first_error(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "posix_fallocate", lambda fd, o, n: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    real_unlink, real_close = os.unlink, os.close
    monkeypatch.setattr(os, "unlink", lambda p: (_ for _ in ()).throw(PermissionError(errno.EPERM, "no")))
    with pytest.raises(OSError) as e:
        spool.ShardWriter(str(tmp_path), 5, 6)
    assert e.value.errno == errno.ENOSPC
    monkeypatch.setattr(os, "unlink", real_unlink)

    def failing_close(fd: int) -> None:
        real_close(fd)
        raise OSError(errno.EIO, "I/O error on close")

    monkeypatch.setattr(os, "close", failing_close)
    with pytest.raises(OSError) as e:
        spool.ShardWriter(str(tmp_path), 5, 7)
    monkeypatch.setattr(os, "close", real_close)
    assert e.value.errno == errno.ENOSPC and not (tmp_path / "outrider-5-7.shard.new").exists()


def test_a_stack_dump_link_planted_after_the_old_dump_went_is_not_followed(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    w = published(tmp_path)
    target = tmp_path / "precious"
    target.write_text("kept")
    dump = spool.stacks_path(w.path)
    real_unlink = os.unlink

    def plant(p: str) -> None:
        try:
            real_unlink(p)
        finally:
            if str(p) == dump:
                os.symlink(target, dump)

    Path(dump).write_text("old")
    monkeypatch.setattr(os, "unlink", plant)
    with pytest.raises(FileExistsError):
        w.write_stacks("# x\n", lambda fh: fh.write("new"))
    assert target.read_text() == "kept"


def test_a_stack_dump_is_utf_8_whatever_the_locale(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import sys; from outrider.shared import spool\n"
            "w = spool.ShardWriter(sys.argv[1], 5, 6)\n"
            "w.write_stacks('# caf\\u00e9\\n', lambda fh: fh.write('\\u00e9t\\u00e9\\n'))\n")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env, timeout=60)
    assert (tmp_path / "outrider-5-6.stacks.txt").read_bytes() == "# café\nété\n".encode()


def test_the_reader_gives_back_descriptors_even_when_one_of_them_was_closed_under_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = [published(tmp_path, pid=p) for p in (1, 2, 3)]
    r = reader(tmp_path)
    r.read(ws[0].path)
    r.read(ws[1].path)
    os.close(r._fds[ws[0].path][2])  # closed by someone else
    real_open = os.open
    fails = [errno.EMFILE]
    monkeypatch.setattr(os, "open", lambda p, *a, **k: real_open(p, *a, **k) if not fails else (_ for _ in ()).throw(
        OSError(fails.pop(), "Too many open files")))
    assert r.read(ws[2].path) is not None
    assert list(r._fds) == [ws[1].path, ws[2].path]
    r.close()


def test_a_writer_mid_update_is_waited_for_and_then_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = published(tmp_path, values=[1.0])
    with open(w.path, "r+b") as fh:
        fh.seek(spool.SEQ_OFFSET)
        fh.write(struct.pack("<Q", 3))  # odd: the writer is updating it

    sleeps: list[float] = []

    def nap(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 3:  # the writer finishes
            w.write(directory(), [2.0], **HEADER)

    spool_time(monkeypatch, sleep=nap)
    snap = reader(tmp_path).read(w.path)
    assert snap is not None and snap.series[0][3] == [2.0] and sleeps == [0.0005] * 3


def test_a_file_grown_past_the_limit_between_lstat_and_open_is_too_large(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    w = published(tmp_path)
    after_lstat(monkeypatch, w.path, lambda: os.truncate(w.path, spool.MAX_SHARD_BYTES + 8))
    e = refusal(reader(tmp_path).read, w.path)
    assert (e.reason, str(e)) == ("too_large", f"{spool.MAX_SHARD_BYTES + 8} bytes: larger than the format allows")


def test_a_shard_that_cannot_be_stat_ed_once_open_is_closed_and_the_error_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = published(tmp_path)
    r = reader(tmp_path)
    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "fstat", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError) as e:
        r.read(w.path)
    monkeypatch.undo()
    assert e.value.errno == errno.EIO and not isinstance(e.value, spool.ShardFormatError)
    assert len(os.listdir("/proc/self/fd")) == before and r.open_count == 0


def test_a_long_rejection_is_cut_at_200_characters(tmp_path: Path) -> None:
    name = "a" * 300
    w = published(tmp_path, series=[[name, "summary", {}, 0, []]])
    snap = reader(tmp_path).read(w.path)
    assert snap is not None and snap.rejected == [f"{name}: unknown kind 'summary'"[:200]]


def test_a_writer_on_descriptor_0_closes_it(tmp_path: Path, at_fd_zero: object) -> None:
    w = spool.ShardWriter(str(tmp_path), 5, 6)
    w.write(b"", [], **HEADER)
    assert w._fd == 0
    w.close()
    with pytest.raises(OSError):
        os.fstat(0)


def test_a_writer_closes_whatever_its_cleanup_meets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = published(tmp_path)
    real_close = os.close

    def failing_close(fd: int) -> None:
        real_close(fd)
        raise OSError(errno.EIO, "I/O error on close")

    monkeypatch.setattr(os, "close", failing_close)
    w.close()  # nothing raised
    monkeypatch.setattr(os, "close", real_close)
    assert w._fd < 0
    pending = spool.ShardWriter(str(tmp_path), 5, 6)
    monkeypatch.setattr(os, "unlink", lambda p: (_ for _ in ()).throw(PermissionError(errno.EPERM, "no")))
    pending.close()  # the abandoned file cannot be removed: nothing raised
    monkeypatch.undo()
    assert (tmp_path / "outrider-5-6.shard.new").exists()


def test_a_shard_not_kept_is_closed_after_its_read_whatever_its_descriptor(tmp_path: Path, at_fd_one: object) -> None:
    kept = published(tmp_path, pid=1)
    other = published(tmp_path, pid=2)
    r = reader(tmp_path, max_open=1)
    os.close(kept._fd), os.close(other._fd)  # the writers' descriptors out of the way (1 is free again)
    kept._fd = other._fd = -1
    os.dup2(2, 1)  # 1 taken while the first shard is opened and kept...
    assert r.read(kept.path) is not None and r._fds[kept.path][2] != 1
    os.close(1)  # ...and free for the second, which is not kept
    assert r.read(other.path) is not None and list(r._fds) == [kept.path]
    with pytest.raises(OSError):
        os.fstat(1)  # closed after its read
    r.close()


def test_a_descriptor_budget_is_a_whole_number(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    for soft, budget in ((4094, 1023), (33, 8), (4095, 1023), (4099, 1024), (10**9, 1024)):
        monkeypatch.setattr(resource, "getrlimit", lambda which, soft=soft: (soft, soft))
        got = spool.open_budget()
        assert got == budget and type(got) is int, soft
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert spool.open_budget() == spool.MAX_OPEN_SHARDS


def test_a_label_name_that_is_not_utf8_says_so() -> None:
    assert entry_error(["x", "counter", {"\udce9": "v"}, 0, []]) == "x: a label name is not valid UTF-8"


def test_a_shard_named_for_pid_0_is_asked_about_pid_0(tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 0, 1)
    w.write(b"", [], **HEADER)  # its header claims 4242
    e = refusal(reader(tmp_path, trusted=lambda uid, pid: pid != 0).read, w.path)
    assert e.reason == "untrusted"


def test_a_rejected_file_that_went_is_no_longer_counted(tmp_path: Path) -> None:
    bad = tmp_path / "outrider-1-1.shard"
    bad.write_bytes(b"x" * 200)
    r = reader(tmp_path)
    refusal(r.read, str(bad))
    assert r.rejected() == {"corrupt": 1}
    bad.unlink()
    assert r.read(str(bad)) is None and r.rejected() == {}, "before the next listing"


def test_at_most_65536_rejected_files_are_remembered(tmp_path: Path) -> None:
    r = reader(tmp_path)
    dummy = (spool.identity(os.lstat(tmp_path)), spool.ShardFormatError("x"), time.monotonic())
    r._rejected.update({f"/nowhere/{i}": dummy for i in range(spool.MAX_REJECTED - 2)})
    files = []
    for i in range(3):
        f = tmp_path / f"outrider-{i}-1.shard"
        f.write_bytes(b"x" * 200)
        files.append(str(f))
    refusal(r.read, files[0])
    refusal(r.read, files[1])
    assert len(r._rejected) == spool.MAX_REJECTED == 65_536
    refusal(r.read, files[2])
    assert files[2] not in r._rejected, "full: examined again at every read"
    assert type(refusal(r.read, files[2])) is spool.ShardFormatError
    # one remembered already is still updated when full
    Path(files[1]).write_bytes(b"x" * 10)
    assert refusal(r.read, files[1]).reason == "truncated"
    again = refusal(r.read, files[1])
    assert (type(again), again.reason) == (spool.ShardRejected, "truncated")


def test_a_read_that_fails_lets_go_of_the_descriptor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = published(tmp_path)
    r = reader(tmp_path)
    assert r.read(w.path) is not None and r.open_count == 1
    monkeypatch.setattr(os, "pread", lambda fd, n, o: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError) as e:
        r.read(w.path)
    monkeypatch.undo()
    assert e.value.errno == errno.EIO and r.open_count == 0 and r.rejected() == {}


def test_forgetting_a_descriptor_closed_under_the_reader_raises_nothing(tmp_path: Path) -> None:
    w = published(tmp_path)
    r = reader(tmp_path)
    r.read(w.path)
    os.close(r._fds[w.path][2])
    r.forget(w.path)
    assert r.open_count == 0


def test_a_writer_of_the_largest_shard_the_format_allows(tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 5, 6, directory_capacity=spool.MAX_DIRECTORY_BYTES,
                          value_capacity=spool.MAX_DATA_BYTES // 8)
    assert w.shard_bytes == spool.MAX_SHARD_BYTES
    w.close()
    assert os.listdir(tmp_path) == []
