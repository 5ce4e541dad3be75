"""What the hook (inside the workload's process) and the agent share, standard library only: the spool, their
one contract (spool), the log-bucketed distribution both record (sketch), the names Prometheus keeps for
itself (prometheus_names) and Outrider's version (version).

No imports here: the hook imports these modules into the user's process, which must not pay for their
siblings; each module has its own floor (pyproject.toml's layers).
"""
