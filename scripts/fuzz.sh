#!/usr/bin/env bash
# The libFuzzer targets (fuzz/, one per reader of outside input), built by the `fuzz` preset.
#   scripts/fuzz.sh ci                       each target 20 s, one per CPU at a time (CI)
#   scripts/fuzz.sh long SECONDS [target...] the targets at once (niced: other work comes first),
#                                            each SECONDS of wall time; writes bench/results/fuzz.json
# Each run starts from the committed seeds (fuzz/corpus/<target>, never modified) and a scratch
# corpus of its own. Any crash, leak, sanitizer report, timeout or out-of-memory fails the run; the
# input that caused it is kept in the scratch folder (printed), to be fixed and committed as a seed.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-ci}
all=(onnx idx cifar image config checkpoint plan npy teacher_cache)
case $mode in
  ci) seconds=20; targets=("${all[@]}") ;;
  long) seconds=${2:?usage: scripts/fuzz.sh long SECONDS [target...]}; shift 2
        targets=("${@:-${all[@]}}"); [ ${#targets[@]} -gt 0 ] || targets=("${all[@]}") ;;
  *) echo "usage: scripts/fuzz.sh ci | long SECONDS [target...]" >&2; exit 2 ;;
esac
bash scripts/build.sh fuzz

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
work=$(mktemp -d /tmp/kdflow-fuzz-run.XXXXXX)
echo "fuzz: $mode, ${seconds}s per target, scratch $work"

max_len() { case $1 in onnx|image) echo 65536 ;; idx|cifar) echo 16384 ;; *) echo 4096 ;; esac; }

run_one() { # target -> exit status of the fuzzer; its log in $work/$1.log
  local t=$1
  mkdir -p "$work/$t/corpus"
  $nice build/fuzz/fuzz/${t}_fuzz -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 \
    -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="$work/$t/" \
    "$work/$t/corpus" "fuzz/corpus/$t" >"$work/$t.log" 2>&1
}

failed=()
nice=""
if [ "$mode" = ci ]; then
  # As many targets at once as there are CPUs (each its own CPU, its own 20 s), in turn.
  width=$(nproc)
  for ((i = 0; i < ${#targets[@]}; i += width)); do
    batch=("${targets[@]:i:width}")
    declare -A pids=()
    for t in "${batch[@]}"; do run_one "$t" & pids[$t]=$!; done
    for t in "${batch[@]}"; do
      if wait "${pids[$t]}"; then echo "fuzz: $t ok ($(grep -o 'cov: [0-9]* ft: [0-9]*' "$work/$t.log" | tail -1))"
      else failed+=("$t"); echo "fuzz: $t FAILED"; tail -40 "$work/$t.log"; fi
    done
  done
else
  nice="nice -n 19"
  declare -A pids
  for t in "${targets[@]}"; do run_one "$t" & pids[$t]=$!; done
  for t in "${targets[@]}"; do wait "${pids[$t]}" || failed+=("$t"); done
  /usr/bin/python3 - "$work" "$seconds" "${targets[@]}" <<'PY'
import datetime, json, os, re, subprocess, sys
work, seconds, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True,
            text=True).stdout.splitlines() if l.startswith("Model name")), "unknown")
out = {"date": datetime.date.today().isoformat(), "cpu": cpu, "cpus": os.cpu_count(),
       "wall_seconds_per_target": seconds,
       "note": "all targets at once under nice 19 on this machine's CPUs, beside other work: "
               "executions are what each got of the CPUs in that wall time",
       "sanitizers": "address, undefined (libFuzzer, clang 14)", "targets": {}}
for t in targets:
    log = open(os.path.join(work, t + ".log"), errors="replace").read()
    stat = lambda k: int(m.group(1)) if (m := re.search(r"stat::%s:\s*(\d+)" % k, log)) else None
    last = re.findall(r"#\d+\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/", log)
    arts = [f for f in os.listdir(os.path.join(work, t)) if f != "corpus"]
    out["targets"][t] = {"executions": stat("number_of_executed_units"),
                         "executions_per_s": stat("average_exec_per_sec"),
                         "coverage_edges": int(last[-1][0]) if last else None,
                         "features": int(last[-1][1]) if last else None,
                         "corpus_units": int(last[-1][2]) if last else None,
                         "new_units": stat("new_units_added"), "peak_rss_mb": stat("peak_rss_mb"),
                         "findings": arts}
os.makedirs("bench/results", exist_ok=True)
with open("bench/results/fuzz.json", "w") as f:
    json.dump(out, f, indent=2)
    f.write("\n")
print(json.dumps(out["targets"], indent=1))
PY
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]} (inputs and logs in $work)" >&2
  exit 1
fi
rm -rf "$work"
