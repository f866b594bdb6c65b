#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release
ctest --preset release -j "$(nproc)" --timeout 900
