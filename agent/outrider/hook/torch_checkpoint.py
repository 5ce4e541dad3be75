"""Checkpoints with zero configuration: torch.save, torch.distributed.checkpoint's save and safetensors' save_file,
called on the training loop's thread, are timed as checkpoints.

Each outermost call is an implicit checkpoint: progress.py holds the stall back while it runs (see there for the
rule: its own learned duration, and whether the process writes), the loop's accounting (hook/loop.py) reports its
time as its own part (`outrider_train_loop_seconds_total{part="checkpoint"}`), and its duration is observed in
`outrider_train_checkpoint_duration_seconds`. A save on another thread (an asynchronous checkpointer, a logger
saving a sample) is not the loop's: it is left alone, so it never hides a hung loop. A save inside a declared
`outrider.phase("checkpoint")` is that phase's, not a second checkpoint.

What is patched is the function the public name calls, where there is one (`torch.serialization._save`, the
state-dict saver's `_save_state_dict`, safetensors' `serialize_file`), so a name the user bound before
instrument() (`from torch import save`) is timed too; else the public name. torch.save's zip file is opened and
finished around `_save` (`with _open_zipfile_writer(f)`: half of a 12 MB save's time is its opening and the writing
of its end), so that opener is timed too, from its call to its context's exit: the whole save. Modules imported
later (torch's checkpoint package and safetensors are not imported by `import torch`) are patched by the publisher
thread as soon as it sees them in sys.modules. Nothing here raises into user code: the save's own result or exception
reaches the caller unchanged.
"""

from __future__ import annotations

import collections
import functools
import logging
import sys
import threading
from collections.abc import Callable
from time import perf_counter
from typing import Any

from outrider.hook.state import LoopAccounting, StepState

LOG = logging.getLogger("outrider.hook")
CHECKPOINT = "checkpoint"
# (module, [inner functions the public ones call, else the public ones]): the first that exists is patched
TARGETS: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (
    ("torch.serialization", (("_save", "_legacy_save"), ("save",))),
    ("torch.distributed.checkpoint.state_dict_saver", (("_save_state_dict",), ("save", "save_state_dict"))),
    ("safetensors.torch", (("serialize_file",), ("save_file", "save_model"))),
)
# (module, context-manager factories whose whole `with` block is part of a save)
OPENERS: tuple[tuple[str, str], ...] = (("torch.serialization", "_open_zipfile_writer"),)


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
        self.patched: set[str] = set()
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
        for module_name, choices in TARGETS:
            if self.detached:
                return
            if module_name in self.patched:
                continue
            module = sys.modules.get(module_name)
            if module is None or _initializing(module):
                continue
            self.patched.add(module_name)
            for names in choices:
                if all(callable(getattr(module, n, None)) for n in names):
                    for name in names:
                        self._patch(module, name)
                    break
            for owner, name in OPENERS:
                if owner == module_name and callable(getattr(module, name, None)):
                    self._patch(module, name, self._timed_opener)

    def _patch(self, owner: Any, name: str,
               wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None) -> None:
        original = getattr(owner, name)
        if getattr(original, "__outrider_checkpoint__", False):
            return
        self.saved.append((owner, name, original))
        setattr(owner, name, (wrap or self._timed)(original))
        if self.detached:  # detach() ran meanwhile and may have put the originals back before this one
            setattr(owner, name, original)

    def detach(self) -> None:
        """Put the originals back, for good: a later poll patches nothing. Idempotent."""
        self.detached = True
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved.clear()

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        @functools.wraps(original)
        def save(*args: Any, **kwargs: Any) -> Any:
            mine = watch._enter()
            try:
                return original(*args, **kwargs)
            finally:
                if mine:
                    watch._exit()

        save.__outrider_checkpoint__ = True  # type: ignore[attr-defined]
        return save

    def _timed_opener(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """A context-manager factory whose call and `with` block are timed as one save."""
        watch = self

        @functools.wraps(original)
        def opener(*args: Any, **kwargs: Any) -> Any:
            mine = watch._enter()
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

    def _enter(self) -> bool:
        try:
            if not self._on_loop_thread():
                return False
            self.depth += 1
            if self.depth == 1:
                self.begin = self.clock()
                self.owned = CHECKPOINT not in self.progress.open_phases
                if self.owned:
                    self.progress.checkpoint_begin()
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
