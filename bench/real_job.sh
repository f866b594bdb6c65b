#!/usr/bin/env bash
# The job users have, kdflow against the PyTorch loop they would write, in one run on this machine:
# an ImageNet-shaped JPEG folder made from Fashion-MNIST (bench/make_fmnist_folder.py), a
# torchvision teacher written as ONNX for kdflow and as a state_dict for the peer from the same
# weights (bench/make_real_teacher.py), the ImageNet form of a torchvision student, and the same
# recipe (RandomResizedCrop + flip, SGD/Nesterov, warm-up + cosine, T^2 KL + CE, batch, steps).
# --job default: kdflow's default job instead (Fashion-MNIST in memory, the shipped teacher, the
# `cnn` student, one epoch), the peer holding the data in memory with the teacher's ONNX weights.
# Prints one JSON object (samples/s and test accuracy of each arm, their ratio, the CPU), written
# to --out too. The arms alternate, --repeats times each, repeat r with train seed r in both; the
# medians are compared.
# Uses the project venv's python (scripts/setup.sh) and build/release/src/kdflow.
# Usage: bench/real_job.sh [--job folder|default] [--size 112] [--steps 60] [--batch 32] [--teacher resnet18]
#   [--student mobilenet_v2] [--repeats 1] [--workers N] [--out FILE] [--set KEY=VALUE]...
#   [--env KEY=VALUE]... [--peer-env KEY=VALUE]... [--device cpu|cuda] [--cache none|memory]
#   [--overlap STEPS] [--teacher-epochs E]
# (--device: where both students train, cpu by default; on cuda the peer's teacher runs on the GPU
# too, both arms under bf16 autocast, as a user's loop on a GPU would)
# (--set: a key of kdflow's configuration for its arm, e.g. train.threads=2; --env, --peer-env: an
# environment variable for kdflow's or the peer's arm, e.g. OMP_WAIT_POLICY=PASSIVE; repeatable)
# (--cache memory: a third arm, kdflow with kd.cache = memory and kd.cache_augmented = true: from the
# second epoch on, each sample's target is the teacher's output for its first view; its accuracy
# beside the fresh teacher's at the same steps says what the stale targets cost)
# (--overlap STEPS: after the arms, `kdflow bench-overlap` on the same job and settings, STEPS
# measured steps a mode, median of 3: its `loop` mode (the plain loop as LibTorch, which its
# speed-ups are stated against) beside the peer's rate of this run, so the JSON says how close
# that stand-in is to the real PyTorch loop)
# (--teacher-epochs E: the folder job's teacher trained E epochs on the folder first (on --device;
# its val top-1 in the JSON), so that accuracies mean something; then both arms evaluate at each
# epoch's end and the JSON gives each arm's time to the accuracy both reach: the first evaluated
# step at or above it times the arm's measured time per step)
set -euo pipefail
cd "$(dirname "$0")/.."
job=folder size=112 steps="" batch="" teacher=resnet18 student=mobilenet_v2 repeats=1 out=""
device=cpu cache=none overlap=0 teacher_epochs=0
sets=()
envs=()
peer_envs=()
workers=$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))
refuse() {
  echo "real_job: $*" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
  --job) job=$2 ;;
  --size) size=$2 ;;
  --steps) steps=$2 ;;
  --batch) batch=$2 ;;
  --teacher) teacher=$2 ;;
  --student) student=$2 ;;
  --repeats) repeats=$2 ;;
  --workers) workers=$2 ;;
  --out) out=$2 ;;
  --set) sets+=(--set "$2") ;;
  --env) envs+=("$2") ;;
  --peer-env) peer_envs+=("$2") ;;
  --device) device=$2 ;;
  --cache) cache=$2 ;;
  --overlap) overlap=$2 ;;
  --teacher-epochs) teacher_epochs=$2 ;;
  *) refuse "unknown argument $1" ;;
  esac
  shift 2
