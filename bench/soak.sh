#!/usr/bin/env bash
# The soak (bench/soak.py): a long training run with the teacher-output cache, a feature loss and
# two teachers, its memory, threads, open files and pinned bytes sampled; a leak after the first
# epoch fails it. Usage: bench/soak.sh [MINUTES] [OUT.json] (default 30 minutes, full dataset,
# bench/results/soak_<cpu>.json); CI runs `bench/soak.sh ci` (3 minutes on a 4096-image subset).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(cat .kdflow-venv)
kdflow=build/release/src/kdflow
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "${1:-}" = ci ]; then
  out=$(mktemp /tmp/kdflow-soak.XXXXXX.json)
  rc=0
  "$venv/bin/python" bench/soak.py "$kdflow" --minutes 3 --interval 2 --subset 4096 \
    --out "$out" --commit "$commit" || rc=$?
  rm -f "$out"
  exit $rc
fi
minutes=${1:-30}
out=${2:-bench/results/soak_$(uname -m).json}
"$venv/bin/python" bench/soak.py "$kdflow" --minutes "$minutes" --out "$out" --commit "$commit"
