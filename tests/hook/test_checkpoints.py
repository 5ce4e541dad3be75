"""Checkpoints with zero configuration: torch.save on the loop's thread is a checkpoint, timed as its own part of the
loop; a long one that writes is not a stall, one that overruns its learned duration or writes nothing is; heavy
writes between steps (a save through another library) hold the stall too; a save on another thread is not the
loop's.

The saves are real torch.save calls into a real file in tmp_path, slowed by a file-like object whose write() pauses
between chunks (the machine's own disk would be too fast to outlast a stall threshold)."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import outrider
from outrider.collectors.base import CollectorContext
from outrider.collectors.hooked_processes import HookCollector
from outrider.config import Config
from outrider.hook import api, progress
from outrider.hook.runtime import Hook
from outrider.metrics.exposition import render
from tests.helpers import samples, value, wait_until

torch = pytest.importorskip("torch")
CHUNK = 256 * 1024

pytestmark = pytest.mark.skipif(progress.written_bytes() is None, reason="no task I/O accounting in this kernel")


@pytest.fixture
def hooked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hook]:
    """instrument() with torch imported: a stall floor of 1 s, so a save of a few seconds outlasts it."""
    monkeypatch.setattr(api, "S", api.HookState())
    monkeypatch.setenv("OUTRIDER_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.setenv("OUTRIDER_STANDALONE", "false")
    monkeypatch.setenv("OUTRIDER_STALL_FLOOR_S", "1")
    monkeypatch.setenv("OUTRIDER_FLUSH_INTERVAL_S", "0.1")
    assert outrider.instrument()
    assert api.S.torch is not None
    yield api.S.hook
    api.S.hook.stop()
    api.S.torch.detach()


class SlowFile(io.RawIOBase):
    """A file-like torch.save writes into: each write goes to a real file in CHUNK pieces, each full one after a
    pause of `pause_s`, as a slow disk, while `go_on()` says so (then the rest is dropped: the test has seen what it
    waited for); every piece is flushed to the page cache (it counts as written). Small writes (the zip's headers,
    the pickle) go at once."""

    def __init__(self, path: Path, pause_s: float, go_on: Callable[[], bool] = lambda: True,
                 write_data: bool = True) -> None:
        self.fh = open(path, "wb")  # noqa: SIM115 (closed in close())
        self.pause_s = pause_s
        self.go_on = go_on
        self.write_data = write_data

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for at in range(0, len(view), CHUNK):
            if not self.go_on():
                break
            if len(view) - at >= CHUNK:
                time.sleep(self.pause_s)
            if self.write_data:
                self.fh.write(view[at:at + CHUNK])
                self.fh.flush()
        return len(view)

    def close(self) -> None:
        self.fh.close()
        super().close()


def train(steps: int) -> None:
    model = train.model  # type: ignore[attr-defined]
    opt = train.opt  # type: ignore[attr-defined]
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(8, 16)).sum().backward()
        opt.step()
        time.sleep(0.005)


@pytest.fixture(autouse=True)
def model() -> None:
    train.model = torch.nn.Linear(16, 16)  # type: ignore[attr-defined]
    train.opt = torch.optim.SGD(train.model.parameters(), lr=0.01)  # type: ignore[attr-defined]


def read(tmp_path: Path, hook: Hook) -> dict:  # type: ignore[type-arg]
    hook.flush()
    c = HookCollector(CollectorContext(Config(spool_dir=str(tmp_path / "spool")), hold_spool_lock=False))
    return samples(render(c.collect()).decode())


def stall_messages(tmp_path: Path, expect: str = "") -> str:
    """The stack dumps beside the shard; with `expect`, once one holds it (the publisher counts a stall a moment
    before it has written its dump: polled, with a generous bound)."""
    def read() -> str:
        return "".join(p.read_text() for p in (tmp_path / "spool").glob("*.stacks.txt"))
    if expect:
        return wait_until(lambda: (lambda text: text if expect in text else None)(read()), timeout_s=30,
                          what=f"a stack dump saying {expect!r}")
    return read()


def test_a_long_undeclared_torch_save_that_writes_is_no_stall_and_is_its_own_part_of_the_loop(
        tmp_path: Path, hooked: Hook) -> None:
    train(20)
    hooked.flush()
    threshold = hooked.progress._step_threshold()
    blob = torch.zeros(16 << 20, dtype=torch.uint8)  # 16 MiB: 64 pieces, about 5 MiB/s
    t0 = time.perf_counter()
    with SlowFile(tmp_path / "ckpt.pt", pause_s=0.05) as fh:
        torch.save({"weights": blob}, fh)
    took = time.perf_counter() - t0
    assert took > 2 * threshold, "the save outlasted the stall threshold: without the checkpoint it is a stall"
    train(5)
    parsed = read(tmp_path, hooked)
    assert hooked.progress.stalls == 0 and not stall_messages(tmp_path)
    assert hooked.progress.checkpoints == 1 and hooked.progress.checkpoint_longest <= took
    assert value(parsed, "outrider_train_checkpoint_duration_seconds_count") == 1
    saved = value(parsed, "outrider_train_checkpoint_duration_seconds_sum")
    loop = {part: value(parsed, "outrider_train_loop_seconds_total", part=part) for part in ("checkpoint", "other")}
    assert saved and loop["checkpoint"] == pytest.approx(saved, rel=1e-6), "the whole save is the checkpoint part"
    assert loop["other"] is not None and loop["other"] < loop["checkpoint"], "and it is no longer inside `other`"


def test_a_checkpoint_far_past_its_learned_duration_is_a_stall_though_it_writes(tmp_path: Path,
                                                                                hooked: Hook) -> None:
    train(20)
    torch.save(train.model.state_dict(), tmp_path / "first.pt")  # type: ignore[attr-defined]  # learned: fast
    train(5)
    hooked.flush()
    assert hooked.progress.checkpoints == 1
    learned = hooked.progress.checkpoint_longest
    limit = max(progress.CHECKPOINT_FACTOR * learned, hooked.progress._step_threshold())

    def until_stalled() -> bool:
        return not hooked.progress.stalled_since_ns

    blob = torch.zeros(64 << 20, dtype=torch.uint8)  # 256 pieces: more than it takes to stall
    t0 = time.perf_counter()
    with SlowFile(tmp_path / "second.pt", pause_s=0.02, go_on=until_stalled) as fh:
        torch.save({"weights": blob}, fh)  # writes on until the hook calls it stalled
    took = time.perf_counter() - t0
    assert hooked.progress.stalls == 1, f"no stall in a {took:.1f} s checkpoint against a limit of {limit:.1f} s"
    text = stall_messages(tmp_path, "checkpoint still running (3 x the longest of 1 earlier")
    assert "in write" in text, "the stacks show where the save is"
    train(3)
    hooked.flush()
    assert not hooked.progress.stalled_since_ns, "steps again: the stall is over"


def test_a_first_checkpoint_that_writes_nothing_is_a_stall_before_the_phase_timeout(tmp_path: Path,
                                                                                    hooked: Hook) -> None:
    train(20)
    hooked.flush()
    assert hooked.progress.phase_timeout_s == 3600.0

    def until_stalled() -> bool:
        return not hooked.progress.stalled_since_ns

    with SlowFile(tmp_path / "hung.pt", pause_s=0.02, go_on=until_stalled, write_data=False) as fh:
        torch.save({"weights": torch.zeros(64 << 20, dtype=torch.uint8)}, fh)  # hung: nothing reaches storage
    assert hooked.progress.stalls == 1
    assert "checkpoint running but writing nothing to storage" in stall_messages(
        tmp_path, "checkpoint running but writing nothing to storage")


def test_heavy_writes_between_steps_hold_the_stall_and_a_silent_pause_does_not(tmp_path: Path,
                                                                               hooked: Hook) -> None:
    """A save through a library the hook does not know (plain file writes here) while steps pause."""
    train(20)
    hooked.flush()
    threshold = hooked.progress._step_threshold()
    t0 = time.perf_counter()
    with open(tmp_path / "state.bin", "wb") as fh:
        while time.perf_counter() - t0 < 3 * threshold:
            fh.write(b"\1" * CHUNK)
            fh.flush()
            time.sleep(0.02)
    hooked.flush()
    assert hooked.progress.stalls == 0, "writing heavily: a checkpoint the hook cannot name"
    train(3)

    def stalled() -> bool:
        return hooked.progress.stalls == 1

    deadline = time.monotonic() + 60
    while not stalled() and time.monotonic() < deadline:
        time.sleep(0.05)  # a pause that writes nothing
    assert stalled()
    assert "no step completed after 23 steps" in stall_messages(tmp_path, "no step completed after 23 steps")


def test_a_save_on_another_thread_is_not_the_loops_checkpoint(tmp_path: Path, hooked: Hook) -> None:
    train(5)
    seen: list[float] = []

    def go_on() -> bool:
        seen.append(hooked.progress.checkpoint_since)
        return False

    def save() -> None:
        with SlowFile(tmp_path / "async.pt", pause_s=0.0, go_on=go_on) as fh:
            torch.save({"w": torch.zeros(1 << 18)}, fh)

    t = threading.Thread(target=save)
    t.start()
    t.join()
    assert seen and set(seen) == {0.0}, "no checkpoint opened for the loop while another thread saved"
    torch.save({"w": torch.zeros(4)}, tmp_path / "loop.pt")
    assert hooked.progress.checkpoints == 1, "the loop's own save is"


def test_a_save_inside_a_declared_checkpoint_phase_is_that_phase(tmp_path: Path, hooked: Hook) -> None:
    train(5)
    with outrider.phase("checkpoint"):
        torch.save({"w": torch.zeros(4)}, tmp_path / "declared.pt")
        assert not hooked.progress.checkpoint_since, "the declared phase holds the stall; no second checkpoint"
    assert "checkpoint" not in hooked.progress.open_phases


def test_a_distributed_checkpoint_imported_after_instrument_is_recognised(tmp_path: Path, hooked: Hook) -> None:
    """torch.distributed.checkpoint is not imported by `import torch`: the publisher patches it once it is."""
    import torch.distributed.checkpoint as dcp

    hooked.flush()
    train(5)
    with pytest.warns(UserWarning, match="single process"):  # no process group: dcp saves in this process
        dcp.save({"model": train.model.state_dict()}, checkpoint_id=str(tmp_path / "dcp"))  # type: ignore[attr-defined]
    train(2)
    assert hooked.progress.checkpoints == 1
    assert value(read(tmp_path, hooked), "outrider_train_checkpoint_duration_seconds_count") == 1


def test_the_whole_torch_save_is_the_checkpoint_its_zip_file_opened_and_finished_too(tmp_path: Path,
                                                                                     hooked: Hook) -> None:
    """torch.save opens its zip file and writes its end around `_save` (half of a 12 MB save's time, once left in
    the loop's `other`): the checkpoint is the whole call. Here the file's flush at the end takes 0.3 s, each of
    three times."""
    class SlowFlush(io.BytesIO):
        def flush(self) -> None:
            time.sleep(0.3)

    train(5)
    took = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        torch.save({"weights": torch.zeros(1024)}, SlowFlush())
        took += time.perf_counter() - t0
        train(2)
    parsed = read(tmp_path, hooked)
    saved = value(parsed, "outrider_train_checkpoint_duration_seconds_sum")
    assert value(parsed, "outrider_train_checkpoint_duration_seconds_count") == 3
    assert saved is not None and 3 * 0.3 <= saved <= took, (saved, took)
