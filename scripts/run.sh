#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the default job.
# Extra arguments go to `kdflow train` once it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release
./build/release/src/kdflow --version