done
case "$device" in
cpu) peer_amp=none ;;
cuda) peer_amp=bf16 ;;
*) refuse "--device $device: cpu or cuda" ;;
esac
case "$cache" in none | memory) ;; *) refuse "--cache $cache: none or memory" ;; esac
case "$overlap" in '' | *[!0-9]*) refuse "--overlap $overlap: a number of steps" ;; esac
case "$teacher_epochs" in '' | *[!0-9]*) refuse "--teacher-epochs $teacher_epochs: a number" ;; esac
py=$(cat .kdflow-venv)/bin/python
kdflow=build/release/src/kdflow
[ -x "$kdflow" ] || bash scripts/build.sh release
work=${KD_REAL_JOB_DIR:-${HOME}/.cache/kdflow/real_job}
mkdir -p "$work"
case "$job" in
folder)
  steps=${steps:-60} batch=${batch:-32}
  case "$student" in
  mobilenet_v2) kd_student=mobilenetv2 ;;
  resnet18) kd_student=resnet18 ;;
  *) refuse "--student $student: resnet18 or mobilenet_v2 (kdflow's built-in ImageNet forms)" ;;
  esac
  "$py" bench/make_fmnist_folder.py --out "$work/data" --train 4000 --val 500 >&2
  trained=()
  [ "$teacher_epochs" = 0 ] || trained=(--train-data "$work/data" --train-epochs "$teacher_epochs"
    --device "$device" --workers "$workers" --batch "$batch")
  "$py" bench/make_real_teacher.py --arch "$teacher" --classes 10 --size "$size" \
    --out "$work/teacher_$size" "${trained[@]}" >&2
  teacher_info=$work/teacher_$size/$teacher.json
  resize=$((size * 8 / 7))
  kd_args=(--set data.dataset=folder --set "data.path=$work/data" --set "data.image_size=$size"
    --set "data.resize=$resize" --set data.random_resized_crop=true --set data.hflip=true
    --set "teacher.model=$work/teacher_$size/$teacher.onnx" --set "student.arch=$kd_student"
    --set student.stem=imagenet)
  train_samples=$(find "$work/data/train" -type f | wc -l)
  peer_args=(--data "$work/data" --teacher-arch "$teacher"
    --teacher-weights "$work/teacher_$size/$teacher.pt" --student-arch "$student" --size "$size"
    --resize "$resize" --workers "$workers")
  ;;
default)
  # One epoch of Fashion-MNIST's 60000 images at kdflow's default batch of 64, both arms on the
  # shipped teacher; the peer's threads are every CPU (it runs the teacher and student in turn).
  steps=${steps:-937} batch=${batch:-64} size=28 teacher=fmnist_teacher student=cnn workers=0
  train_samples=60000
  kd_args=()
  peer_args=(--idx /usr/share/datasets/fashion-mnist --teacher-onnx models/fmnist_teacher.onnx
    --student-arch kdflow-cnn)
  teacher_info=""
  ;;
*) refuse "--job $job: folder or default" ;;
esac
# The schedule both arms follow: kdflow's warm-up + cosine spans its epochs (train.max_steps stops
# the run, it does not shorten the schedule), so both get the whole epochs the steps need and the
# peer's schedule spans those epochs' steps too (batches per epoch: drop_last, as kdflow's default).
per_epoch=$((train_samples / batch))
[ "$per_epoch" -gt 0 ] || refuse "$train_samples training samples make no batch of $batch"
epochs=$(((steps + per_epoch - 1) / per_epoch))
schedule=$((epochs * per_epoch))
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
# kdflow_arm NAME SET...: one kdflow run of repeat $r, its summary kept as NAME_$r.json.
kdflow_arm() {
  local name=$1
  shift
  rm -rf "$work/run"
  env "${envs[@]}" "$kdflow" train --out "$work/run" "${kd_args[@]}" --set "data.batch_size=$batch" \
    --set "train.max_steps=$steps" --set "train.epochs=$epochs" --set "train.seed=$r" \
    --set train.export=off \
    --set train.checkpoint_every=0 --set "student.device=$device" "${sets[@]}" "$@" \
    >"$results/${name}_$r.log" 2>&1 ||
    {
      tail -5 "$results/${name}_$r.log" >&2
      exit 1
    }
  cp "$work/run/summary.json" "$results/${name}_$r.json"
  cp "$work/run/metrics.jsonl" "$results/${name}_$r.metrics.jsonl"
  # Both arms run every step (train.max_steps, not the epochs, ends the run).
  local ran
  ran=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["steps"])' "$work/run/summary.json")
  [ "$ran" = "$steps" ] || refuse "kdflow's $name arm ran $ran of $steps steps"
}
for r in $(seq 1 "$repeats"); do
  kdflow_arm kdflow
  [ "$cache" = none ] || kdflow_arm kdflow_cache --set "kd.cache=$cache" --set kd.cache_augmented=true
  env "${peer_envs[@]}" "$py" bench/peer_pytorch_kd.py "${peer_args[@]}" --batch "$batch" \
    --steps "$steps" --schedule-steps "$schedule" --seed "$r" --device "$device" --amp "$peer_amp" --eval --eval-epochs >"$results/peer_$r.json"
