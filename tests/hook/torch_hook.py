"""instrument() with torch imported, for the tests of the torch integration: the hook's state made anew, publishing
to the test's directory, and torch's classes put back afterwards; and a read of what it published."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import outrider
from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.ground.config import Config
from outrider.hook import api
from outrider.hook.runtime import Hook
from outrider.metrics.exposition import render
from tests.helpers import samples


@contextmanager
def torch_hooked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> Iterator[Hook]:
    """env: more OUTRIDER_* settings (OUTRIDER_FLUSH_INTERVAL_S, ...)."""
    monkeypatch.setattr(api, "S", api.HookState())
    monkeypatch.setenv("OUTRIDER_SPOOL_DIR", str(tmp_path))
    monkeypatch.setenv("OUTRIDER_STANDALONE", "false")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert outrider.instrument()
    assert api.S.hook is not None and api.S.torch is not None
    try:
        yield api.S.hook
    finally:
        api.S.hook.stop()
        api.S.torch.detach()


def read(tmp_path: Path, hook: Hook) -> dict:  # type: ignore[type-arg]
    """What the hook published, as the agent exports it (one flush first)."""
    hook.flush()
    c = HookCollector(CollectorContext(Config(spool_dir=str(tmp_path)), hold_spool_lock=False))
    return samples(render(c.collect()).decode())
