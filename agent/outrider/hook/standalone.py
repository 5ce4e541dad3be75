"""Standalone mode: with no agent on the spool, one instrumented process runs the agent on a thread of its own.

The process that takes the spool's lock serves /metrics for every process publishing to that spool (all ranks of
a job on the node, all workers of a server). Its agent leaves out the `self` collector, which would measure the
workload as if it were the agent, and evaluates alert rules only if OUTRIDER_RULE_FILES (or a config file) asks.
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

    loaded = load()
    config = loaded.config
    # Rule evaluation would run in the workload's own process (the PromQL parser, an evaluation every interval):
    # only where the user asked for it. By default the in-process agent serves metrics and leaves alerting to a
    # sidecar, `outrider run` or Prometheus.
    rule_files = config.rule_files if loaded.sources["rule_files"] != "default" else ()
    config = dataclasses.replace(config, spool_dir=spool_dir, collectors=("host", "process", "hook", "alerts"),
                                 listen=listen or config.listen, rule_files=rule_files)
    agent = Agent(config, roots=(os.getpid(),), listen_fallback=True, hold_spool_lock=False)
    agent.start()
    print(f"outrider: no agent found on {spool_dir}; serving {agent.server.url}/metrics from pid {os.getpid()}",
          file=sys.stderr)
    return agent
