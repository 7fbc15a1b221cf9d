#!/usr/bin/env bash
# test.sh — installs what tdpipe needs, builds everything this machine can, and
# runs the whole test suite (ctest; GPU tests report themselves as skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default
ctest --preset default -j "$(nproc)" "$@"
