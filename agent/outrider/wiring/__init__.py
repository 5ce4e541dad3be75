"""The running agent's wiring: the agent itself (wiring/agent.py: the sweep, the exporters and the alerting wired
together), the sweep loop (sampler), the agent's own alerting (alerting) and its exit with the workload
(lifecycle). Collecting, alerting and exporting know nothing of each other and meet here.

No imports here: each module has its own floor (pyproject.toml's layers), and importing one costs no other.
"""
