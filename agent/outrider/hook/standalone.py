"""Standalone mode: with no agent on the spool, one instrumented process runs the agent on a thread of its own.

The process that takes the spool's lock serves /metrics for every process publishing to that spool (all ranks of
a job on the node, all workers of a server). Its agent leaves out the `self` collector, which would measure the
workload as if it were the agent.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any

LOG = logging.getLogger("outrider.hook")


def start_in_process_agent(spool_dir: str, listen: str | None) -> Any:
    from outrider.agent import Agent
    from outrider.config import load

    config = load().config
    config = dataclasses.replace(config, spool_dir=spool_dir, collectors=("host", "process", "hook", "alerts"),
                                 listen=listen or config.listen)
    agent = Agent(config, roots=(os.getpid(),), listen_fallback=True, hold_spool_lock=False)
    agent.start()
    print(f"outrider: no agent found on {spool_dir}; serving {agent.server.url}/metrics from pid {os.getpid()}",
          file=sys.stderr)
    return agent
