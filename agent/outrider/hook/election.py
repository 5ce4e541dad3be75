"""Standalone mode: with no agent on the spool, one instrumented process runs the agent in-process.

The process that takes the spool's agent lock starts the agent through ONE late, documented entry point,
`outrider.standalone.start_in_process_agent(spool_dir, listen)`, imported by name at that moment only. It is the
single place where the hook reaches the agent side (import-linter's contracts keep every other path closed); a
process that never becomes the agent never imports a module of the agent or a third-party package.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
from typing import Any

from outrider import spool

LOG = logging.getLogger("outrider.hook")
AGENT_ENTRY_POINT = "outrider.standalone"
ELECTION_RETRY_S = 5.0


class Election:
    def __init__(self, spool_dir: str, listen: str, explicit: bool, trusted_uids: frozenset[int]) -> None:
        self.spool_dir = spool_dir
        self.listen = listen
        self.explicit = explicit
        self.trusted_uids = trusted_uids
        self.agent: Any = None  # the in-process agent; False after it failed to start (not retried)
        self._lock_fd: int | None = None
        self._next_try = 0.0

    def maybe_become_agent(self) -> None:
        """Every ELECTION_RETRY_S: take the lock if free and start the agent; a failure is logged once."""
        if self.agent is not None or time.monotonic() < self._next_try:
            return
        self._next_try = time.monotonic() + ELECTION_RETRY_S
        try:
            spool.prepare_dir(self.spool_dir, private=not self.explicit, trusted_uids=self.trusted_uids)
            fd = spool.try_lock(self.spool_dir)
        except OSError:
            return  # the publisher says why the spool is unusable
        if fd is None:
            return  # a sidecar or another process of this job is the agent
        self._lock_fd = fd
        try:
            entry = importlib.import_module(AGENT_ENTRY_POINT)
            self.agent = entry.start_in_process_agent(self.spool_dir, self.listen or None)
        except Exception as e:
            LOG.warning("outrider: could not start the in-process agent: %s", e)
            self.agent = False

    def stop(self) -> None:
        if self.agent:
            with contextlib.suppress(Exception):
                self.agent.stop()

    def after_fork_in_child(self) -> None:
        """The child neither holds the lock nor runs the parent's agent; closing the fd leaves the lock with the
        parent (flock locks belong to the open file, which the parent still has open)."""
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None
        self.agent = None
        self._next_try = 0.0
