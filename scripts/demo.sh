#!/usr/bin/env bash
# demo.sh — installs what tdpipe needs, builds it, and compares every schedule on
# the built-in default scenario (GPT-3 175B on 8×8 A100).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default
./build/default/apps/tdpipe sim scenarios/gpt3-175b-a100-8x8.yaml --schedule all "$@"
