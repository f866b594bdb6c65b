#!/usr/bin/env bash
# What teacher.features costs the teacher: `kdflow teacher bench` of one model with no features and
# with the named ones, alternating KD_REPEATS times each (this shared machine's noise is larger
# than the difference), every run on the same threads with the untuned plan (so both sides run
# the same ways). The medians and every run's batch time (Debian's /usr/bin/python3, standard
# library only) go to bench/results/teacher_features.json with the CPU's name.
#
# usage: scripts/feature_cost.sh MODEL.onnx VALUE...   (VALUE: an ONNX value name, as
#        `kdflow teacher info` lists them)
#   KD_RESULT=FILE    where the summary goes (default bench/results/teacher_features.json)
#   KD_BATCH=N        batch (default 64); KD_THREADS=N threads (default 2); KD_REPEATS=N (8)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: scripts/feature_cost.sh MODEL.onnx VALUE..." >&2
  exit 2
fi
model=$1
shift
bash scripts/build.sh release >/dev/null
root=$(mktemp -d /tmp/kdflow-feature-cost.XXXXXX)
trap 'rm -rf "$root"' EXIT
result=${KD_RESULT:-bench/results/teacher_features.json}
features=()
for v in "$@"; do features+=(--feature "$v"); done
for rep in $(seq 1 "${KD_REPEATS:-8}"); do
  for mode in none features; do
    extra=()
    [ "$mode" = features ] && extra=("${features[@]}")
    ./build/release/src/kdflow teacher bench --model "$model" --batch "${KD_BATCH:-64}" \
      --threads "${KD_THREADS:-2}" --seconds 2 --tune off --json "$root/$mode-$rep.json" \
      "${extra[@]}" >/dev/null
  done
done
mkdir -p "$(dirname "$result")"
/usr/bin/python3 - "$root" "$result" "$model" "$@" <<'PY'
import json, os, statistics, sys
root, result, model, values = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
           "unknown")
runs = {"none": [], "features": []}
for name in sorted(os.listdir(root)):
    runs[name.split("-")[0]].append(json.load(open(os.path.join(root, name))))
ms = {m: [r["median_batch_ms"] for r in rs] for m, rs in runs.items()}
med = {m: statistics.median(v) for m, v in ms.items()}
first = runs["none"][0]
out = {
    "cpu": cpu, "isa": first["isa"], "model": model, "batch": first["batch"],
    "threads": first["threads"], "features": values, "repeats": len(ms["none"]),
    "median_batch_ms": med, "batch_ms": ms,
    "features_cost": med["features"] / med["none"] - 1.0,
}
json.dump(out, open(result, "w"), indent=1)
print(json.dumps({k: out[k] for k in ("cpu", "median_batch_ms", "features_cost")}))
PY
