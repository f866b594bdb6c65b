#!/usr/bin/env bash
# What kd.cache buys: the same run (default settings plus the arguments) trained for KD_EPOCHS
# epochs with kd.cache = none and = memory, alternating, twice each; each epoch's training
# samples/s (evaluation and checkpoints left out) from metrics.jsonl, and how many teacher
# batches the cache served. The summary (Debian's /usr/bin/python3, standard library only)
# goes to bench/results/teacher_cache.json with the CPU's name.
#
# usage: scripts/cache_speed.sh [--set k=v]...   (extra settings apply to every run)
#   KD_RESULT=FILE   where the summary goes (default bench/results/teacher_cache.json)
#   KD_EPOCHS=N      epochs per run (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release >/dev/null
root=runs/cache_speed
rm -rf "$root"
mkdir -p "$root" bench/results
result=${KD_RESULT:-bench/results/teacher_cache.json}
epochs=${KD_EPOCHS:-2}
for rep in 1 2; do
  for cache in none memory; do
    out=$root/$cache-$rep
    echo "== kd.cache=$cache (repetition $rep) -> $out"
    ./build/release/src/kdflow train --out "$out" --set "train.epochs=$epochs" --set "kd.cache=$cache" \
      --set train.export=off "$@" 2>&1 | grep -E "kd.cache|epoch [0-9]+/[0-9]+:" || true
    test -f "$out/summary.json"
  done
done
/usr/bin/python3 - "$root" "$*" "$result" "$epochs" <<'PY'
import json, os, statistics, sys
root, extra, result, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
           "unknown")
runs = {}
for name in sorted(os.listdir(root)):
    lines = [json.loads(l) for l in open(os.path.join(root, name, "metrics.jsonl"))]
    steps = [l for l in lines if "samples_per_s" in l]
    per_epoch = {}
    for l in steps:
        per_epoch.setdefault(l["epoch"], []).append(l["samples_per_s"])
    summary = json.load(open(os.path.join(root, name, "summary.json")))
    runs[name] = {
        "epoch_samples_per_s": [statistics.mean(v) for _, v in sorted(per_epoch.items())],
        "test_accuracy": summary["test_accuracy"],
        "teacher_busy_fraction": summary["teacher_busy_fraction"],
        "teacher_cache": summary.get("teacher_cache"),
    }
def epochs(mode, i):
    return [r["epoch_samples_per_s"][i] for n, r in runs.items() if n.startswith(mode + "-")]
ratio = {f"epoch_{i + 1}": statistics.mean(epochs("memory", i)) / statistics.mean(epochs("none", i))
         for i in range(n)}
out = {
    "cpu": cpu,
    "cpus": os.cpu_count(),
    "settings": f"defaults, train.epochs={n} " + extra,
    "runs": runs,
    "memory_vs_none_samples_per_s": ratio,
    "note": "epoch 1 of the cached runs computes and keeps the teacher's outputs; later epochs read "
            "them. Ratios are of the mean samples/s of the two repetitions of each mode.",
}
with open(result, "w") as f:
    json.dump(out, f, indent=2)
    f.write("\n")
print(json.dumps({"cpu": cpu, "memory_vs_none_samples_per_s": ratio}, indent=2))
PY
