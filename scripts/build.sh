#!/usr/bin/env bash
# Configures and builds one CMake preset (release by default) after making sure the dependencies
# are installed. Usage: scripts/build.sh [preset]. Quiet when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
bash scripts/setup.sh
# TSan needs an instrumented oneTBB (scripts/tbb_tsan.sh says why).
if [ "$preset" = tsan ]; then
  bash scripts/tbb_tsan.sh
fi
if [ ! -f "build/$preset/build.ninja" ]; then
  cmake --preset "$preset" >/dev/null
fi
jobs=${KD_JOBS:-$(nproc)}
cmake --build --preset "$preset" -j "$jobs"
# kdflow's Python module: the venv's python finds the release build's (a .pth file naming it).
if [ "$preset" = release ] && [ -d build/release/python/kdflow ] && [ -f .kdflow-venv ]; then
  for site in "$(cat .kdflow-venv)"/lib/python3*/site-packages; do
    echo "$PWD/build/release/python" >"$site/kdflow-build.pth"
  done
fi