done
if [ "$overlap" -gt 0 ]; then
  env "${envs[@]}" "$kdflow" bench-overlap "${kd_args[@]}" --set "data.batch_size=$batch" \
    --set "train.epochs=$epochs" --set "student.device=$device" "${sets[@]}" --steps "$overlap" \
    --repeats 3 --json "$results/overlap.json" >"$results/overlap.log" 2>&1 || {
    tail -5 "$results/overlap.log" >&2
    exit 1
  }
fi
"$py" - "$results" "$repeats" "$job" "$size" "$steps" "$schedule" "$batch" "$teacher" "$student" "$workers" "$out" \
  "${sets[*]}" "${envs[*]}" "${peer_envs[*]}" "$device" "$cache" "$teacher_info" <<'PY'
import json, os, statistics, subprocess, sys
d, repeats, job, size, steps, schedule, batch, teacher, student, workers, out, sets, envs, peer_envs, device, cache, teacher_info = sys.argv[1:]
arm = lambda name: [json.load(open(f"{d}/{name}_{r}.json")) for r in range(1, int(repeats) + 1)]


def pace(log):
    """The run's line on which stage sets the pace (train_log.cpp), its log prefix cut; or None."""
    for line in open(log, errors="replace"):
        if "samples/s; the teacher's" in line:
            return line.split("] ", 2)[-1].strip()
    return None


def epochs(name):
    """Per epoch of each repeat, from metrics.jsonl's interval lines: samples/s, the student's
    share of time waiting for a batch, and the teacher batches read from kd.cache by its end."""
    out = []
    for r in range(1, int(repeats) + 1):
        per = {}
        for text in open(f"{d}/{name}_{r}.metrics.jsonl"):
            line = json.loads(text)
            if "interval_s" not in line or "samples_per_s" not in line:
                continue
            e = per.setdefault(line["epoch"], {"epoch": line["epoch"], "seconds": 0.0, "samples": 0.0,
                                                "wait_s": 0.0, "cached_batches": None})
            e["seconds"] += line["interval_s"]
            e["samples"] += line["samples_per_s"] * line["interval_s"]
            e["wait_s"] += line.get("student_wait_ms", 0.0) / 1e3
            e["cached_batches"] = line.get("teacher_cached_batches")
        out.append([{"epoch": e["epoch"], "samples_per_s": e["samples"] / e["seconds"],
                     "student_wait_share": e["wait_s"] / e["seconds"],
                     "cached_batches": e["cached_batches"]}
                    for e in sorted(per.values(), key=lambda e: e["epoch"]) if e["seconds"] > 0])
    return out


k, p = arm("kdflow"), arm("peer")
cpu = subprocess.run("lscpu | sed -n 's/^Model name:[ ]*//p'", shell=True, capture_output=True,
                     text=True).stdout.strip()
