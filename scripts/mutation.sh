#!/usr/bin/env bash
# Mutation testing of the core modules (mutmut; docs/mutation.md): `scripts/mutation.sh` runs every module of
# scripts/mutation.toml, `scripts/mutation.sh config spool` those, `--changed` only those whose source changed
# (CI: `--changed --budget 300`), `--table` prints the last scores. Each module is tested with its own unit tests.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/mutation.py "$@"
