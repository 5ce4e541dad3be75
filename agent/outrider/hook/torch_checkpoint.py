"""Checkpoints with zero configuration: torch.save, torch.distributed.checkpoint's save and safetensors' save_file,
and uploads through fsspec (a file written to object storage, put) and boto3 (upload_file, upload_fileobj), called on
the training loop's thread, are timed as checkpoints.

Each outermost call is an implicit checkpoint: progress.py holds the stall back while it runs (see there for the
rule: its own learned duration, and whether the process writes), the loop's accounting (hook/loop.py) reports its
time as its own part (`outrider_train_loop_seconds_total{part="checkpoint"}`), and its duration is observed in
`outrider_train_checkpoint_duration_seconds`. A save on another thread (an asynchronous checkpointer, a logger
saving a sample) is not the loop's: it is left alone, so it never hides a hung loop. A save inside a declared
`outrider.phase("checkpoint")` is that phase's, not a second checkpoint.

Each checkpoint says where it writes: to local storage (a path, or a file object open on a regular file, DCP's
FileSystemWriter), whose writes /proc/self/io counts, or elsewhere (a file-like object such as a buffer or an
fsspec/s3fs file, an fsspec URL, another DCP storage writer, an upload), whose writes the kernel's storage counters
never see: progress.py judges only the first by "writing nothing to storage".

What is patched is the function the public name calls, where there is one (`torch.serialization._save`, the
state-dict saver's `_save_state_dict`, safetensors' `serialize_file`), so a name the user bound before
instrument() (`from torch import save`) is timed too; else the public name. torch.save's zip file is opened and
finished around `_save` (`with _open_zipfile_writer(f)`: half of a 12 MB save's time is its opening and the writing
of its end), so that opener is timed too, from its call to its context's exit: the whole save; it is also where the
destination is seen. fsspec's buffered files upload their last part when closed (a write-mode close is an upload),
and its asynchronous filesystems (s3fs, gcsfs) run their uploads through `fsspec.asyn.sync` (a `_put`, `_put_file`,
`_pipe` or `_pipe_file` passed to it is one). boto3's client.upload_file goes through S3Transfer.upload_file;
upload_fileobj is bound to a client's class when the class is made, so clients made before the hook patched boto3
keep the original. Modules imported later (torch's checkpoint package, safetensors, fsspec, boto3 are not imported by
`import torch`) are patched by the publisher thread as soon as it sees them in sys.modules. Nothing here raises into
user code: the save's own result or exception reaches the caller unchanged.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import stat
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from outrider.hook.state import LoopAccounting, StepState

LOG = logging.getLogger("outrider.hook")
CHECKPOINT = "checkpoint"
# Where a call writes, from its arguments: True to local storage, False elsewhere (the network, memory), None when
# the call is no checkpoint at all (a file closed after reading, an fsspec call that uploads nothing).
Where = Callable[[tuple[Any, ...], dict[str, Any]], "bool | None"]


def local_destination(dest: Any) -> bool:
    """Whether a save's destination is on local storage, where its writes show in /proc/self/io: a path (not a URL),
    or a file object open on a regular file or a block device. A buffer, a socket, an fsspec or s3fs file is not."""
    try:
        if isinstance(dest, (str, os.PathLike)):
            path = os.fspath(dest)
            return not isinstance(path, str) or "://" not in path
        fileno = getattr(dest, "fileno", None)
        if not callable(fileno):
            return False
        mode = os.fstat(fileno()).st_mode
        return stat.S_ISREG(mode) or stat.S_ISBLK(mode)
    except Exception:  # a file object without a descriptor (io.UnsupportedOperation), closed, or anything else
        return False


def _first_argument(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    return local_destination(args[0]) if args else True


def _second_argument(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    return local_destination(args[1]) if len(args) > 1 else True


def _storage_writer(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    """DCP's writer: its FileSystemWriter writes local files through torch's own FileSystem; an fsspec writer (a
    subclass with fsspec's), or any other StorageWriter, writes elsewhere."""
    writer = kwargs.get("storage_writer", args[1] if len(args) > 1 else None)
    fs = getattr(writer, "fs", None)
    return writer is None or type(fs).__module__ == "torch.distributed.checkpoint.filesystem"


def _unknown(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    return True  # an inner call the opener around it has classified; called alone (never by torch.save): local


def _network(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    return False


def _fsspec_close(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    """An fsspec buffered file uploads what it holds when closed in a write mode; closing it after reading is
    nothing. Its filesystem's protocol says whether the upload is local."""
    f = args[0] if args else None
    if f is None or getattr(f, "closed", True) or not set(str(getattr(f, "mode", ""))) & set("wax"):
        return None
    return _fsspec_local(getattr(f, "fs", None))


def _fsspec_put(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    return _fsspec_local(args[0] if args else None)


def _fsspec_local(fs: Any) -> bool:
    protocol = getattr(fs, "protocol", "")
    return bool(set(protocol if isinstance(protocol, (tuple, list)) else (protocol,)) & {"file", "local"})


FSSPEC_UPLOADS = frozenset({"_put", "_put_file", "_pipe", "_pipe_file"})


def _fsspec_sync(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    """fsspec.asyn.sync(loop, func, ...): an asynchronous filesystem's upload (s3fs, gcsfs) is one of its _put or
    _pipe coroutines; every other call (ls, info, a read) is no checkpoint."""
    func = args[1] if len(args) > 1 else kwargs.get("func")
    return False if getattr(func, "__name__", "") in FSSPEC_UPLOADS else None


@dataclass(frozen=True)
class Target:
    """A module whose functions (or classes' methods: "Class.method") are timed as checkpoints: of `choices`, the
    first whose names all exist is patched; `where` says where each call writes; `kind` names the kind of save,
    whose durations progress.py learns apart (a torch.save into a buffer takes milliseconds, its upload minutes)."""

    module: str
    choices: tuple[tuple[str, ...], ...]
    where: Where
    kind: str


TARGETS: tuple[Target, ...] = (
    # inner functions the public ones call, else the public ones; _save's destination is the opener's (below)
    Target("torch.serialization", (("_save",), ("save",)), _unknown, "torch.save"),
    Target("torch.serialization", (("_legacy_save",),), _second_argument, "torch.save"),
    Target("torch.distributed.checkpoint.state_dict_saver", (("_save_state_dict",), ("save", "save_state_dict")),
           _storage_writer, "torch.distributed.checkpoint"),
    Target("safetensors.torch", (("serialize_file",), ("save_file", "save_model")), _second_argument, "safetensors"),
    Target("fsspec.spec", (("AbstractBufferedFile.close",),), _fsspec_close, "fsspec upload"),
    Target("fsspec.spec", (("AbstractFileSystem.put", "AbstractFileSystem.put_file", "AbstractFileSystem.pipe",
                            "AbstractFileSystem.pipe_file"),), _fsspec_put, "fsspec upload"),
    Target("fsspec.asyn", (("sync",),), _fsspec_sync, "fsspec upload"),
    Target("boto3.s3.transfer", (("S3Transfer.upload_file",),), _network, "boto3 upload"),
    Target("boto3.s3.inject", (("upload_file", "upload_fileobj"),), _network, "boto3 upload"),
)
# (module, context-manager factories whose whole `with` block is part of a save, where it writes, its kind)
OPENERS: tuple[tuple[str, str, Where, str], ...] = (
    ("torch.serialization", "_open_zipfile_writer", _first_argument, "torch.save"),
)


class CheckpointWatch:
    def __init__(self, steps: StepState, loop: LoopAccounting, progress: Any, drop: Callable[[str], None],
                 clock: Callable[[], float] = perf_counter) -> None:
        """steps: the hook's step state (the loop's thread id); loop: its loop accounting (the checkpoint interval
        queue); progress: the hook's Progress (the stall rule)."""
        self.steps = steps
        self.loop = loop
        self.progress = progress
        self.drop = drop
        self.clock = clock
        self.depth = 0  # nesting on the loop's thread (torch.save inside dcp.save): only that thread writes it
        self.begin = 0.0
        self.owned = False  # this call opened the checkpoint (not inside a declared phase of that name)
        self.saved: list[tuple[Any, str, Any]] = []
        self.patched: set[tuple[str, Any]] = set()
        # set by detach() before it puts the originals back; the publisher's poll reads it after each patch and
        # undoes that patch when set, so a poll racing a detach never leaves this watch's wrapper on torch for good
        # (where the next hook's would be refused). No lock: nothing here may block, nor be held across a fork.
        self.detached = False
        # finished checkpoints' durations, for the publisher's histogram (appends and pops are atomic)
        self.durations: collections.deque[float] = collections.deque(maxlen=1024)
        self.poll()

    def poll(self) -> None:
        """Patch the target modules imported since the last look (cheap: a few dict lookups). Nothing once
        detached."""
        for target in TARGETS:
            if self.detached:
                return
            key = (target.module, target.choices)
            if key in self.patched:
                continue
            module = sys.modules.get(target.module)
            if module is None or _initializing(module):
                continue
            self.patched.add(key)
            for names in target.choices:
                found = [_owner_and_name(module, n) for n in names]
                if all(owner is not None and callable(getattr(owner, name, None)) for owner, name in found):
                    for owner, name in found:
                        self._patch(owner, name, functools.partial(self._timed, where=target.where, kind=target.kind))
                    break
            for owner_name, name, where, kind in OPENERS:
                if owner_name == target.module and callable(getattr(module, name, None)) and \
                        (owner_name, name) not in self.patched:
                    self.patched.add((owner_name, name))
                    self._patch(module, name, functools.partial(self._timed_opener, where=where, kind=kind))

    def _patch(self, owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(owner, name)
        if getattr(original, "__outrider_checkpoint__", False):
            return
        # a class's method inherited from a base is put back by removing the wrapper, not by copying the base's
        own = not isinstance(owner, type) or name in owner.__dict__
        self.saved.append((owner, name, original if own else _INHERITED))
        setattr(owner, name, wrap(original))
        if self.detached:  # detach() ran meanwhile and may have put the originals back before this one
            _restore(owner, name, self.saved[-1][2])

    def detach(self) -> None:
        """Put the originals back, for good: a later poll patches nothing. Idempotent."""
        self.detached = True
        for owner, name, original in reversed(self.saved):
            _restore(owner, name, original)
        self.saved.clear()

    def _timed(self, original: Callable[..., Any], where: Where, kind: str) -> Callable[..., Any]:
        watch = self

        @functools.wraps(original)
        def save(*args: Any, **kwargs: Any) -> Any:
            mine = watch._enter(args, kwargs, where, kind)
            try:
                return original(*args, **kwargs)
            finally:
                if mine:
                    watch._exit()

        save.__outrider_checkpoint__ = True  # type: ignore[attr-defined]
        return save

    def _timed_opener(self, original: Callable[..., Any], where: Where, kind: str) -> Callable[..., Any]:
        """A context-manager factory whose call and `with` block are timed as one save."""
        watch = self

        @functools.wraps(original)
        def opener(*args: Any, **kwargs: Any) -> Any:
            mine = watch._enter(args, kwargs, where, kind)
            try:
                return _Finishing(original(*args, **kwargs), watch if mine else None)
            except BaseException:
                if mine:
                    watch._exit()
                raise

        opener.__outrider_checkpoint__ = True  # type: ignore[attr-defined]
        return opener

    def _on_loop_thread(self) -> bool:
        tid = self.steps.loop_tid
        if tid:
            return bool(threading.get_native_id() == tid)
        return threading.current_thread() is threading.main_thread()  # before the first step: the main thread

    def _enter(self, args: tuple[Any, ...], kwargs: dict[str, Any], where: Where, kind: str) -> bool:
        try:
            if not self._on_loop_thread():
                return False
            if self.depth == 0:
                local = where(args, kwargs)
                if local is None:
                    return False  # no checkpoint (a file closed after reading, an fsspec call that uploads nothing)
                self.begin = self.clock()
                self.owned = CHECKPOINT not in self.progress.open_phases
                if self.owned:
                    self.progress.checkpoint_begin(local_storage=local, kind=kind)
            self.depth += 1  # after the begin: one that failed leaves no checkpoint open for good
            return True
        except Exception:
            self.drop("checkpoint_error")
            return False

    def _exit(self) -> None:
        try:
            self.depth -= 1
            if self.depth:
                return
            end = self.clock()
            if self.owned:
                self.progress.checkpoint_end()
            self.loop.checkpoints.append((self.begin, end))
            self.durations.append(end - self.begin)
        except Exception:
            self.drop("checkpoint_error")

    # --- the publisher thread -------------------------------------------------------------------------------
    def sample(self, hook: Any) -> None:
        self.poll()
        if not self.durations:
            return
        histogram = hook.series("histogram", "outrider_train_checkpoint_duration_seconds", builtin=True)
        while self.durations:
            try:
                histogram.observe(self.durations.popleft())
            except IndexError:
                break


class _Finishing:
    """A context manager's stand-in that ends the checkpoint its opener began once the real one has exited (a
    zip file's end written and closed)."""

    def __init__(self, inner: Any, watch: CheckpointWatch | None) -> None:
        self.inner = inner
        self.watch = watch

    def __enter__(self) -> Any:
        try:
            return self.inner.__enter__()
        except BaseException:
            self._done()
            raise

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self.inner.__exit__(*exc)
        finally:
            self._done()

    def _done(self) -> None:
        watch, self.watch = self.watch, None
        if watch is not None:
            watch._exit()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


_INHERITED = object()  # saved in place of a class's method that came from a base class


def _restore(owner: Any, name: str, original: Any) -> None:
    if original is _INHERITED:
        with contextlib.suppress(AttributeError):
            delattr(owner, name)
    else:
        setattr(owner, name, original)


def _owner_and_name(module: Any, dotted: str) -> tuple[Any, str]:
    """(the object that holds it, its name) for "function" or "Class.method" in `module`; (None, name) when the class
    is not there."""
    if "." not in dotted:
        return module, dotted
    cls, name = dotted.split(".", 1)
    return getattr(module, cls, None), name


def _initializing(module: Any) -> bool:
    """Whether the module is still being imported (its globals half made): patch it at the next look."""
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def attach(steps: StepState, loop: LoopAccounting, progress: Any, drop: Callable[[str], None]) \
        -> CheckpointWatch | None:
    try:
        return CheckpointWatch(steps, loop, progress, drop)
    except Exception as e:
        LOG.warning("outrider: checkpoints are not recognised automatically in this process (%s)", e)
        return None
