#!/usr/bin/env bash
# test.sh — installs what tdpipe needs, builds everything this machine can, and
# runs the whole test suite (ctest; GPU tests report themselves as skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# Optional: HTA for cli.trace-hta (PyPI); without it that test is reported as skipped.
./scripts/install-deps.sh --python || echo "test.sh: no Python environment with HTA; cli.trace-hta will be skipped" >&2
cmake --preset default >/dev/null
cmake --build --preset default
ctest --preset default -j "$(nproc)" "$@"
