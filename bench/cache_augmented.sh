#!/usr/bin/env bash
# What kd.cache_augmented's stale targets cost: the default job with random augmentation
# (data.pad_crop = 4, data.hflip) for --epochs epochs, with a fresh teacher every batch and with
# kd.cache = memory + kd.cache_augmented = true (each sample's target from its first epoch's view),
# the same seeds in both arms, alternating. Prints one JSON object (test accuracy, samples/s,
# batches served from the cache, per seed; the CPU and commit named), written to --out too.
# Uses build/release/src/kdflow and Debian's /usr/bin/python3 for the JSON.
# Usage: bench/cache_augmented.sh [--epochs 3] [--seeds 2] [--out FILE] [--set KEY=VALUE]...
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=3 seeds=2 out=""
sets=()
while [ $# -gt 0 ]; do
  case "$1" in
  --epochs) epochs=$2 ;;
  --seeds) seeds=$2 ;;
  --out) out=$2 ;;
  --set) sets+=(--set "$2") ;;
  *)
    echo "cache_augmented: unknown argument $1" >&2
    exit 2
    ;;
  esac
  shift 2
done
kdflow=build/release/src/kdflow
[ -x "$kdflow" ] || bash scripts/build.sh release
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for s in $(seq 1 "$seeds"); do
  for arm in fresh cached; do
    extra=()
    [ "$arm" = fresh ] || extra=(--set kd.cache=memory --set kd.cache_augmented=true)
    "$kdflow" train --out "$work/${arm}_$s" --set data.pad_crop=4 --set data.hflip=true \
      --set "train.epochs=$epochs" --set "train.seed=$s" --set train.export=off \
      --set train.checkpoint_every=0 --set train.tensorboard=false "${sets[@]}" "${extra[@]}" \
      >"$work/${arm}_$s.log" 2>&1 || {
      tail -5 "$work/${arm}_$s.log" >&2
      exit 1
    }
  done
done
/usr/bin/python3 - "$work" "$seeds" "$epochs" "$out" "${sets[*]}" <<'PY'
import json, subprocess, sys
work, seeds, epochs, out, sets = sys.argv[1:]
run = lambda *a: subprocess.run(a, capture_output=True, text=True).stdout.strip()
arms = {}
for arm in ("fresh", "cached"):
    s = [json.load(open(f"{work}/{arm}_{r}/summary.json")) for r in range(1, int(seeds) + 1)]
    arms[arm] = {"test_accuracy": [x["test_accuracy"] for x in s],
                 "samples_per_s": [x["samples_per_s"] for x in s],
                 "teacher_busy_fraction": [x.get("teacher_busy_fraction") for x in s],
                 "batches_from_cache": [(x.get("teacher_cache") or {}).get("batches_from_cache") for x in s],
                 "steps": [x["steps"] for x in s]}
mean = lambda v: sum(v) / len(v)
result = {"benchmark": "kd.cache_augmented: stale targets against a fresh teacher",
          "job": "default job (Fashion-MNIST, shipped teacher, cnn student) with data.pad_crop = 4, data.hflip",
          "epochs": int(epochs), "seeds": list(range(1, int(seeds) + 1)), "kdflow_sets": sets.split(),
          "cpu": run("sh", "-c", "lscpu | sed -n 's/^Model name:[ ]*//p'"), "cpus": int(run("nproc")),
          "isa": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
                  if f in run("sh", "-c", "lscpu | sed -n 's/^Flags:[ ]*//p'").split()],
          "commit": run("git", "rev-parse", "--short", "HEAD"), "arms": arms,
          "accuracy_cached_minus_fresh": mean(arms["cached"]["test_accuracy"]) - mean(arms["fresh"]["test_accuracy"]),
          "samples_per_s_cached_over_fresh": mean(arms["cached"]["samples_per_s"]) / mean(arms["fresh"]["samples_per_s"])}
text = json.dumps(result, indent=1)
print(text)
if out:
    open(out, "w").write(text + "\n")
PY
