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
    if not stat.S_ISREG(os.stat(path).st_mode):  # never a FIFO or a device, whose read could block the sweep
        raise ValueError("not a regular file")
    with open(path, "rb") as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"more than {MAX_BYTES} bytes")
    return parse_annotations(data.decode("utf-8", "replace"))
