#!/usr/bin/env bash
# Runs `kdflow bench-overlap` on the default training job and on bench/overlap_balanced.toml
# (student step ~ teacher step), writing JSON, a Perfetto trace and a PNG per setup under
# bench/results/ (named with $KD_BENCH_TAG, default "cpu2"). Builds first. Extra arguments go to
# both runs (e.g. --steps 100).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release >/dev/null
tag="${KD_BENCH_TAG:-cpu2}"
mkdir -p bench/results
for setup in default balanced; do
  config=()
  [[ $setup == balanced ]] && config=(--config bench/overlap_balanced.toml)
  ./build/release/src/kdflow bench-overlap "${config[@]}" \
    --json "bench/results/overlap_${tag}_${setup}.json" \
    --trace "bench/results/overlap_${tag}_${setup}.trace.json" \
    --plot "bench/results/overlap_${tag}_${setup}.png" "$@"
done
