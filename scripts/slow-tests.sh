#!/usr/bin/env bash
# The slow set (pytest marker `slow`), left out of CI's command for the time it takes (docs: README.md, "The slow
# set"): the diagnosis workloads each run alone (CI runs each beside a CPU hog, the harder case) and a memory leak
# paced to the kernel's OOM kill. Run after .ci/run has installed everything; about 8 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m pytest -q -m slow "$@"
