"""The spool: the one contract between the hook (the writer, in the workload) and the agent (the reader).

Everything both sides must agree on lives here: the directory and its safety checks, the shard format, the writer,
the reader, the agent lock and the stack-dump files. Standard library only: the hook imports this module into
the user's process. docs/spool-format.md describes the same contract for other readers.

Shard layout, little-endian, created 0600 as ``outrider-<pid>-<start_ns>.shard``, SHARD_BYTES long at first:

    offset  size  field
    0       8     magic b"OUTRSHD1"
    8       4     format version (u32): 2 once regrown, 1 in the first layout (a 60 KiB directory, data at
                  65536: what version 1 fixed; its fields from 80 are ignored there, so an older agent reads it);
                  a reader skips (and counts) shards of a newer version
    12      4     flags (u32): 1 = closed (the process finished and flushed), 2 = stalled
    16      8     seq (u64): even when the shard is consistent; odd while the writer updates it (a seqlock)
    24      4     pid (u32)
    28      4     stall count (u32)
    32      8     start time, unix ns
    40      8     heartbeat, unix ns (written every flush, about once a second)
    48      8     last completed step, unix ns (0: none yet)
    56      8     steps completed (u64)
    64      4     directory length in bytes (u32)
    68      4     values in the data area (u32)
    72      8     stalled since, unix ns (0: not stalled)
    80      4     generation (u32): 0 for the first file, +1 each time the shard was regrown
    84      4     directory capacity in bytes (u32)
    88      8     data offset (u64): where the data area starts, a multiple of 8, after the directory's capacity
    96      8     shard size in bytes (u64): the size the file was created with, at most MAX_SHARD_BYTES
    104..4095     reserved (zero)
    4096          directory: UTF-8 JSON {"meta": {...}, "series": [[name, kind, labels, offset, bounds], ...]}
    data offset   data: float64 values; a counter or gauge takes one, a histogram len(bounds) + 2
                  (bucket counts, the last for +Inf, then the sum)

A shard grows: when a process's directory or values outgrow their space, the writer creates a larger file
(next generation, capacities doubled as needed), writes it whole and renames it over the shard, so a reader sees
either the old file or the new one complete. Past MAX_SHARD_BYTES the series that do not fit are left out
(the hook counts them); the header (heartbeat, steps, stall) is written whatever happens.

Why it is safe for both sides:
- The writer never maps the file. Its blocks are reserved up front (posix_fallocate) and it writes with pwrite,
  so a full volume is an OSError the hook counts, never a SIGBUS in the workload.
- The reader never maps a file either: it copies with pread under the seqlock and validates every field, so a
  shard truncated, grown or rewritten under it is a format error for that shard only.
- The reader's descriptors are bounded whatever the spool holds: what the name and lstat already rule out (not a
  regular file, writable by others, an untrusted owner, too small or too large) is never opened; a file found
  invalid is closed at once and, while it stays the same file (inode, size, times, owner, mode), not opened again
  (looked at again once a minute); the descriptors of good shards are kept up to open_budget() (a quarter of the
  soft descriptor limit, at most MAX_OPEN_SHARDS), the rest opened for each read; on EMFILE or ENFILE it closes
  the older half of those it keeps and retries once, then opens nothing more until the next listing (the next
  sweep).
- Every file is opened with O_NOFOLLOW (new ones also O_EXCL); the reader accepts only regular files owned by a
  uid it trusts, and stack dumps only from the shard's owner, so planted symlinks or files are never followed,
  read or sent anywhere.
- A lock file (agent.lock, spawn.lock) that no process holds and that is not ours to use (a link, not a regular
  file, a file of an untrusted uid: planted by another user, it would keep every agent out) is replaced by one of
  ours, flocked before it is renamed over it, under a flock of the directory (try_lock); LockRefused says why where
  the directory does not allow it (sticky, someone else's). A lock a live process holds counts, whoever's it is.
- The default directory is private (0700, owned by the user, not a symlink; files 0600); an explicitly configured
  one (a pod's shared volume) must not be a symlink and must be owned by the user, root or a trusted uid, and its
  files are readable by the directory's group (setgid, e.g. Kubernetes' fsGroup) or else by all, so a sidecar of
  another uid can read them; they are never writable by anyone but their owner.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import itertools
import json
import math
import os
import re
import stat
import struct
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from outrider.shared import prometheus_names, sketch
from outrider.shared.sketch import Sketch

MAGIC = b"OUTRSHD1"
VERSION = 2
HEADER_BYTES = 4096
# The first file's layout (and version 1's fixed one): a 60 KiB directory and 24 Ki values, 256 KiB in all.
DIRECTORY_BYTES = 60 * 1024
DATA_OFFSET = HEADER_BYTES + DIRECTORY_BYTES
MAX_VALUES = 24 * 1024
SHARD_BYTES = DATA_OFFSET + 8 * MAX_VALUES  # 256 KiB
# How far a shard may grow. 2,000 series (the hook's cap per process) of ten 128-character labels take about
# 3.5 MiB of directory, and histograms of 27 bounds about 0.5 MiB of data: the limits leave room for several
# times that, and bound what a reader copies from one file.
MAX_DIRECTORY_BYTES = 32 * 1024 * 1024
MAX_DATA_BYTES = 16 * 1024 * 1024
MAX_SHARD_BYTES = HEADER_BYTES + MAX_DIRECTORY_BYTES + MAX_DATA_BYTES
STACKS_MAX_BYTES = 1024 * 1024  # a stack dump larger than this is cut when read

FLAG_CLOSED = 1
FLAG_STALLED = 2

LOCK_NAME = "agent.lock"
READER_NAME_RE = re.compile(r"reader-[0-9a-f]{16}\.lock")  # an agent reading a spool another agent owns
# The exit status of an agent started for the spool (outrider/commands/standalone.py, by hook/election.py) that found
# LOCK_NAME held: another agent serves the spool, not a failure.
EXIT_ANOTHER_AGENT = 3
SHARD_SUFFIX = ".shard"
STACKS_SUFFIX = ".stacks.txt"
SHARD_NAME_RE = re.compile(r"outrider-(\d+)-(\d+)\.shard")
PENDING_NAME_RE = re.compile(r"outrider-(\d+)-(\d+)\.shard\.new")  # a shard (generation) not yet renamed

_HEAD = struct.Struct("<8sIIQIIQQQQIIQ")  # through offset 80 (version 1's whole header)
_LAYOUT = struct.Struct("<IIQQ")  # offsets 80..104: generation, directory capacity, data offset, shard size
HEAD_BYTES = _HEAD.size + _LAYOUT.size
_SEQ = struct.Struct("<Q")
SEQ_OFFSET = 16

# What a series in a shard may be named and labelled (name_refusal, label_refusal): Prometheus's grammar, neither a
# name nor a label Prometheus keeps for itself (up, ALERTS, __*: outrider/shared/prometheus_names.py), and the labels
# the agent adds itself (rank, training_job) or that a histogram owns (le, quantile) kept out of the workload's hands.
RESERVED_LABELS = frozenset({"rank", "training_job", "le", "quantile"})
KINDS = ("counter", "gauge", "histogram")
MAX_LABEL_VALUE = 128

MAX_OPEN_SHARDS = 1024  # shard descriptors a reader keeps open at most (fewer under a low descriptor limit)
RECHECK_S = 60.0  # a file rejected unchanged is looked at again after this long (its owner's process may appear)
MAX_REJECTED = 65_536  # rejected files remembered (beyond, they are examined again at every read)

_OPEN_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


# --- errors -------------------------------------------------------------------------------------------------------

class SpoolError(OSError):
    """A spool directory that fails the safety checks (a symlink, someone else's, open to other users)."""


class ShardFormatError(ValueError):
    """A shard that cannot be read. `reason` is what the agent counts it as."""

    reason = "corrupt"


class ShardTruncated(ShardFormatError):
    reason = "truncated"


class ShardNewerVersion(ShardFormatError):
    reason = "newer_version"


class ShardBusy(ShardFormatError):
    reason = "busy"


class ShardUntrusted(ShardFormatError):
    reason = "untrusted"


class ShardNotRegular(ShardFormatError):
    reason = "not_regular"  # a symbolic link, a FIFO, a directory, a socket or a device named like a shard


class ShardBadMode(ShardFormatError):
    reason = "bad_mode"  # writable by others than its owner: a writer never makes one


class ShardTooLarge(ShardFormatError):
    reason = "too_large"


class ShardRejected(ShardFormatError):
    """A file the reader rejected before, unchanged since: not opened again. `reason` is the first rejection's."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# --- the directory ------------------------------------------------------------------------------------------------

def default_dir() -> str:
    """The private per-user spool: in the runtime directory when there is a usable one, else in /tmp."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        try:
            st = os.lstat(runtime)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
                return os.path.join(runtime, "outrider-spool")
        except OSError:
            pass
    return f"/tmp/outrider-spool-{os.geteuid()}"


def prepare_dir(path: str, *, private: bool, trusted_uids: frozenset[int] = frozenset()) -> str:
    """Create the spool directory if needed (0700) and check it is safe to use (check_dir)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        if private:
            raise
        os.makedirs(path, 0o700, exist_ok=True)
    check_dir(path, private=private, trusted_uids=trusted_uids)
    return path


def check_dir(path: str, *, private: bool, trusted_uids: frozenset[int] = frozenset()) -> None:
    """SpoolError when the directory is not safe to use, saying why.

    private (the default spool): a directory owned by this user that no one else can enter. Otherwise (a
    configured spool, such as a pod's shared emptyDir that the workload and the sidecar write as different users):
    not a symlink, a directory, owned by this user, root or a trusted uid; other users may be able to write in it,
    which the per-file rules (O_EXCL, O_NOFOLLOW, owner checks) make harmless. FileNotFoundError when it is not
    there.
    """
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise SpoolError(errno.ELOOP, f"spool {path} is a symbolic link: refused (set spool_dir to a real "
                                      "directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, f"spool {path} is not a directory")
    me = os.geteuid()
    if private:
        if st.st_uid != me:
            raise SpoolError(errno.EPERM, f"spool {path} belongs to uid {st.st_uid}, not to this user ({me}): "
                                          "refused (someone else created it; remove it or set spool_dir)")
        if st.st_mode & 0o077:
            raise SpoolError(errno.EPERM, f"spool {path} is open to other users (mode {st.st_mode & 0o777:o}): "
                                          "refused (chmod 700 it, or set spool_dir)")
    elif st.st_uid not in trusted_uids | {me, 0}:
        raise SpoolError(errno.EPERM, f"spool {path} belongs to uid {st.st_uid}, which is not trusted: refused "
                                      "(add it to spool_trusted_uids if it should be)")


PRIVATE_FILE_MODE = 0o600


class LockRefused(SpoolError):
    """A lock file that is not this user's to use (a symbolic link, not a regular file, or a file of a uid it does
    not trust) that no process holds, and that this user cannot replace (a sticky directory of someone else's)."""


def try_lock(spool_dir: str, name: str = LOCK_NAME, *, trusted_uids: frozenset[int] = frozenset(),
             mode: int = PRIVATE_FILE_MODE, notice: Callable[[str], None] | None = None) -> int | None:
    """Take one of the spool's locks (the agent's, by default) without blocking; the fd holds it. None: another
    process holds it (whoever's the file is: a sidecar may run as any uid).

    A lock file nobody holds that is not ours to use (a link, a FIFO, a file of a uid other than this user, root and
    trusted_uids: planted by another user of a shared spool, which would keep every agent out of it) is replaced by
    one of ours, and `notice` told why; LockRefused (an OSError) when it cannot be replaced. The file is created with
    `mode` (a shared spool's: readable, so that agents of other uids can probe it)."""
    path = os.path.join(spool_dir, name)
    trusted = trusted_uids | {os.geteuid(), 0}
    try:
        fd = _open_lock(path, mode)
    except _Planted as planted:
        return _replace_lock(spool_dir, path, planted, mode, notice)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Planted(f"not a regular file (mode {st.st_mode:o})", identity(os.lstat(path)))
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except _Planted as planted:
        os.close(fd)
        return _replace_lock(spool_dir, path, planted, mode, notice)
    except OSError:
        os.close(fd)
        return None  # held: a live process has it
    if st.st_uid in trusted:
        return fd
    os.close(fd)  # nobody held it, but it is a stranger's file: not used
    return _replace_lock(spool_dir, path, _Planted(f"owned by uid {st.st_uid}, which is not trusted", identity(st)),
                         mode, notice)


class _Planted(Exception):
    """A lock file not ours to use: why, and the file (its identity) as it was found."""

    def __init__(self, why: str, found: Identity | None) -> None:
        super().__init__(why)
        self.why, self.found = why, found


def _open_lock(path: str, mode: int) -> int | None:
    """The lock file opened (created if missing, never through a link), read-write or, another uid's, read-only
    (flock needs no write access); None where another uid's file of a trusted owner cannot even be opened (taken
    as held, as before files were readable); _Planted for a file not ours to use."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENXIO):
            raise
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None  # gone meanwhile: looked at again next time
    if stat.S_ISLNK(found.st_mode):
        raise _Planted("a symbolic link", identity(found))
    if not stat.S_ISREG(found.st_mode):
        raise _Planted(f"not a regular file (mode {found.st_mode:o})", identity(found))
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM):
            raise
    # Another uid's file this user cannot open (an agent of an older version made its lock 0600): the kernel's
    # table of locks says whether a process holds it; where that cannot be read, it is taken as held, as before.
    if _listed_in_proc_locks(found) is not False:
        return None
    raise _Planted(f"owned by uid {found.st_uid} and not readable by this user", identity(found))


def _listed_in_proc_locks(st: os.stat_result, proc_locks: str = "/proc/locks") -> bool | None:
    """Whether a lock on the file is listed in /proc/locks (its processes in this PID namespace: a sidecar sharing the
    pod's, a node agent on the host's); None when the table cannot be read."""
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open(proc_locks, "rb") as fh:
            text = fh.read(4 << 20).decode("ascii", "replace")
    except OSError:
        return None
    return any(key in line.split() for line in text.splitlines())


def _replace_lock(spool_dir: str, path: str, planted: _Planted, mode: int,
                  notice: Callable[[str], None] | None) -> int | None:
    """Replace a planted lock file with one of ours, flocked before it is renamed over it, so no process ever finds
    ours free. Replacements are made under a flock of the directory, and only while the name still holds the file
    found planted: two processes never both replace it (the second finds ours, held or trusted). None: another
    process is replacing it now, or the name changed meanwhile (looked at again next time)."""
    dfd = os.open(spool_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None
        try:
            now: Identity | None = identity(os.lstat(path))
        except FileNotFoundError:
            now = None
        if now != planted.found:
            return None
        made = f"{path}.{os.urandom(8).hex()}.new"
        fd = os.open(made, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(made, path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(made)
            os.close(fd)
            raise LockRefused(e.errno or errno.EPERM,
                              f"{path} is {planted.why}, and no process holds it, so no agent can own this spool; "
                              f"it cannot be replaced ({e.strerror or e}): remove it, or set spool_dir to a "
                              "directory of this user's") from None
    finally:
        os.close(dfd)
    if notice is not None:
        notice(f"{path} was {planted.why}, and no process held it (planted by another user?): replaced with one of "
               "this user's")
    return fd



def shared_file_mode(spool_dir: str) -> int:
    """The mode of files in a configured, shared spool: the agent reading them may run as another uid (a sidecar),
    so they are readable by the directory's group when it passes one on (setgid: Kubernetes' fsGroup), else by
    all. Never writable by anyone but their owner."""
    try:
        return 0o640 if os.stat(spool_dir).st_mode & stat.S_ISGID else 0o644
    except OSError:
        return PRIVATE_FILE_MODE


def shard_path(spool_dir: str, pid: int, start_ns: int) -> str:
    return os.path.join(spool_dir, f"outrider-{pid}-{start_ns}{SHARD_SUFFIX}")


def stacks_path(path_of_shard: str) -> str:
    return path_of_shard[: -len(SHARD_SUFFIX)] + STACKS_SUFFIX


# --- several agents on one spool ----------------------------------------------------------------------------------
# The agent holding agent.lock owns the spool's cleanup; every other agent reading it (a sidecar beside a node agent,
# `outrider run` beside an agent) holds a mark, reader-<random>.lock, flocked while it lives, whose mtime says when
# its last completed sweep started. The owner deletes a finished process's shard only once every live mark says a
# sweep started after the owner saw it finished (so each agent has read its final values), or after
# READER_GRACE_S (a reader that no longer sweeps).

READER_GRACE_S = 600.0
MAX_READERS = 64  # marks looked at; more (planted ones, say) are ignored


class ReaderMark:
    """This agent's mark as a reader of a spool another agent owns. OSError when it cannot be made."""

    def __init__(self, spool_dir: str, mode: int = PRIVATE_FILE_MODE) -> None:
        self.path = os.path.join(spool_dir, f"reader-{os.urandom(8).hex()}.lock")
        # Made whole (locked, "no sweep yet") under another name, then renamed: an owner never finds it unlocked.
        made = self.path + ".new"
        self._fd = os.open(made, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            os.fchmod(self._fd, mode)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.utime(self._fd, ns=(0, 0))  # no sweep yet: the owner waits for this reader's first
            os.rename(made, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(made)
            os.close(self._fd)
            self._fd = -1
            raise

    def swept(self, started_ns: int) -> None:
        """A sweep that started at started_ns (unix ns) is complete."""
        with contextlib.suppress(OSError):
            os.utime(self._fd, ns=(started_ns, started_ns))

    def intact(self) -> bool:
        """Whether the mark is still where the owner looks (the spool was not deleted or remounted)."""
        try:
            st, fst = os.lstat(self.path), os.fstat(self._fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)

    def close(self) -> None:
        if self._fd < 0:
            return
        if self.intact():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = -1


def live_readers(spool_dir: str) -> list[int]:
    """When the last completed sweep of each other agent reading the spool started (unix ns; 0: none yet); a mark
    nobody holds (its agent is gone) is removed. A mark of any user counts (a sidecar may run as any uid): one
    planted and held by a stranger can only hold deletion back, for READER_GRACE_S at most. Only regular files
    count, never followed, at most MAX_READERS."""
    try:
        with os.scandir(spool_dir) as it:
            names = [e.name for e in it if READER_NAME_RE.fullmatch(e.name)][:MAX_READERS]
    except (FileNotFoundError, NotADirectoryError):
        return []
    out: list[int] = []
    for name in names:
        path = os.path.join(spool_dir, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                continue
            fd = os.open(path, _OPEN_READ)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # held: its agent lives
            out.append(os.fstat(fd).st_mtime_ns)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
        finally:
            os.close(fd)
    return out


# --- the header ---------------------------------------------------------------------------------------------------

@dataclass
class ShardHeader:
    version: int
    flags: int
    seq: int
    pid: int
    stalls: int
    start_ns: int
    heartbeat_ns: int
    last_step_ns: int
    steps: int
    directory_len: int
    value_count: int
    stalled_since_ns: int
    generation: int = 0
    directory_capacity: int = DIRECTORY_BYTES
    data_offset: int = DATA_OFFSET
    shard_bytes: int = SHARD_BYTES


SeriesEntry = tuple[str, str, dict[str, str], list[float], tuple[float, ...]]  # name, kind, labels, values, bounds


@dataclass
class ShardSnapshot:
    header: ShardHeader
    meta: dict[str, Any]
    series: list[SeriesEntry] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # why entries were left out (one reason per entry)
    # the log-bucketed sketches of duration histograms, by their index in `series` (a bad one left out alone)
    sketches: dict[int, Sketch] = field(default_factory=dict)
    uid: int = -1
    identity: Identity | None = None  # the file it was read from, as lstat saw it before reading


def pack_header(*, flags: int, seq: int, pid: int, stalls: int, start_ns: int, heartbeat_ns: int,
                last_step_ns: int, steps: int, directory_len: int, value_count: int, stalled_since_ns: int,
                generation: int = 0, directory_capacity: int = DIRECTORY_BYTES, data_offset: int = DATA_OFFSET,
                shard_bytes: int = SHARD_BYTES) -> bytes:
    # A shard in the first layout says version 1 (its fields from 80 were reserved there, and an older agent reads
    # it as before); only a regrown one needs version 2, which an older agent skips and counts.
    first = (directory_capacity, data_offset, shard_bytes) == (DIRECTORY_BYTES, DATA_OFFSET, SHARD_BYTES)
    return _HEAD.pack(MAGIC, 1 if first else VERSION, flags, seq, pid & 0xFFFFFFFF, stalls & 0xFFFFFFFF, start_ns,
                      heartbeat_ns, last_step_ns, steps, directory_len, value_count, stalled_since_ns) + \
        _LAYOUT.pack(generation, directory_capacity, data_offset, shard_bytes)


def read_header(buf: bytes) -> ShardHeader:
    """The header, validated: the layout it claims must fit the format's limits and itself (nothing in it is
    trusted; the reader also checks it against the file's real size)."""
    if len(buf) < _HEAD.size:
        raise ShardTruncated(f"truncated: {len(buf)} bytes, the header needs {_HEAD.size}")
    fields = _HEAD.unpack_from(buf, 0)
    if fields[0] != MAGIC:
        raise ShardFormatError("not an Outrider shard (bad magic)")
    header = ShardHeader(*fields[1:])
    if header.version > VERSION:
        raise ShardNewerVersion(f"format version {header.version} is newer than this agent's {VERSION}")
    if header.version >= 2:
        if len(buf) < HEAD_BYTES:
            raise ShardTruncated(f"truncated: {len(buf)} bytes, the header needs {HEAD_BYTES}")
        (header.generation, header.directory_capacity, header.data_offset,
         header.shard_bytes) = _LAYOUT.unpack_from(buf, _HEAD.size)
        if not (header.directory_capacity <= MAX_DIRECTORY_BYTES
                and HEADER_BYTES + header.directory_capacity <= header.data_offset
                and header.data_offset % 8 == 0 and header.shard_bytes <= MAX_SHARD_BYTES
                and header.data_offset <= header.shard_bytes):
            raise ShardFormatError("corrupt: the layout does not fit the format")
    max_values = (header.shard_bytes - header.data_offset) // 8
    if header.directory_len > header.directory_capacity or header.value_count > max_values:
        raise ShardFormatError("corrupt: directory or data larger than the format allows")
    return header


def capacity_for(needed: int, have: int, limit: int) -> int:
    """The space to give `needed` bytes, `have` being today's: doubled until it leaves a quarter spare (so a
    process growing one series at a time regrows rarely), in 4 KiB pages, at most `limit`."""
    size = max(have, 4096)
    while size < needed + needed // 4 and size < limit:
        size *= 2
    return min(limit, -(-size // 4096) * 4096)


# --- the writer (the hook) ----------------------------------------------------------------------------------------

class ShardWriter:
    """One process's shard (one generation of it). Creating it reserves all its blocks, so later writes cannot
    meet a full volume; any OSError (creation on a full or read-only volume, a write error) reaches the caller,
    which counts it. `grown()` makes the next, larger generation."""

    def __init__(self, spool_dir: str, pid: int, start_ns: int, mode: int = PRIVATE_FILE_MODE, *,
                 directory_capacity: int = DIRECTORY_BYTES, value_capacity: int = MAX_VALUES, generation: int = 0,
                 seq: int = 0) -> None:
        self.spool_dir, self.pid, self.start_ns = spool_dir, pid, start_ns
        self.path = shard_path(spool_dir, pid, start_ns)
        self.mode = mode
        self.generation = generation
        self.directory_capacity = directory_capacity
        self.data_offset = HEADER_BYTES + -(-directory_capacity // 8) * 8
        self.value_capacity = value_capacity
        self.shard_bytes = self.data_offset + 8 * value_capacity
        if directory_capacity > MAX_DIRECTORY_BYTES or self.shard_bytes > MAX_SHARD_BYTES:
            raise ValueError("a shard larger than the format allows")
        # Written under a temporary name and renamed after the first complete write: a reader never sees a shard
        # whose header is not there yet, nor a regrown one half written.
        self._pending: str | None = self.path + ".new"
        try:
            self._fd = os.open(self._pending, _OPEN_NEW, mode)
        except FileExistsError:  # ours, left by a creation that failed half-way: the name is this process's
            os.unlink(self._pending)
            self._fd = os.open(self._pending, _OPEN_NEW, mode)
        try:
            os.fchmod(self._fd, mode)  # exactly this mode, whatever the umask
            os.posix_fallocate(self._fd, 0, self.shard_bytes)
        except OSError:
            self._discard()
            raise
        self._seq = seq + (seq & 1)
        self._directory = b""

    def _discard(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        if self._pending is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._pending)
        self._fd = -1

    def fits(self, directory_len: int, value_count: int) -> bool:
        return directory_len <= self.directory_capacity and value_count <= self.value_capacity

    def room_for(self, directory_len: int, value_count: int) -> tuple[int, int]:
        """The directory and value capacities a next generation would have for this directory and these values
        (as far as the format allows; the same as today's when it cannot grow)."""
        return (capacity_for(directory_len, self.directory_capacity, MAX_DIRECTORY_BYTES),
                capacity_for(8 * value_count, 8 * self.value_capacity, MAX_DATA_BYTES) // 8)

    def grown(self, directory_len: int, value_count: int) -> ShardWriter:
        """The next generation, with room for this directory and these values (as far as the format allows):
        a new file, renamed over this one by its first write. OSError when it cannot be created."""
        directory_capacity, value_capacity = self.room_for(directory_len, value_count)
        return ShardWriter(self.spool_dir, self.pid, self.start_ns, self.mode,
                           directory_capacity=directory_capacity, value_capacity=value_capacity,
                           generation=self.generation + 1, seq=self._seq)

    def intact(self) -> bool:
        """Whether the shard is still where readers look for it: False when it (or the whole spool) was deleted,
        replaced, or hidden by a volume mounted over the spool."""
        if self._pending is not None or self._fd < 0:
            return True  # not published yet: the next write creates the name
        try:
            st = os.lstat(self.path)
            fst = os.fstat(self._fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)

    def write(self, directory: bytes, values: list[float], **header: int) -> None:
        """Publish one consistent state. ValueError when it does not fit this file (the caller grows it or
        leaves series out)."""
        if not self.fits(len(directory), len(values)):
            raise ValueError("shard full")
        fd = self._fd
        self._seq += 1  # odd: writing
        os.pwrite(fd, _SEQ.pack(self._seq), SEQ_OFFSET)
        if directory != self._directory:
            os.pwrite(fd, directory, HEADER_BYTES)
            self._directory = directory
        if values:
            data = array.array("d", values)
            if sys.byteorder != "little":
                data.byteswap()
            os.pwrite(fd, data.tobytes(), self.data_offset)
        self._seq += 1  # even: consistent, written last together with the header
        os.pwrite(fd, pack_header(seq=self._seq, directory_len=len(directory), value_count=len(values),
                                  generation=self.generation, directory_capacity=self.directory_capacity,
                                  data_offset=self.data_offset, shard_bytes=self.shard_bytes, **header), 0)
        if self._pending is not None:
            os.rename(self._pending, self.path)
            self._pending = None

    def write_stacks(self, first_line: str, dump: Callable[[TextIO], None]) -> str:
        """The stack dump beside the shard, replacing this process's previous one; never follows a link."""
        path = stacks_path(self.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, self.mode)
        os.fchmod(fd, self.mode)
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(first_line)
            fh.flush()
            dump(fh)
        return path

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        if self._pending is not None:  # never published (a growth abandoned): leave no stray file
            with contextlib.suppress(OSError):
                os.unlink(self._pending)
            self._pending = None


# --- the reader (the agent) ---------------------------------------------------------------------------------------

def open_budget() -> int:
    """How many shard descriptors a reader keeps open: a quarter of the soft descriptor limit (the rest is the
    agent's: its sockets, /proc, connections), at least 8, at most MAX_OPEN_SHARDS."""
    import resource  # only the reader needs it, never the hook's writer

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return MAX_OPEN_SHARDS
    return max(8, min(MAX_OPEN_SHARDS, soft // 4))


Identity = tuple[int, int, int, int, int, int, int]  # dev, inode, size, mtime, ctime (ns), mode, uid


def identity(st: os.stat_result) -> Identity:
    """What changes when a file in the spool is rewritten, replaced, chowned or chmodded."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid


def _name_pid(path: str) -> int:
    m = SHARD_NAME_RE.fullmatch(os.path.basename(path))
    return int(m.group(1)) if m else -1


class ShardReader:
    """Reads shards without trusting them. `trusted(uid, pid)` says whether a shard owned by uid that claims pid
    may be read; copies are taken with pread under the seqlock and every field is validated.

    Bounded in descriptors whatever the spool holds (planted junk included): see the module's docstring. A file
    rejected once raises ShardRejected (never opened) while it stays the same file, so a caller counts each bad
    file once. `max_open` is how many descriptors are kept (open_budget() by default)."""

    def __init__(self, spool_dir: str, trusted: Callable[[int, int], bool], max_open: int | None = None) -> None:
        self.spool_dir = spool_dir
        self.trusted = trusted
        self.max_open = max_open or open_budget()
        self._fds: OrderedDict[str, tuple[int, int, int]] = OrderedDict()  # path -> (dev, ino, fd), oldest first
        self._directories: dict[str, tuple[bytes, tuple[dict[str, Any], list[Any], list[Any]]]] = {}
        self._rejected: dict[str, tuple[Identity, ShardFormatError, float]] = {}  # path -> (file, why, when)
        self._starved = False  # out of descriptors even after closing half of ours: no new opens this listing

    @property
    def open_count(self) -> int:
        """Shard descriptors held now (at most max_open)."""
        return len(self._fds)

    def rejected(self) -> dict[str, int]:
        """Files in the spool the reader rejects now, by reason (as of the last listing)."""
        out: dict[str, int] = {}
        for _, error, _ in self._rejected.values():
            out[error.reason] = out.get(error.reason, 0) + 1
        return out

    def paths(self) -> list[str]:
        """Shard files in the spool, by name (a missing spool directory has none). What the reader holds for a
        name no longer listed (a descriptor, a cached directory, a rejection) is let go."""
        try:
            with os.scandir(self.spool_dir) as it:
                names = [e.name for e in it if SHARD_NAME_RE.fullmatch(e.name)]
        except (FileNotFoundError, NotADirectoryError):
            names = []
        paths = [os.path.join(self.spool_dir, n) for n in sorted(names)]
        listed = set(paths)
        for path in [p for p in (*self._fds, *self._directories, *self._rejected) if p not in listed]:
            self.forget(path)
            self._rejected.pop(path, None)
        self._starved = False
        return paths

    def pending(self) -> list[tuple[str, int, int]]:
        """Shards being written under their temporary name, as (path, pid, start_ns): a process killed between
        creating one and renaming it leaves it behind."""
        try:
            with os.scandir(self.spool_dir) as it:
                found = [(e.path, PENDING_NAME_RE.fullmatch(e.name)) for e in it]
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [(path, int(m.group(1)), int(m.group(2))) for path, m in found if m]

    def identity(self, path: str) -> Identity | None:
        """The file now at path (lstat, never opened); None when there is none."""
        try:
            return identity(os.lstat(path))
        except OSError:
            return None

    def _vet(self, path: str, st: os.stat_result) -> None:
        """What lstat tells without opening the file: ShardFormatError when it cannot be a shard to read."""
        if not stat.S_ISREG(st.st_mode):
            raise ShardNotRegular(f"not a regular file (mode {st.st_mode:o})")
        if st.st_mode & 0o022:
            raise ShardBadMode(f"writable by others than its owner (mode {stat.S_IMODE(st.st_mode):o})")
        if st.st_size > MAX_SHARD_BYTES:
            raise ShardTooLarge(f"{st.st_size} bytes: larger than the format allows")
        if st.st_size < _HEAD.size:
            raise ShardTruncated(f"truncated: {st.st_size} bytes, the header needs {_HEAD.size}")
        pid = _name_pid(path)
        if pid >= 0 and not self.trusted(st.st_uid, pid):
            raise ShardUntrusted(f"owned by uid {st.st_uid}, which this agent does not trust")

    def _open(self, path: str, st: os.stat_result) -> tuple[int, os.stat_result] | None:
        hit = self._fds.get(path)
        if hit is not None and (hit[0], hit[1]) == (st.st_dev, st.st_ino):
            self._fds.move_to_end(path)
            return hit[2], st
        self._close_fd(path)  # another file at the name now (a regrown generation): its directory is compared
        if self._starved:
            raise OSError(errno.EMFILE, "out of descriptors: not opened until the next sweep")
        try:
            fd = self._open_fd(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ShardNotRegular("a symbolic link") from None
            raise
        try:
            fst = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)
            raise ShardNotRegular("replaced while being opened")
        if len(self._fds) < self.max_open:
            self._fds[path] = (fst.st_dev, fst.st_ino, fd)
        # Else it is closed after this read: the agent reads every shard each sweep, in the same order, and an
        # LRU evicting the oldest would evict exactly the next one needed (no hit at all past max_open).
        return fd, fst

    def _open_fd(self, path: str) -> int:
        try:
            return os.open(path, _OPEN_READ)
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE):
                raise
        # Out of descriptors (the process's or the system's): give back half of ours and try once more; if that
        # fails too, open nothing more until the next listing, never a retry per shard.
        for _ in range(max(1, len(self._fds) // 2)):
            self._close_oldest()
        try:
            return os.open(path, _OPEN_READ)
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                self._starved = True
            raise

    def _close_oldest(self) -> None:
        if self._fds:
            _, (_, _, fd) = self._fds.popitem(last=False)
            with contextlib.suppress(OSError):
                os.close(fd)

    def read(self, path: str) -> ShardSnapshot | None:
        """A consistent, validated copy of the shard; None when it is gone. ShardFormatError (with its reason)
        when it cannot be used, ShardRejected when it was found so before and is unchanged; OSError when it cannot
        be read. A file found unusable is closed at once."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            self.forget(path)
            self._rejected.pop(path, None)
            return None
        key = identity(st)
        before = self._rejected.get(path)
        now = time.monotonic()
        if before is not None and before[0] == key and now - before[2] < RECHECK_S:
            raise ShardRejected(before[1].reason, f"unchanged since it was refused: {before[1]}")
        try:
            snap = self._read(path, st)
        except ShardBusy:
            raise  # a writer mid-update: transient, looked at again next time
        except ShardFormatError as e:
            self.forget(path)
            if len(self._rejected) < MAX_REJECTED or path in self._rejected:
                self._rejected[path] = (key, e, now)
            if before is not None and before[0] == key and before[1].reason == e.reason:
                raise ShardRejected(e.reason, f"still refused: {e}") from None
            raise
        except OSError:
            self.forget(path)
            raise
        self._rejected.pop(path, None)
        if snap is not None:
            snap.identity = key
        return snap

    def _read(self, path: str, st: os.stat_result) -> ShardSnapshot | None:
        self._vet(path, st)
        got = self._open(path, st)
        if got is None:
            return None
        fd, st = got
        try:
            return self._copy(path, fd, st)
        finally:
            if self._fds.get(path, (0, 0, -1))[2] != fd:
                os.close(fd)  # not kept (the table is full)

    def _copy(self, path: str, fd: int, st: os.stat_result) -> ShardSnapshot:
        if st.st_size > MAX_SHARD_BYTES:
            raise ShardTooLarge(f"{st.st_size} bytes: larger than the format allows")
        for _ in range(50):
            head = os.pread(fd, HEAD_BYTES, 0)
            header = read_header(head)
            if not self.trusted(st.st_uid, header.pid):
                raise ShardUntrusted(f"owned by uid {st.st_uid}, which this agent does not trust")
            if header.seq & 1:
                time.sleep(0.0005)
                continue
            directory = os.pread(fd, header.directory_len, HEADER_BYTES) if header.directory_len else b""
            data = os.pread(fd, 8 * header.value_count, header.data_offset) if header.value_count else b""
            if os.pread(fd, _SEQ.size, SEQ_OFFSET) != head[SEQ_OFFSET:SEQ_OFFSET + _SEQ.size]:
                continue  # the writer moved on while we copied: copy again
            if len(directory) != header.directory_len or len(data) != 8 * header.value_count:
                raise ShardTruncated(f"truncated: {st.st_size} bytes, the header promises more")
            snap = self._decode(path, header, directory, data)
            snap.uid = st.st_uid
            return snap
        raise ShardBusy("the writer never settled (seq kept changing)")

    def _decode(self, path: str, header: ShardHeader, directory: bytes, data: bytes) -> ShardSnapshot:
        cached = self._directories.get(path)
        if cached is not None and cached[0] == directory:
            meta, entries, sketches = cached[1]
        else:
            meta, entries, sketches = parse_directory(directory)
            self._directories[path] = (directory, (meta, entries, sketches))
        return _snapshot(header, meta, entries, sketches, data)

    def read_stacks(self, path_of_shard: str, owner_uid: int, limit: int = STACKS_MAX_BYTES) -> str | None:
        """The stack dump beside a shard, if it is a regular file of the shard's owner; at most `limit` bytes."""
        try:
            fd = os.open(stacks_path(path_of_shard), _OPEN_READ)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != owner_uid:
                return None
            return os.pread(fd, limit, 0).decode("utf-8", "replace")
        except OSError:
            return None
        finally:
            os.close(fd)

    def has_stacks(self, path_of_shard: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(stacks_path(path_of_shard)).st_mode)
        except OSError:
            return False

    def remove(self, path: str) -> None:
        """Delete a finished shard and its stack dump (unlink never follows a link). OSError when not allowed."""
        self.forget(path)
        for p in (path, stacks_path(path)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)

    def forget(self, path: str) -> None:
        """Let go of what is held for a shard: its descriptor and its parsed directory."""
        self._close_fd(path)
        self._directories.pop(path, None)

    def _close_fd(self, path: str) -> None:
        hit = self._fds.pop(path, None)
        if hit is not None:
            with contextlib.suppress(OSError):
                os.close(hit[2])

    def close(self) -> None:
        for path in list(self._fds):
            self.forget(path)


def decode(buf: bytes) -> ShardSnapshot:
    """A whole shard copied into memory, validated as the reader validates one on disk (for tools and tests)."""
    header = read_header(buf)
    directory = bytes(buf[HEADER_BYTES:HEADER_BYTES + header.directory_len])
    data = bytes(buf[header.data_offset:header.data_offset + 8 * header.value_count])
    if len(directory) != header.directory_len or len(data) != 8 * header.value_count:
        raise ShardTruncated(f"truncated: {len(buf)} bytes, the header promises more")
    meta, entries, sketches = parse_directory(directory)
    return _snapshot(header, meta, entries, sketches, data)


def _snapshot(header: ShardHeader, meta: dict[str, Any], entries: list[Any], sketches: list[Any],
              data: bytes) -> ShardSnapshot:
    values = struct.unpack(f"<{header.value_count}d", data)
    snap = ShardSnapshot(header, meta)
    at: dict[int, int] = {}  # an entry's index in the directory -> its index in snap.series
    for i, entry in enumerate(entries):
        try:
            snap.series.append(_series(entry, values))
            at[i] = len(snap.series) - 1
        except (TypeError, ValueError, AttributeError) as e:
            snap.rejected.append(str(e)[:200])
    for raw in sketches:
        try:
            index, sketch = _sketch(raw, values, snap.series, at)
            snap.sketches[index] = sketch
        except (TypeError, ValueError, AttributeError) as e:
            snap.rejected.append(str(e)[:200])
    return snap


def parse_directory(directory: bytes) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """The directory's meta, raw series entries and raw sketches; ShardFormatError when its shape is wrong."""
    try:
        parsed = json.loads(directory or b"{}")
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ShardFormatError(f"corrupt directory: {str(e)[:200]}") from None
    if not isinstance(parsed, dict):
        raise ShardFormatError("corrupt directory: not an object")
    meta = parsed.get("meta") or {}
    entries = parsed.get("series") or []
    sketches = parsed.get("sketches") or []
    if not isinstance(meta, dict):
        raise ShardFormatError("corrupt directory: meta is not an object")
    if not isinstance(entries, list):
        raise ShardFormatError("corrupt directory: series is not a list")
    if not isinstance(sketches, list):
        sketches = [sketches]  # refused alone, as a bad sketch (the series stand)
    return {str(k): v for k, v in meta.items() if isinstance(v, (str, int, float))}, entries, sketches


ACCEPTED = ("", "")


def _not_text(value: Any, what: str) -> str:
    """Why value cannot be written as text ("" when it can)."""
    if not isinstance(value, str):
        return f"{what} is not a string"
    if value.isascii():  # most names and values: no copy made
        return ""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: a path or variable that was not UTF-8
        return f"{what} is not valid UTF-8"
    return ""


def name_refusal(name: Any) -> tuple[str, str]:
    """Why no series may have this name, as (reason, why): the writer refuses it when the series is created and counts
    the reason (hook/registry.py, outrider_hook_dropped_total), the reader refuses such an entry and keeps the why.
    ACCEPTED when it may. The one statement of the rule, so the hook never writes what the reader drops."""
    why = _not_text(name, "the metric name")
    if why:
        return "invalid_name", why
    if not prometheus_names.METRIC_NAME.fullmatch(name):
        return "invalid_name", f"invalid metric name {name[:80]!r}"
    if name.startswith(prometheus_names.INTERNAL_PREFIX):  # Prometheus's own: counted as reserved, read as invalid
        return "reserved_name", f"invalid metric name {name[:80]!r}"
    if prometheus_names.reserved_metric(name):
        return "reserved_name", f"reserved metric name {name!r}: Prometheus writes a series of that name itself"
    return ACCEPTED


def label_refusal(name: str, key: Any, value: Any) -> tuple[str, str]:
    """Why a series named name may not carry this label, as (reason, why) (see name_refusal); ACCEPTED when it may."""
    why = _not_text(key, f"{name}: a label name")
    if why:
        return "invalid_label_name", why
    if not prometheus_names.LABEL_NAME.fullmatch(key) or prometheus_names.reserved_label(key) or \
            key in RESERVED_LABELS:
        return "invalid_label_name", f"{name}: invalid or reserved label name {key[:80]!r}"
    why = _not_text(value, f"{name}: the value of label {key}")
    if why:
        return "invalid_label_value", why
    if len(value) > MAX_LABEL_VALUE:
        return "invalid_label_value", f"{name}: label {key} longer than {MAX_LABEL_VALUE} characters"
    return ACCEPTED


def _series(entry: Any, values: tuple[float, ...]) -> SeriesEntry:
    """One directory entry, validated: a bad entry is refused alone (the caller counts it), never the shard."""
    if not isinstance(entry, list) or len(entry) != 5:
        raise ValueError("an entry is not [name, kind, labels, offset, bounds]")
    name, kind, labels, offset, bounds = entry
    why = name_refusal(name)[1]
    if why:
        raise ValueError(why)
    if kind not in KINDS:
        raise ValueError(f"{name}: unknown kind {str(kind)[:20]!r}")
    if not isinstance(labels, dict):
        raise TypeError(f"{name}: labels are not an object")
    clean: dict[str, str] = {}
    for k, v in labels.items():
        why = label_refusal(name, k, v)[1]
        if why:
            raise ValueError(why)
        clean[k] = v
    if not isinstance(bounds, list) or (kind == "histogram") != bool(bounds):
        raise ValueError(f"{name}: bounds do not match its kind")
    bounds_t = tuple(float(b) for b in bounds if isinstance(b, (int, float)) and not isinstance(b, bool))
    if len(bounds_t) != len(bounds) or any(not math.isfinite(b) for b in bounds_t) or \
            any(a >= b for a, b in itertools.pairwise(bounds_t)):
        raise ValueError(f"{name}: bounds are not finite and increasing")
    width = len(bounds_t) + 2 if kind == "histogram" else 1
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= len(values) - width:
        raise ValueError(f"{name}: offset outside the data area")
    vals = list(values[offset:offset + width])
    if not all(math.isfinite(v) for v in vals):
        raise ValueError(f"{name}: a value is NaN or infinite")
    if kind == "histogram" and any(v < 0 or v != int(v) for v in vals[:-1]):
        raise ValueError(f"{name}: a bucket count is negative or fractional")
    if kind == "counter" and vals[0] < 0:
        raise ValueError(f"{name}: a counter is negative")
    return name, kind, clean, vals, bounds_t


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _sketch(raw: Any, values: tuple[float, ...], series: list[SeriesEntry],
            at: dict[int, int]) -> tuple[int, Sketch]:
    """One sketch, validated: [entry index, offset, n] pointing at [zero count, index, count, ...] (n pairs, indices
    increasing within the sketch's range, counts whole), of a histogram whose classic count is the same."""
    if not isinstance(raw, list) or len(raw) != 3 or not all(_whole(x) for x in raw):
        raise ValueError("a sketch is not [entry, offset, buckets]")
    entry, offset, n = raw
    if entry not in at:
        raise ValueError(f"a sketch of entry {entry}, which is not a valid series")
    name, kind, _, classic, _ = series[at[entry]]
    if kind != "histogram":
        raise ValueError(f"{name}: a sketch of a {kind}")
    if n < 0 or n > sketch.MAX_INDEX - sketch.MIN_INDEX + 1 or not 0 <= offset <= len(values) - 1 - 2 * n:
        raise ValueError(f"{name}: its sketch lies outside the data area")
    data = values[offset:offset + 1 + 2 * n]
    if not all(math.isfinite(v) and v == int(v) for v in data):
        raise ValueError(f"{name}: its sketch has a value that is not whole")
    zero, buckets, last = int(data[0]), {}, sketch.MIN_INDEX - 1
    for k in range(n):
        i, c = int(data[1 + 2 * k]), int(data[2 + 2 * k])
        if not last < i <= sketch.MAX_INDEX or c <= 0:
            raise ValueError(f"{name}: its sketch's buckets are not increasing, in range and positive")
        buckets[i] = c
        last = i
    if zero < 0 or zero + sum(buckets.values()) != int(sum(classic[:-1])):
        raise ValueError(f"{name}: its sketch does not hold its {int(sum(classic[:-1]))} observations")
    return at[entry], Sketch.of(zero, buckets)


def iter_shard_pids(spool_dir: str) -> Iterator[int]:
    """The pids named by the shards in a spool (without opening them)."""
    try:
        with os.scandir(spool_dir) as it:
            for e in it:
                m = SHARD_NAME_RE.fullmatch(e.name)
                if m:
                    yield int(m.group(1))
    except (FileNotFoundError, NotADirectoryError):
        return
