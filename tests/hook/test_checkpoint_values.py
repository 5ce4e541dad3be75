"""The checkpoint watch (hook/torch_checkpoint.py) value by value: where each kind of save writes, which functions a
poll patches and how detach puts them back, and what a timed save asks of the stall rule and leaves for the loop's
accounting and the histogram, on a clock that ticks one second a reading.

The save libraries are plain module objects planted under the target modules' names (no torch, fsspec or boto3
needed; whatever another test imported is set aside for the test's length). tests/hook/test_checkpoints.py times real
torch.save, DCP, fsspec and boto3 calls through a real hook."""

from __future__ import annotations

import io
import logging
import os
import stat
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from outrider.hook import torch_checkpoint as tc
from outrider.hook.state import LoopAccounting, StepState
from outrider.hook.torch_checkpoint import CheckpointWatch, local_destination
from tests.helpers import on_another_thread


class Progress:
    """The stall rule's side of a checkpoint (hook/progress.py's Progress), as the watch calls it: the calls, in
    order, into `log`."""

    def __init__(self, log: list[Any], phases: tuple[str, ...] = ()) -> None:
        self.open_phases = {p: 0.0 for p in phases}
        self.log = log
        self.fail_on: str | None = None

    def checkpoint_begin(self, local_storage: bool = True, kind: str = "") -> None:
        self.log.append(("begin", local_storage, kind))
        if self.fail_on == "begin":
            raise RuntimeError("begin")

    def checkpoint_end(self) -> None:
        self.log.append(("end",))
        if self.fail_on == "end":
            raise RuntimeError("end")


