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
from outrider.collectors.hook import HookCollector
from outrider.ground.config import Config
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
    """A file object torch.save writes into, on a real local file: each write goes to it in CHUNK pieces, each full
    one after a pause of `pause_s`, as a slow disk, while `go_on()` says so (then the rest is dropped: the test has
    seen what it waited for); every piece is flushed to the page cache (it counts as written). Small writes (the
    zip's headers, the pickle) go at once."""

    def __init__(self, path: Path, pause_s: float, go_on: Callable[[], bool] = lambda: True,
                 write_data: bool = True) -> None:
        self.fh = open(path, "wb")  # noqa: SIM115 (closed in close())
        self.pause_s = pause_s
        self.go_on = go_on
        self.write_data = write_data

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        """The real file's: a file object on local storage, whose writes /proc/self/io counts (a save into it is a
        local one; one into a buffer or an upload is not)."""
        return self.fh.fileno()

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


class NetworkFile(io.RawIOBase):
    """A file object with no descriptor whose writes go nowhere local, slowly (a socket to object storage, an
    s3fs file): each CHUNK after a pause of `pause_s`, none of it reaching this machine's storage."""

    def __init__(self, pause_s: float) -> None:
        self.pause_s = pause_s
        self.sent = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = len(memoryview(data).cast("B"))
        for _ in range(n // CHUNK):
            time.sleep(self.pause_s)
        self.sent += n
        return n


def test_a_save_to_the_network_that_writes_nothing_locally_is_no_stall(tmp_path: Path, hooked: Hook) -> None:
    """torch.save into a file object that streams to object storage: /proc/self/io sees no write, which for a local
    save means hung. It was called a stall once the step threshold passed (5 minutes in production, paged at 7):
    a save to the network is judged by its own limit alone."""
    train(20)
    hooked.flush()
    threshold = hooked.progress._step_threshold()
    seen: list[bool] = []
    dest = NetworkFile(pause_s=0.05)
    original = dest.write

    def write(data: Any) -> int:
        seen.append(hooked.progress.checkpoint_local)
        return original(data)

    dest.write = write  # type: ignore[method-assign]
    t0 = time.perf_counter()
    torch.save({"weights": torch.zeros(16 << 20, dtype=torch.uint8)}, dest)  # 64 pieces: about 3 s
    took = time.perf_counter() - t0
    assert took > 2 * threshold, "the save outlasted the stall threshold"
    assert seen and not any(seen), "a save into a file object without a local file is a network save"
    train(3)
    hooked.flush()
    assert hooked.progress.stalls == 0 and not stall_messages(tmp_path)
    assert hooked.progress.checkpoints == 1


def test_an_upload_through_fsspec_is_a_checkpoint_to_the_network(tmp_path: Path, hooked: Hook) -> None:
    """`with fsspec.open("s3://...", "wb") as f: torch.save(state, f)`: the save writes into fsspec's buffer, and the
    file uploads what is left when closed, after torch.save returned. Both are checkpoints to the network: the close
    took the steps past the stall threshold and was called a stall. The filesystem is a real fsspec implementation
    (AbstractFileSystem with AbstractBufferedFile) whose uploads are slow and leave nothing on local storage."""
    fsspec = pytest.importorskip("fsspec")
    from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

    uploads: list[tuple[int, bool]] = []

    class SlowUpload(AbstractBufferedFile):  # type: ignore[misc]
        def _initiate_upload(self) -> None:
            pass

        def _upload_chunk(self, final: bool = False) -> bool:
            data = self.buffer.getvalue()
            uploads.append((len(data), hooked.progress.checkpoint_local))
            time.sleep(0.05 * max(1, len(data) // CHUNK))  # the network's pace
            return True

    class SlowObjectStore(AbstractFileSystem):  # type: ignore[misc]
        protocol = "outrider-slow-object-store"

        def _open(self, path: str, mode: str = "rb", block_size: int | None = None, **kwargs: Any) -> SlowUpload:
            # parts of 64 MiB: the save's 12 MiB stay in the buffer until the close uploads them
            return SlowUpload(self, path, mode, block_size=64 << 20, **kwargs)

    fsspec.register_implementation(SlowObjectStore.protocol, SlowObjectStore, clobber=True)
    train(20)
    hooked.flush()
    threshold = hooked.progress._step_threshold()
    api.S.torch.checkpoints.poll()  # type: ignore[union-attr]  # the publisher's next look at sys.modules, now
    f = fsspec.open(f"{SlowObjectStore.protocol}://bucket/ckpt.pt", "wb").open()
    torch.save({"weights": torch.zeros(12 << 20, dtype=torch.uint8)}, f)  # into fsspec's buffer (below a part)
    t0 = time.perf_counter()
    f.close()  # the whole 12 MiB uploaded by the close, after torch.save returned
    took = time.perf_counter() - t0
    assert took > 2 * threshold, "the close's upload alone outlasted the stall threshold"
    assert [local for _, local in uploads] == [False], "uploaded in a checkpoint to the network"
    train(3)
    hooked.flush()
    assert hooked.progress.stalls == 0 and not stall_messages(tmp_path)
    assert hooked.progress.checkpoints == 2, "the save, and the close that finished the upload"


@pytest.mark.parametrize(("writer", "local"), [("filesystem", True), ("fsspec", False)])
def test_a_distributed_checkpoints_storage_writer_says_where_it_writes(tmp_path: Path, hooked: Hook, writer: str,
                                                                      local: bool) -> None:
    """dcp.save through torch's FileSystemWriter writes local files; through an fsspec writer (object storage; here
    fsspec's in-memory filesystem) it writes where /proc/self/io never looks."""
    pytest.importorskip("fsspec")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    api.S.torch.checkpoints.poll()  # type: ignore[union-attr]  # the publisher's next look, now
    train(5)
    storage = FileSystemWriter(str(tmp_path / "dcp")) if writer == "filesystem" else \
        FsspecWriter(f"memory://outrider-test-{tmp_path.name}")
    seen: list[bool] = []
    original = storage.write_data

    def write_data(*args: Any, **kwargs: Any) -> Any:
        seen.append(hooked.progress.checkpoint_local)
        return original(*args, **kwargs)

    storage.write_data = write_data  # type: ignore[method-assign]
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": train.model.state_dict()}, storage_writer=storage)  # type: ignore[attr-defined]
    assert seen == [local]
    assert hooked.progress.checkpoints == 1


def test_an_upload_through_boto3_is_a_checkpoint_to_the_network(tmp_path: Path, hooked: Hook) -> None:
    """A checkpoint uploaded with boto3 after a local save (client.upload_file, client.upload_fileobj) to an S3
    endpoint: a real boto3 client against a local HTTP server that answers each PUT after 3 s, as a slow link
    would. Steps pause while it uploads; it writes nothing to local storage: it was a stall past the threshold."""
    boto3 = pytest.importorskip("boto3")
    import http.server

    class SlowS3(http.server.BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(3.0)
            self.send_response(200)
            self.send_header("ETag", '"0"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowS3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        def client() -> Any:
            return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{server.server_port}", region_name="us-east-1",
                                aws_access_key_id="test", aws_secret_access_key="test")

        client()  # boto3 binds its S3 transfer methods when a client's class is first made
        api.S.torch.checkpoints.poll()  # type: ignore[union-attr]  # the publisher's next look at sys.modules, now
        s3 = client()
        train(20)
        hooked.flush()
        threshold = hooked.progress._step_threshold()
        torch.save(train.model.state_dict(), tmp_path / "ckpt.pt")  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        s3.upload_file(str(tmp_path / "ckpt.pt"), "bucket", "ckpt.pt")
        with open(tmp_path / "ckpt.pt", "rb") as fh:
            s3.upload_fileobj(fh, "bucket", "ckpt-copy.pt")
        took = time.perf_counter() - t0
        assert took > 2 * threshold, "the uploads outlasted the stall threshold"
        train(3)
        hooked.flush()
        assert hooked.progress.stalls == 0 and not stall_messages(tmp_path)
        assert hooked.progress.checkpoint_kinds["boto3 upload"][0] == 2, "each upload a checkpoint"
        assert not hooked.progress.checkpoint_local
    finally:
        server.shutdown()
        server.server_close()
