"""The pod's annotations, from a Downward API volume file (`fieldRef: metadata.annotations`).

The kubelet writes one `key="value"` line per annotation, the value quoted as Go's strconv.Quote does, and updates
the file when the annotations change; the file is a link into the volume's current data (the kubelet swaps the
data atomically), so it is followed. Read whole (at most MAX_BYTES: the API server caps a pod's annotations at
256 KiB), each line on its own: a line that is not `key="value"`, or a value whose escapes JSON does not share
with Go (\\a, \\v, \\x..), is left out.
"""

from __future__ import annotations

import json
import os
import stat

MAX_BYTES = 512 << 10


def parse_annotations(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, quoted = line.partition("=")
        if not sep or not key or not quoted.startswith('"'):
            continue
        try:
            value = json.loads(quoted)
        except ValueError:
            continue
        if isinstance(value, str):
            out[key] = value
    return out


def read_annotations(path: str) -> dict[str, str]:
    """The annotations in the file at `path`; OSError when it cannot be read, ValueError when it is too large."""
    return parse_annotations(read_small_file(path, MAX_BYTES).decode("utf-8", "replace"))


def read_small_file(path: str, max_bytes: int) -> bytes:
    """A regular file's first max_bytes + 1 bytes, following links (the kubelet's volumes are links into their
    current data). Never a FIFO or a device, whose open or read could block the sweep: the file is opened without
    blocking and checked on its descriptor, so a swap between a check and the open cannot slip one in. OSError when
    it cannot be opened; ValueError when it is not a regular file or holds more than max_bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ValueError(f"more than {max_bytes} bytes")
    return data