class Clock:
    """101, 102, 103, ...: each reading one second after the last."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


class Watched:
    def __init__(self, phases: tuple[str, ...] = ()) -> None:
        self.log: list[Any] = []
        self.steps = StepState()
        self.loop = LoopAccounting()
        self.progress = Progress(self.log, phases)
        self.drops: list[str] = []
        self.watch = CheckpointWatch(self.steps, self.loop, self.progress, self.drops.append, clock=Clock())


@pytest.fixture
def plant(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., types.ModuleType]]:
    """plant(name, **attributes): a module object in sys.modules under `name`, for the test's length. Every target
    module another test imported is set aside first."""
    for name in {t.module for t in tc.TARGETS}:
        monkeypatch.delitem(sys.modules, name, raising=False)

    def plant(name: str, **attributes: Any) -> types.ModuleType:
        module = types.ModuleType(name)
        for k, v in attributes.items():
            setattr(module, k, v)
        monkeypatch.setitem(sys.modules, name, module)
        return module

    yield plant


@pytest.fixture
def w(plant: Callable[..., types.ModuleType]) -> Iterator[Watched]:
    watched = Watched()
    yield watched
    watched.watch.detach()


def marked(fn: Any) -> bool:
    return bool(getattr(fn, "__outrider_checkpoint__", False))



def recorder(log: list[Any], name: str, result: Any = "saved") -> Callable[..., Any]:
    def fn(*args: Any, **kwargs: Any) -> Any:
        log.append((name, args, kwargs))
        return result

    fn.__name__ = name
    return fn


# --- where a save writes ---------------------------------------------------------------------------------------


class BytesPath:
    def __init__(self, path: bytes) -> None:
        self.path = path

    def __fspath__(self) -> bytes:
        return self.path


@pytest.mark.parametrize(("dest", "local"), [
    ("/ckpt/model.pt", True), (Path("/ckpt/model.pt"), True), ("model.pt", True),
    ("s3://bucket/model.pt", False), ("file:///ckpt/model.pt", False),
    (BytesPath(b"s3://bucket/model.pt"), True),  # a path in bytes names a local file
    (b"/ckpt/model.pt", False),  # no path to torch either: bytes are no file object with a descriptor
])
def test_a_path_is_local_unless_it_is_a_url(dest: Any, local: bool) -> None:
    assert local_destination(dest) is local


def test_a_file_object_is_local_when_it_is_open_on_a_regular_file(tmp_path: Path) -> None:
    with open(tmp_path / "model.pt", "wb") as f:
        assert local_destination(f) is True
    assert local_destination(f) is False, "closed: its fileno() raises"
    assert local_destination(io.BytesIO()) is False
    assert local_destination(object()) is False

    class NotCallable:
        fileno = 3

    assert local_destination(NotCallable()) is False
    r, wr = os.pipe()
    directory = os.open(tmp_path, os.O_RDONLY)
    try:
        with open(wr, "wb", closefd=False) as pipe:
            assert local_destination(pipe) is False

        class Directory:
            def fileno(self) -> int:
                return directory

        assert local_destination(Directory()) is False

        class Broken:
            def fileno(self) -> int:
                raise RuntimeError("no descriptor")

        assert local_destination(Broken()) is False
    finally:
        for fd in (r, wr, directory):
            os.close(fd)


def test_a_file_object_open_on_a_block_device_is_local() -> None:
    """A checkpoint written straight to a raw disk (its writes are the device's, which /proc/self/io counts)."""
    devices = [f"/dev/{d}" for d in sorted(os.listdir("/dev")) if d.startswith(("loop", "sd", "nvme", "vd"))]
    for path in devices:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            if stat.S_ISBLK(os.fstat(fd).st_mode):
                with open(fd, "rb", closefd=False) as f:
                    assert local_destination(f) is True
                return
        finally:
            os.close(fd)
    pytest.skip("no block device this process may open")


def test_each_argument_rule_reads_its_own_argument() -> None:
    assert tc._first_argument(("s3://b/k",), {}) is False
    assert tc._first_argument(("/ckpt/m.pt", "s3://b/k"), {}) is True
    assert tc._first_argument((), {"f": "s3://b/k"}) is True, "no argument: called alone, local"
    assert tc._second_argument(({}, "s3://b/k"), {}) is False
    assert tc._second_argument(({}, "/ckpt/m.pt"), {}) is True
    assert tc._second_argument(("s3://b/k",), {}) is True
    assert tc._second_argument((), {}) is True
    assert tc._unknown(("s3://b/k",), {}) is True
    assert tc._network(("/ckpt/m.pt",), {}) is False


def test_a_distributed_checkpoints_writer_is_local_when_it_writes_through_torchs_own_file_system() -> None:
    torch_fs = type("FileSystem", (), {"__module__": "torch.distributed.checkpoint.filesystem"})()
    fsspec_fs = type("FileSystem", (), {"__module__": "torch.distributed.checkpoint._fsspec_filesystem"})()
    local = types.SimpleNamespace(fs=torch_fs)
    remote = types.SimpleNamespace(fs=fsspec_fs)
    state: dict[str, Any] = {}
    assert tc._storage_writer((state,), {}) is True, "no writer: DCP's default, the local FileSystemWriter"
    assert tc._storage_writer((), {}) is True
    assert tc._storage_writer((state, local), {}) is True
    assert tc._storage_writer((state, remote), {}) is False
    assert tc._storage_writer((state,), {"storage_writer": local}) is True
    assert tc._storage_writer((state,), {"storage_writer": remote}) is False
    assert tc._storage_writer((state,), {"storage_writer": object()}) is False, "a writer of its own: elsewhere"


def fsspec_file(mode: Any = "wb", closed: bool = False, protocol: Any = "s3") -> Any:
    f = types.SimpleNamespace(closed=closed, fs=types.SimpleNamespace(protocol=protocol))
    if mode is not None:
        f.mode = mode
    return f


@pytest.mark.parametrize(("args", "where"), [
    ((), None),
    ((None,), None),
    ((fsspec_file(closed=True),), None),
    ((types.SimpleNamespace(mode="wb", fs=None),), None),  # no `closed`: taken as closed
    ((fsspec_file(mode="rb"),), None),
    ((fsspec_file(mode=None),), None),
    ((fsspec_file(mode="wb"),), False),
    ((fsspec_file(mode="ab"),), False),
    ((fsspec_file(mode="xb"),), False),
    ((fsspec_file(mode="Xr"),), None),  # an upper-case X is no exclusive creation (x)
    ((fsspec_file(mode="wb", protocol="file"),), True),
    ((fsspec_file(mode="wb", protocol=("file", "local")),), True),
    ((fsspec_file(mode="wb", protocol=["local"]),), True),
    ((fsspec_file(mode="wb", protocol=("s3", "s3a")),), False),
    ((types.SimpleNamespace(closed=False, mode="wb"),), False),  # no filesystem: no protocol
])
def test_an_fsspec_file_closed_in_a_write_mode_is_an_upload_local_by_its_protocol(args: tuple[Any, ...],
                                                                                 where: bool | None) -> None:
    assert tc._fsspec_close(args, {}) is where


def test_an_fsspec_put_is_local_by_its_filesystems_protocol() -> None:
    assert tc._fsspec_put((types.SimpleNamespace(protocol="file"), "a", "b"), {}) is True
    assert tc._fsspec_put((types.SimpleNamespace(protocol=("gcs", "gs")), "a", "b"), {}) is False
    assert tc._fsspec_put((), {}) is False
    assert tc._fsspec_local(types.SimpleNamespace(protocol="local")) is True
    assert tc._fsspec_local(object()) is False


@pytest.mark.parametrize("name", sorted(tc.FSSPEC_UPLOADS))
def test_an_asynchronous_filesystems_upload_is_a_checkpoint_to_the_network_and_nothing_else_is(name: str) -> None:
    upload = types.SimpleNamespace(__name__=name)
    assert tc._fsspec_sync(("loop", upload, "a"), {}) is False
    assert tc._fsspec_sync(("loop", upload), {}) is False
    assert tc._fsspec_sync(("loop",), {"func": upload}) is False
    assert tc._fsspec_sync(("loop", types.SimpleNamespace(__name__="_ls")), {}) is None
    assert tc._fsspec_sync(("loop",), {}) is None
    assert tc._fsspec_sync(("loop", object()), {}) is None


# --- what a poll patches ---------------------------------------------------------------------------------------


def test_the_inner_save_is_patched_where_there_is_one_and_its_opener_once(plant: Callable[..., Any]) -> None:
    log: list[Any] = []
    originals = {n: recorder(log, n) for n in ("_save", "save", "_legacy_save", "_open_zipfile_writer")}
    module = plant("torch.serialization", **originals)
    watched = Watched()
    assert all(marked(getattr(module, n)) for n in ("_save", "_legacy_save", "_open_zipfile_writer"))
    assert module.save is originals["save"], "the public name calls the inner one: left alone"
    assert len(watched.watch.saved) == 3, "the opener patched once, though two targets name its module"
    assert module._save.__name__ == "_save" and module._save.__wrapped__ is originals["_save"]
    watched.watch.detach()
    assert all(getattr(module, n) is f for n, f in originals.items())


def test_the_public_name_is_patched_where_no_inner_one_exists(plant: Callable[..., Any]) -> None:
    save = recorder([], "save")
    module = plant("torch.serialization", save=save)
    watched = Watched()
    assert marked(module.save) and module.save.__wrapped__ is save
    watched.watch.detach()
    assert module.save is save


def test_a_choice_is_patched_only_when_all_its_names_are_there_and_callable(plant: Callable[..., Any]) -> None:
    save = recorder([], "save")
    module = plant("torch.distributed.checkpoint.state_dict_saver", save=save)
    Watched().watch.detach()
    assert module.save is save, "save_state_dict missing"
    module.save_state_dict = 3
    Watched().watch.detach()
    assert module.save is save, "save_state_dict is no function"
    module.save_state_dict = recorder([], "save_state_dict")
    watched = Watched()
    assert marked(module.save) and marked(module.save_state_dict)
    watched.watch.detach()


def test_a_classs_methods_are_patched_and_an_inherited_one_put_back_by_removing_the_wrapper(
        plant: Callable[..., Any]) -> None:
    class Base:
        def close(self) -> str:
            return "closed"

    class AbstractBufferedFile(Base):
        pass

    def put(self: Any, *a: Any) -> None:
        pass

    methods = {n: put for n in ("put", "put_file", "pipe", "pipe_file")}
    AbstractFileSystem = type("AbstractFileSystem", (), dict(methods))
    plant("fsspec.spec", AbstractBufferedFile=AbstractBufferedFile, AbstractFileSystem=AbstractFileSystem)
    watched = Watched()
    assert marked(AbstractBufferedFile.__dict__["close"]) and Base.close.__name__ == "close"
    assert not marked(Base.close)
    assert all(marked(AbstractFileSystem.__dict__[n]) for n in methods)
    watched.watch.detach()
    assert "close" not in AbstractBufferedFile.__dict__ and AbstractBufferedFile.close is Base.close
    assert all(AbstractFileSystem.__dict__[n] is put for n in methods), "its own methods: set back"


def test_an_inherited_method_already_gone_at_detach_is_no_error(plant: Callable[..., Any]) -> None:
    class Base:
        def upload_file(self) -> None:
            pass

    class S3Transfer(Base):
        pass

    plant("boto3.s3.transfer", S3Transfer=S3Transfer)
    watched = Watched()
    del S3Transfer.upload_file
    watched.watch.detach()
    assert S3Transfer.upload_file is Base.upload_file


def test_a_target_whose_class_is_missing_is_left_alone(plant: Callable[..., Any]) -> None:
    module = plant("boto3.s3.transfer")
    watched = Watched()
    assert watched.watch.saved == [] and not hasattr(module, "S3Transfer")
    assert tc._owner_and_name(module, "S3Transfer.upload_file") == (None, "upload_file")
    assert tc._owner_and_name(module, "upload_file") == (module, "upload_file")
    module.Outer = types.SimpleNamespace()
    assert tc._owner_and_name(module, "Outer.inner.method") == (module.Outer, "inner.method")


def test_modules_imported_later_are_patched_at_the_next_poll_and_each_once(plant: Callable[..., Any]) -> None:
    plant("torch.serialization", _save=recorder([], "_save"))
    watched = Watched()
    assert len(watched.watch.saved) == 1
    later = plant("boto3.s3.inject", upload_file=recorder([], "upload_file"), upload_fileobj=recorder([], "o"))
    watched.watch.poll()
    assert marked(later.upload_file) and marked(later.upload_fileobj)
    watched.watch.poll()
    assert len(watched.watch.saved) == 3
    watched.watch.detach()


def test_a_module_still_being_imported_is_patched_at_the_next_poll(plant: Callable[..., Any]) -> None:
    module = plant("safetensors.torch", serialize_file=recorder([], "serialize_file"))
    module.__spec__ = types.SimpleNamespace(_initializing=True)
    watched = Watched()
    assert not marked(module.serialize_file)
    module.__spec__._initializing = False
    watched.watch.poll()
    assert marked(module.serialize_file)
    watched.watch.detach()
    assert tc._initializing(types.ModuleType("m")) is False
    assert tc._initializing(object()) is False, "an object some library put in sys.modules: no __spec__"


def test_a_second_watch_leaves_a_marked_function_to_the_first(plant: Callable[..., Any]) -> None:
    save = recorder([], "serialize_file")
    module = plant("safetensors.torch", serialize_file=save)
    first, second = Watched(), Watched()
    wrapper = module.serialize_file
    assert first.watch.saved and second.watch.saved == []
    second.watch.detach()
    assert module.serialize_file is wrapper
    first.watch.detach()
    assert module.serialize_file is save


def test_detach_is_for_good_and_a_second_one_undoes_nothing_set_since(plant: Callable[..., Any]) -> None:
    save = recorder([], "serialize_file")
    module = plant("safetensors.torch", serialize_file=save)
    watched = Watched()
    watched.watch.detach()
    mine = recorder([], "mine")
    module.serialize_file = mine
    watched.watch.detach()
    assert module.serialize_file is mine
    watched.watch.poll()
    assert module.serialize_file is mine


def test_a_fresh_watch_starts_attached_with_nothing_open(w: Watched) -> None:
    watch = w.watch
    assert (watch.depth, watch.begin, watch.owned, watch.detached) == (0, 0.0, False, False)
    assert watch.durations.maxlen == 1024 and not watch.durations


def test_a_watch_that_fails_to_start_is_none_and_said(plant: Callable[..., Any],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    class Broken(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("half made")

    sys.modules["safetensors.torch"] = Broken("safetensors.torch")  # the plant fixture puts sys.modules back
    with caplog.at_level(logging.WARNING, logger="outrider.hook"):
        assert tc.attach(StepState(), LoopAccounting(), Progress([]), [].append) is None
    assert [r.getMessage() for r in caplog.records] == [
        "outrider: checkpoints are not recognised automatically in this process (half made)"]
    del sys.modules["safetensors.torch"]
    plant("safetensors.torch", serialize_file=recorder([], "serialize_file"))
    watch = tc.attach(StepState(), LoopAccounting(), Progress([]), [].append)
    assert isinstance(watch, CheckpointWatch) and watch.saved
    watch.detach()


# --- a timed save ----------------------------------------------------------------------------------------------


def safetensors(plant: Callable[..., Any], log: list[Any], result: Any = "saved") -> types.ModuleType:
    return plant("safetensors.torch", serialize_file=recorder(log, "serialize_file", result))


def test_a_save_is_timed_as_a_checkpoint_and_returns_the_saves_own_result(w: Watched,
                                                                          plant: Callable[..., Any]) -> None:
    module = safetensors(plant, w.log)
    w.watch.poll()
    assert module.serialize_file({"w": 1}, "/ckpt/m.safetensors", metadata=None) == "saved"
    assert w.log == [("begin", True, "safetensors"), ("serialize_file", ({"w": 1}, "/ckpt/m.safetensors"),
                                                      {"metadata": None}), ("end",)]
    assert list(w.loop.checkpoints) == [(101.0, 102.0)] and list(w.watch.durations) == [1.0]
    assert w.watch.depth == 0 and w.drops == []
    module.serialize_file({}, "s3://b/m.safetensors")
    assert w.log[-3] == ("begin", False, "safetensors")
    assert list(w.loop.checkpoints) == [(101.0, 102.0), (103.0, 104.0)]


def test_a_save_that_raises_reaches_the_caller_unchanged_and_its_checkpoint_ends(w: Watched,
                                                                                plant: Callable[..., Any]) -> None:
    error = OSError("disk full")

    def serialize_file(*args: Any) -> None:
        raise error

    module = plant("safetensors.torch", serialize_file=serialize_file)
    w.watch.poll()
    with pytest.raises(OSError) as raised:
        module.serialize_file({}, "/ckpt/m")
    assert raised.value is error
    assert w.log == [("begin", True, "safetensors"), ("end",)] and w.watch.depth == 0
    assert list(w.watch.durations) == [1.0]


def test_a_save_inside_a_declared_checkpoint_phase_is_timed_but_not_begun_again(plant: Callable[..., Any]) -> None:
    watched = Watched(phases=("checkpoint",))
    module = safetensors(plant, watched.log)
    watched.watch.poll()
    module.serialize_file({}, "/ckpt/m")
    assert watched.log == [("serialize_file", ({}, "/ckpt/m"), {})], "the phase's, not a second checkpoint"
    assert list(watched.loop.checkpoints) == [(101.0, 102.0)] and watched.watch.owned is False
    watched.watch.detach()


def test_a_save_inside_another_is_one_checkpoint_where_the_outer_one_writes(w: Watched,
                                                                           plant: Callable[..., Any]) -> None:
    inner = plant("boto3.s3.inject", upload_file=recorder(w.log, "upload_file"),
                  upload_fileobj=recorder(w.log, "upload_fileobj"))

    def serialize_file(*args: Any) -> str:
        inner.upload_file("/ckpt/m", "bucket", "key")
        return "saved"

    module = plant("safetensors.torch", serialize_file=serialize_file)
    w.watch.poll()
    assert module.serialize_file({}, "/ckpt/m") == "saved"
    assert w.log == [("begin", True, "safetensors"), ("upload_file", ("/ckpt/m", "bucket", "key"), {}), ("end",)]
    assert list(w.loop.checkpoints) == [(101.0, 102.0)] and w.watch.depth == 0
    inner.upload_file("/ckpt/m", "bucket", "key")  # alone: a checkpoint of its own, to the network
    assert w.log[-3] == ("begin", False, "boto3 upload")


def test_a_call_that_is_no_save_is_not_timed(w: Watched, plant: Callable[..., Any]) -> None:
    class AbstractBufferedFile:
        closed = False
        mode = "rb"
        fs = types.SimpleNamespace(protocol="s3")

        def close(self) -> str:
            return "closed"

    plant("fsspec.spec", AbstractBufferedFile=AbstractBufferedFile)
    w.watch.poll()
    assert AbstractBufferedFile().close() == "closed"
    assert w.log == [] and not w.loop.checkpoints and w.watch.depth == 0
    f = AbstractBufferedFile()
    f.mode = "wb"
    f.close()
    assert w.log == [("begin", False, "fsspec upload"), ("end",)]


def test_a_save_on_another_thread_is_not_the_loops(w: Watched, plant: Callable[..., Any]) -> None:
    module = safetensors(plant, w.log)
    w.watch.poll()
    assert on_another_thread(lambda: module.serialize_file({}, "/ckpt/m")) == "saved"
    assert w.log == [("serialize_file", ({}, "/ckpt/m"), {})] and w.watch.depth == 0 and not w.loop.checkpoints


def test_once_steps_run_the_loops_thread_is_the_one_that_completes_them(w: Watched,
                                                                        plant: Callable[..., Any]) -> None:
    module = safetensors(plant, w.log)
    w.watch.poll()
    w.steps.loop_tid = on_another_thread(threading.get_native_id)  # a thread other than this one
    module.serialize_file({}, "/ckpt/m")
    assert [e[0] for e in w.log] == ["serialize_file"], "the main thread is not the loop's now"

    def loop() -> Any:
        w.steps.loop_tid = threading.get_native_id()
        return module.serialize_file({}, "/ckpt/m")

    assert on_another_thread(loop) == "saved"
    assert [e[0] for e in w.log] == ["serialize_file", "begin", "serialize_file", "end"]


def test_a_failure_to_classify_a_save_is_counted_and_the_save_goes_on(w: Watched, plant: Callable[..., Any]) -> None:
    class Unreadable:
        @property
        def closed(self) -> bool:
            raise RuntimeError("no state")

        def close(self) -> str:
            return "closed"

    plant("fsspec.spec", AbstractBufferedFile=Unreadable)
    w.watch.poll()
    assert Unreadable().close() == "closed"
    assert w.drops == ["checkpoint_error"] and w.log == [] and w.watch.depth == 0


def test_a_failure_to_begin_a_checkpoint_is_counted_and_leaves_none_open(w: Watched,
                                                                          plant: Callable[..., Any]) -> None:
    module = safetensors(plant, w.log)
    w.watch.poll()
    w.progress.fail_on = "begin"
    assert module.serialize_file({}, "/ckpt/m") == "saved"
    assert w.drops == ["checkpoint_error"] and w.watch.depth == 0
    w.progress.fail_on = None
    module.serialize_file({}, "/ckpt/m")
    assert w.log[-3:] == [("begin", True, "safetensors"), ("serialize_file", ({}, "/ckpt/m"), {}), ("end",)]


def test_a_failure_to_end_a_checkpoint_is_counted_and_the_saves_result_returned(w: Watched,
                                                                               plant: Callable[..., Any]) -> None:
    module = safetensors(plant, w.log)
    w.watch.poll()
    w.progress.fail_on = "end"
    assert module.serialize_file({}, "/ckpt/m") == "saved"
    assert w.drops == ["checkpoint_error"] and w.watch.depth == 0


# --- torch.save's opener ---------------------------------------------------------------------------------------


class ZipWriter:
    """torch's _open_zipfile_writer(f): a context manager whose exit writes the zip's end."""

    def __init__(self, log: list[Any], f: Any, fail_enter: bool = False, swallow: bool = False) -> None:
        self.log, self.f, self.fail_enter, self.swallow = log, f, fail_enter, swallow
        self.name = "archive"

    def __enter__(self) -> str:
        self.log.append("zip open")
        if self.fail_enter:
            raise OSError("cannot open")
        return "zip handle"

    def __exit__(self, *exc: Any) -> bool:
        self.log.append("zip end")
        return self.swallow


def torch_serialization(plant: Callable[..., Any], log: list[Any], **writer: Any) -> types.ModuleType:
    return plant("torch.serialization", _save=recorder(log, "_save"),
                 _open_zipfile_writer=lambda f: ZipWriter(log, f, **writer))


def torch_save(module: types.ModuleType, obj: Any, f: Any) -> None:
    with module._open_zipfile_writer(f) as zip_file:
        module._save(obj, zip_file)


def test_torch_save_is_one_checkpoint_from_opening_its_zip_to_writing_its_end(w: Watched,
                                                                             plant: Callable[..., Any]) -> None:
    module = torch_serialization(plant, w.log)
    w.watch.poll()
    torch_save(module, {"w": 1}, io.BytesIO())
    assert w.log == [("begin", False, "torch.save"), "zip open", ("_save", ({"w": 1}, "zip handle"), {}),
                     "zip end", ("end",)]
    assert list(w.loop.checkpoints) == [(101.0, 102.0)] and w.watch.depth == 0
    torch_save(module, {}, "/ckpt/m.pt")
    assert w.log[-5] == ("begin", True, "torch.save")
    assert module._open_zipfile_writer("/ckpt/m.pt").name == "archive", "the writer's attributes read through"


def test_an_opener_whose_context_swallows_an_error_still_does_so(w: Watched, plant: Callable[..., Any]) -> None:
    module = torch_serialization(plant, w.log, swallow=True)
    w.watch.poll()
    with module._open_zipfile_writer("/ckpt/m.pt"):
        raise ValueError("swallowed by the writer")
    assert w.log[-1] == ("end",) and w.watch.depth == 0


def test_an_opener_that_fails_ends_its_checkpoint_and_raises(w: Watched, plant: Callable[..., Any]) -> None:
    module = torch_serialization(plant, w.log, fail_enter=True)
    w.watch.poll()
    with pytest.raises(OSError, match="cannot open"):
        torch_save(module, {}, "/ckpt/m.pt")
    assert w.log == [("begin", True, "torch.save"), "zip open", ("end",)] and w.watch.depth == 0

    def refused(f: Any) -> Any:
        raise PermissionError(f)

    module._open_zipfile_writer = refused
    w.watch.patched.clear()
    w.watch.poll()
    with pytest.raises(PermissionError):
        torch_save(module, {}, "/ckpt/m.pt")
    assert w.log[-2:] == [("begin", True, "torch.save"), ("end",)] and w.watch.depth == 0


def test_a_writer_exited_twice_ends_its_checkpoint_once(w: Watched, plant: Callable[..., Any]) -> None:
    module = torch_serialization(plant, w.log)
    w.watch.poll()
    writer = module._open_zipfile_writer("/ckpt/m.pt")
    writer.__enter__()
    writer.__exit__(None, None, None)
    w.watch.depth = 1  # a save under way meanwhile: the second exit must not end it
    writer.__exit__(None, None, None)
    assert w.log.count(("end",)) == 1 and w.watch.depth == 1


def test_an_opener_on_another_thread_is_not_timed(w: Watched, plant: Callable[..., Any]) -> None:
    module = torch_serialization(plant, w.log)
    w.watch.poll()
    on_another_thread(lambda: torch_save(module, {}, "/ckpt/m.pt"))
    assert w.log == ["zip open", ("_save", ({}, "zip handle"), {}), "zip end"] and w.watch.depth == 0


# --- the publisher's side --------------------------------------------------------------------------------------


class Hook:
    def __init__(self) -> None:
        self.asked: list[Any] = []
        self.observed: list[float] = []

    def series(self, kind: str, name: str, builtin: bool = False) -> Any:
        self.asked.append((kind, name, builtin))
        return types.SimpleNamespace(observe=self.observed.append)


def test_the_publisher_polls_and_hands_each_duration_to_the_histogram_once(w: Watched,
                                                                          plant: Callable[..., Any]) -> None:
    hook = Hook()
    w.watch.sample(hook)
    assert hook.asked == [], "no checkpoint: no series"
    module = safetensors(plant, w.log)
    w.watch.sample(hook)
    assert marked(module.serialize_file)
    module.serialize_file({}, "/ckpt/m")
    module.serialize_file({}, "/ckpt/m")
    w.watch.sample(hook)
    assert hook.asked == [("histogram", "outrider_train_checkpoint_duration_seconds", True)]
    assert hook.observed == [1.0, 1.0] and not w.watch.durations
    w.watch.sample(hook)
    assert len(hook.asked) == 1


def test_attach_wires_the_watch_to_the_hooks_parts(plant: Callable[..., Any]) -> None:
    log: list[Any] = []
    steps, loop, drops = StepState(), LoopAccounting(), []
    module = safetensors(plant, log)
    watch = tc.attach(steps, loop, Progress(log), drops.append)
    assert watch is not None
    try:
        module.serialize_file({}, "/ckpt/m")
        assert [e[0] for e in log] == ["begin", "serialize_file", "end"] and len(loop.checkpoints) == 1
        steps.loop_tid = on_another_thread(threading.get_native_id)
        module.serialize_file({}, "/ckpt/m")
        assert len(loop.checkpoints) == 1, "the steps' loop thread is another one now"
        steps.loop_tid = 0

        class Unreadable:
            @property
            def closed(self) -> bool:
                raise RuntimeError("no state")

            def close(self) -> None:
                pass

        plant("fsspec.spec", AbstractBufferedFile=Unreadable)
        watch.poll()
        Unreadable().close()
        assert drops == ["checkpoint_error"]
    finally:
        watch.detach()


def test_a_distributed_checkpoint_is_classified_by_its_keyword_writer(w: Watched, plant: Callable[..., Any]) -> None:
    module = plant("torch.distributed.checkpoint.state_dict_saver", _save_state_dict=recorder(w.log, "save"))
    w.watch.poll()
    remote = types.SimpleNamespace(fs=object())
    module._save_state_dict({}, storage_writer=remote)
    assert w.log[0] == ("begin", False, "torch.distributed.checkpoint") and w.drops == []


def test_a_module_is_patched_once_and_a_function_replaced_since_is_left_alone(w: Watched,
                                                                              plant: Callable[..., Any]) -> None:
    module = safetensors(plant, w.log)
    w.watch.poll()
    mine = recorder(w.log, "mine")
    module.serialize_file = mine
    w.watch.poll()
    assert module.serialize_file is mine
