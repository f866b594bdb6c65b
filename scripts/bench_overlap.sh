#!/usr/bin/env bash
# Runs `kdflow bench-overlap` on the default training job and on bench/overlap_balanced.toml
# (student step ~ teacher step), writing JSON, a Perfetto trace and a PNG per setup under
# bench/results/ (named with $KD_BENCH_TAG, default "cpu2"). Builds first. Extra arguments go to
# both runs (e.g. --steps 100). Each JSON gains the commit built and the CPU's model name (the
# project venv's python).
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
  # The commit the binary was built from (scripts/build.sh above built this tree) and the CPU.
  "$(cat .kdflow-venv)/bin/python" - "bench/results/overlap_${tag}_${setup}.json" <<'PY'
import json, subprocess, sys
path = sys.argv[1]
report = json.load(open(path))
git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
report["commit"] = git("rev-parse", "--short", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results") else "")
report["cpu"] = subprocess.run("lscpu | sed -n 's/^Model name:[ ]*//p'", shell=True, capture_output=True, text=True).stdout.strip()
open(path, "w").write(json.dumps(report, indent=1) + "\n")
PY
done
