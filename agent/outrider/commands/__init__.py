"""The commands: what `outrider` runs on its own, one module each: the command line and its subcommands
(cli), `outrider run` (runner), the standalone agent a hooked workload starts (standalone), `outrider top`
(top) and `outrider demo` (demo/). They start the agent whole (wiring/agent.py), never its parts.

No imports here: each module has its own floor (pyproject.toml's layers), and importing one costs no other.
"""
