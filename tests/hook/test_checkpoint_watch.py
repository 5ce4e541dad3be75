"""The checkpoint watch's patches against its detach (hook/torch_checkpoint.py).

The publisher thread polls sys.modules and patches the save functions of modules imported since; detach() (a
replaced hook, the tests' fixtures) runs on another thread. A poll that raced a detach once put the old watch's
wrapper back on torch.serialization for good: the next hook saw its mark and refused to patch, so that hook timed no
checkpoint (a CI run: `checkpoint_duration_seconds_count` absent, `_save` still marked after detach). safetensors'
module name stands in for any target imported after instrument(): a plain module object, no torch needed.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

from outrider.hook.state import LoopAccounting, StepState
from outrider.hook.torch_checkpoint import CheckpointWatch

TARGET = "safetensors.torch"


def serialize_file(*args: Any, **kwargs: Any) -> str:
    return "saved"


class Progress:
    open_phases: tuple[str, ...] = ()

    def checkpoint_begin(self, local_storage: bool = True, kind: str = "") -> None:
        pass

    def checkpoint_end(self) -> None:
        pass


def watch() -> CheckpointWatch:
    drops: list[str] = []
    return CheckpointWatch(StepState(), LoopAccounting(), Progress(), drops.append)


class Module(types.ModuleType):
    """A module that runs `on_read` the first time its save function is read: the moment between the poll's
    look at sys.modules and its patch, where the detach of a racing thread can fall."""

    def __init__(self, name: str, on_read: Callable[[], None] | None = None) -> None:
        super().__init__(name)
        self.on_read = on_read
        self.serialize_file = serialize_file

    def __getattribute__(self, name: str) -> Any:
        if name == "serialize_file":
            on_read = super().__getattribute__("on_read")
            if on_read is not None:
                self.on_read = None
                on_read()
        return super().__getattribute__(name)


def test_a_module_imported_after_instrument_is_patched_and_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    module = Module(TARGET)
    w = watch()
    monkeypatch.setitem(sys.modules, TARGET, module)
    w.poll()
    assert module.serialize_file is not serialize_file
    assert getattr(module.serialize_file, "__outrider_checkpoint__", False)
    assert module.serialize_file("x") == "saved"
    w.detach()
    assert module.serialize_file is serialize_file
    w.detach()
    assert module.serialize_file is serialize_file


def test_a_detached_watch_patches_nothing_imported_later(monkeypatch: pytest.MonkeyPatch) -> None:
    w = watch()
    w.detach()
    module = Module(TARGET)
    monkeypatch.setitem(sys.modules, TARGET, module)
    w.poll()
    assert module.serialize_file is serialize_file
    fresh = watch()
    assert getattr(module.serialize_file, "__outrider_checkpoint__", False), "a fresh watch still patches it"
    fresh.detach()


def test_a_detach_while_the_poll_patches_leaves_the_original(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w = watch()
    module = Module(TARGET, on_read=lambda: w.detach())
    monkeypatch.setitem(sys.modules, TARGET, module)
    w.poll()
    assert module.serialize_file is serialize_file, "the old watch's wrapper was left on the module"
    fresh = watch()
    assert getattr(module.serialize_file, "__outrider_checkpoint__", False), "the next watch patches it"
    fresh.detach()
    assert module.serialize_file is serialize_file
