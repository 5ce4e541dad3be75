"""Copied by scripts/mutation.py into a module's work directory and loaded into mutmut's pytest runs (`-p`):
during the coverage pass, the hits the test's subprocesses wrote (sitecustomize.py) are merged into mutmut's own,
before its teardown hook files them under the test. A process still running when its test ends has its later hits
filed under the next test (the mutants it reaches are then run by that one as well). A test's fork (os.fork: no new
interpreter, so no sitecustomize) records the same way: its hits in memory would die with it."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

_read: dict[Path, int] = {}  # bytes of each hits file already merged


def _record_in_forked_child() -> None:
    if not os.environ.get("MUTMUT_SUBPROCESS_HITS") or os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    # sitecustomize.py beside this file, run as a module of another name (one called sitecustomize may be imported
    # already): under these conditions it installs its recorder
    with contextlib.suppress(Exception):  # never in the way of the test's child
        site = Path(__file__).with_name("sitecustomize.py")
        spec = importlib.util.spec_from_file_location("mutation_hits_site", site)
        if spec is not None and spec.loader is not None:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))


os.register_at_fork(after_in_child=_record_in_forked_child)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: Any, nextitem: Any) -> None:
    hits = os.environ.get("MUTMUT_SUBPROCESS_HITS")
    if not hits or os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    from mutmut.state import state

    for path in Path(hits).glob("*.hits"):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        end = data.rfind(b"\n") + 1  # whole lines only: a writer may be midway through one
        start = _read.get(path, 0)
        if end > start:
            state()._stats.update(data[start:end].decode().split())
            _read[path] = end
