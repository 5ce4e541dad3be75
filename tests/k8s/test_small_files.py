"""The files the node agent reads from the kubelet's volumes: the Downward API's annotations and the service
account's token (k8s/downward.read_small_file). A FIFO or a device in their place must never block the sweep: not
when it is there from the start, and not when it is swapped in between a look at the file and its open."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from outrider.k8s.downward import MAX_BYTES, read_annotations, read_small_file


def test_a_regular_file_behind_the_kubelets_links_is_read_up_to_its_cap(tmp_path: Path) -> None:
    data = tmp_path / "..2026_12_02" / "annotations"
    data.parent.mkdir()
    data.write_text('outrider.dev/metrics-port="9400"\n')
    (tmp_path / "..data").symlink_to(data.parent.name)
    (tmp_path / "annotations").symlink_to("..data/annotations")
    assert read_annotations(str(tmp_path / "annotations")) == {"outrider.dev/metrics-port": "9400"}
    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * 16)
    assert read_small_file(str(exact), 16) == b"x" * 16
    with pytest.raises(ValueError, match="more than 15 bytes"):
        read_small_file(str(exact), 15)
    big = tmp_path / "big"
    big.write_bytes(b'a="b"\n' * (MAX_BYTES // 6 + 1))
    with pytest.raises(ValueError, match=f"more than {MAX_BYTES} bytes"):
        read_annotations(str(big))


def test_a_fifo_a_directory_and_a_missing_file_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        with pytest.raises(ValueError, match="not a regular file"):
            read_small_file(str(path), 64)
    with pytest.raises(FileNotFoundError):
        read_small_file(str(tmp_path / "absent"), 64)


def test_a_fifo_swapped_in_while_the_file_is_read_never_blocks_the_reader(tmp_path: Path) -> None:
    """Another thread renames a regular file and a FIFO over the path, over and over, while the reader reads it
    thousands of times: each read returns the file or refuses the FIFO. Reading with a look first and an open after
    blocked, at the first swap that fell between them, until a writer came (here: never)."""
    path = tmp_path / "token"
    regular, fifo = tmp_path / "regular", tmp_path / "fifo"
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            regular.write_text("token")
            os.replace(regular, path)
            os.mkfifo(fifo)
            os.replace(fifo, path)

    results = {"read": 0, "refused": 0, "absent": 0}

    def read() -> None:
        for _ in range(20_000):
            try:
                assert read_small_file(str(path), 64) == b"token"
                results["read"] += 1
            except ValueError:
                results["refused"] += 1
            except FileNotFoundError:
                results["absent"] += 1

    swapper = threading.Thread(target=swap, daemon=True)
    reader = threading.Thread(target=read, daemon=True)
    swapper.start()
    reader.start()
    reader.join(timeout=300)
    stop.set()
    blocked = reader.is_alive()
    if blocked:  # try to let the blocked open return (never blocking here: a daemon thread otherwise)
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    swapper.join(timeout=60)
    assert not blocked, f"the reader blocked on a FIFO after {results}"
    assert results["read"] and results["refused"], results
