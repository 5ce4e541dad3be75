"""The agent a hooked process runs itself when no agent holds its spool (standalone mode).

This is the one entry point from the hook into the agent: `outrider.hook.election` imports it by name, late,
only in the process that won the spool's lock. That process then serves /metrics for every process publishing to
the spool (all ranks of a job on the node, all workers of a server). Its agent leaves out the `self` collector,
which would measure the workload as if it were the agent, and evaluates alert rules only if OUTRIDER_RULE_FILES
(or a config file) asks: by default alerting is left to a sidecar, `outrider run` or Prometheus.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any

from outrider.agent import Agent
from outrider.config import load

LOG = logging.getLogger("outrider.hook")


def start_in_process_agent(spool_dir: str, listen: str | None) -> Any:
    loaded = load()
    config = loaded.config
    rule_files = config.rule_files if loaded.sources["rule_files"] != "default" else ()
    config = dataclasses.replace(config, spool_dir=spool_dir, collectors=("host", "process", "hook", "alerts"),
                                 listen=listen or config.listen, rule_files=rule_files)
    agent = Agent(config, roots=(os.getpid(),), listen_fallback=True, hold_spool_lock=False)
    agent.start()
    print(f"outrider: no agent found on {spool_dir}; serving {agent.server.url}/metrics from pid {os.getpid()}",
          file=sys.stderr)
    return agent
