#!/usr/bin/env bash
# Does distillation earn its place? Trains the default student with kd.alpha at its default and at
# 0 (plain training, the teacher not run), same epochs, seeds 1-3, and writes the mean and spread of
# the test accuracy to bench/results/kd_experiment.json (summarised with Debian's /usr/bin/python3,
# standard library only).
#
# usage: scripts/kd_experiment.sh [--set k=v]...   (extra settings apply to every run)
#   KD_ALPHAS="0.9 0"   the kd.alpha arms (default: both)
#   KD_RESULT=FILE      where the summary goes (default bench/results/kd_experiment.json), e.g.
#   KD_ALPHAS=0.9 KD_RESULT=bench/results/dkd_experiment.json scripts/kd_experiment.sh --set kd.loss=dkd
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release >/dev/null
root=runs/kd_experiment
rm -rf "$root"
mkdir -p "$root" bench/results
read -r -a alphas <<<"${KD_ALPHAS:-0.9 0}"
result=${KD_RESULT:-bench/results/kd_experiment.json}
for seed in 1 2 3; do
  for alpha in "${alphas[@]}"; do
    out=$root/alpha-$alpha-seed-$seed
    echo "== kd.alpha=$alpha train.seed=$seed -> $out"
    ./build/release/src/kdflow train --out "$out" --set "kd.alpha=$alpha" --set "train.seed=$seed" \
      "$@" 2>&1 | grep -E "teacher|epoch|done" || true
    test -f "$out/summary.json"
  done
done
/usr/bin/python3 - "$root" "$*" "$result" <<'PY'
import json, os, statistics, subprocess, sys
root, extra, result = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {}
for name in sorted(os.listdir(root)):
    with open(os.path.join(root, name, "summary.json")) as f:
        s = json.load(f)
    alpha = name.split("-")[1]
    runs.setdefault(alpha, []).append({"run": name, "test_accuracy": s["test_accuracy"],
                                       "wall_s": s["wall_s"], "samples_per_s": s["samples_per_s"],
                                       "teacher_test_accuracy": s["teacher_test_accuracy"]})
out = {"experiment": "default student, kd.alpha " + " vs ".join(sorted(runs, reverse=True))
                     + " (with the extra settings), seeds 1-3",
       "extra_settings": extra, "machine": os.uname().nodename + " " + os.uname().machine,
       "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                    if l.startswith("model name")), "unknown"),
       "cpus": os.cpu_count(), "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                      capture_output=True, text=True).stdout.strip(),
       "by_alpha": {}}
for alpha, rs in runs.items():
    acc = [r["test_accuracy"] for r in rs]
    out["by_alpha"][alpha] = {"mean": statistics.mean(acc), "stdev": statistics.stdev(acc),
                              "min": min(acc), "max": max(acc), "runs": rs}
    print(f"kd.alpha={alpha}: test accuracy {statistics.mean(acc):.4f} "
          f"+- {statistics.stdev(acc):.4f} (min {min(acc):.4f}, max {max(acc):.4f}, n={len(acc)})")
out["cpu"] = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                   if l.startswith("model name")), "unknown")
with open(result, "w") as f:
    json.dump(out, f, indent=2)
    f.write("\n")
PY