# On a lent GPU machine the tree's .git may lag what was built: gpu_check.sh names the packed commit.
commit = os.environ.get("KD_SOURCE_COMMIT") or subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
ks = statistics.median(x["samples_per_s"] for x in k)
ps = statistics.median(x["samples_per_s"] for x in p)
flags = open("/proc/cpuinfo").read().split("flags", 1)[-1].split("\n", 1)[0].split()
isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
result = {"cpu": cpu, "isa": isa, "cpus": int(subprocess.run(["nproc"], capture_output=True, text=True).stdout),
          "commit": commit, "job": job, "size": int(size), "steps": int(steps),
          "schedule_steps": int(schedule), "batch": int(batch),
          "teacher": teacher, "student": student, "student_device": device,
          "gpu": subprocess.run("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1",
                                shell=True, capture_output=True, text=True).stdout.strip() or None,
          "peer_workers": int(workers), "repeats": int(repeats),
          "kdflow_sets": sets.replace("--set ", "").split(), "kdflow_env": envs.split(),
          "peer_env": peer_envs.split(),
          "kdflow_samples_per_s": [x["samples_per_s"] for x in k],
          "peer_samples_per_s": [x["samples_per_s"] for x in p],
          "ratio": ks / ps,
          "kdflow_test_accuracy": [x["test_accuracy"] for x in k],
          "peer_test_accuracy": [x["test_accuracy"] for x in p],
          "kdflow_teacher_test_accuracy": k[-1].get("teacher_test_accuracy"),
          "kdflow_teacher_busy_fraction": [x.get("teacher_busy_fraction") for x in k],
          "kdflow_student_stall_fraction": [x.get("student_stall_fraction") for x in k],
          "kdflow_plan": k[-1].get("plan"),
          # teacher.precision = int8: its calibration and its check against fp32 (else null).
          "kdflow_teacher_int8": k[-1].get("teacher_int8"),
          # kdflow's start-up verdict on the pace (after the first interval): which stage is slower.
          "kdflow_pace": [pace(f"{d}/kdflow_{r}.log") for r in range(1, int(repeats) + 1)],
          "kdflow_epochs": epochs("kdflow")}
if teacher_info and os.path.exists(teacher_info):
    # How the teacher's weights came about: torchvision's initialisation, or trained on the folder.
    result["teacher_weights"] = json.load(open(teacher_info))


def time_to(arms):
    """Each arm's time to the highest test accuracy every arm reaches (per repeat): the first
    evaluated step at or above it, times the arm's measured seconds per step (evaluations apart).
    None where an arm's runs have no evaluations."""
    rows = []
    for r in range(int(repeats)):
        curves = {name: [(e["step"], e["test_accuracy"]) for e in runs[r].get("evaluations") or []]
                  for name, runs in arms.items()}
        if not all(curves.values()):
            return None
        target = min(max(a for _, a in c) for c in curves.values())
        row = {"target_accuracy": target}
        for name, c in curves.items():
            first = min(s for s, a in c if a >= target)
            rate = arms[name][r]["samples_per_s"]
            row[name] = {"step": first, "seconds": first * int(batch) / rate, "curve": c}
        rows.append(row)
    return rows


arms = {"kdflow": k, "peer": p}
if cache != "none":
    arms["kdflow_cache"] = arm("kdflow_cache")
result["time_to_accuracy"] = time_to(arms)
if result["time_to_accuracy"]:
    result["time_to_accuracy_ratio"] = statistics.median(
        row["peer"]["seconds"] / row["kdflow"]["seconds"] for row in result["time_to_accuracy"])
if os.path.exists(f"{d}/overlap.json"):
    o = json.load(open(f"{d}/overlap.json"))
    rate = lambda mode: o["modes"][mode]["samples_per_s"]
    result["bench_overlap"] = {
        "steps": o["setup"]["steps"],
        "modes": {m: {"samples_per_s": rate(m), "repetitions_samples_per_s":
                      o["modes"][m]["repetitions_samples_per_s"],
                      "student_threads": o["modes"][m].get("student_threads"),
                      "student_cpus": o["modes"][m].get("student_cpus")}
                  for m in ("student-alone", "teacher-alone", "serial-cpu", "colocated", "loop",
                            "overlapped")},
        "speedup_vs_loop": o["speedup_vs_loop"],
        # The stand-in against the real loop, measured in this run: 1 where bench-overlap's loop
        # is as fast as the PyTorch loop it stands for.
        "loop_to_peer": rate("loop") / ps,
        "overlapped_to_peer": rate("overlapped") / ps,
        "plan_summary": o["plan_summary"]}
if cache != "none":
    c = arm("kdflow_cache")
    result["kdflow_cache"] = {
        "sets": [f"kd.cache={cache}", "kd.cache_augmented=true"],
        "samples_per_s": [x["samples_per_s"] for x in c],
        "ratio_to_peer": statistics.median(x["samples_per_s"] for x in c) / ps,
        "test_accuracy": [x["test_accuracy"] for x in c],
        "teacher_cache": [x.get("teacher_cache") for x in c],
        "student_stall_fraction": [x.get("student_stall_fraction") for x in c],
        # The cached epochs apart from the first (which fills the cache).
        "epochs": epochs("kdflow_cache")}
text = json.dumps(result, indent=1)
print(text)
if out:
    open(out, "w").write(text + "\n")
PY
