#!/usr/bin/env bash
# The GPU check (../shared/GPU.md) in one script, in two halves:
#   here (no GPU):       bash scripts/gpu_check.sh pack
#     builds the release preset and bundles into .gpu/ (git-ignored; $KD_GPU_BUNDLE) the build tree
#     (no objects), every shared library the binaries load that is not torch's or the C/C++
#     runtime's, and Fashion-MNIST;
#   on the lent machine: bash scripts/gpu_check.sh run [PHASE...]     (device tool, carry [".gpu"])
#     recreates the dependency venv's paths that the binaries' RPATH names (its site-packages is the
#     machine's own, so LibTorch is the machine's torch 2.11.0+cu130; bin/python and bin/torchrun
#     call the machine's python3), then runs the phases, most valuable first:
#       tests    the whole ctest suite but the teacher zoo (a CPU-only coverage suite of several
#                minutes: CI runs it), the TensorBoard checks, kdflow report's and the Python
#                module's (the machine has no tensorboard package, gnuplot or pytest, and its own
#                python; CI runs them); on a GPU machine a skipped test is a failure: every CUDA test
#                must run there
#       train    a short CUDA run (bf16 autocast), CPU vs CUDA losses for the same seed, and the
#                one-GPU torchrun runs (no group, a Gloo group of one, an NCCL group of one) against
#                two plain runs
#       default  kdflow bench-overlap on the default job (with H2D bandwidth: slots vs cudaMemcpy)
#       real     the 224-pixel JPEG-folder job (bench/real_job.sh --device cuda) against the PyTorch
#                loop a user would write, both students on the GPU
#       gpu      tune-cores, then bench-overlap with its plan, on bench/overlap_gpu.toml
#       tune     the elastic / pipeline / tuner tests, tune-cores --exhaustive on the default job,
#                and bench-overlap of the default job on the tuned plan
#       placement  (not in the default set) the GPU-sized job with its loader and teacher on CPUs
#                far from the student's
#       teacher  (not in the default set; no GPU needed) the real job's teacher alone on every core:
#                kdflow teacher bench in fp32, bf16 and int8 where the CPU has them
#       install  (not in the default set) nothing but the set-up, for commands run after it
#     Each phase runs under its own time limit (KD_LIMIT_<PHASE> seconds), and none starts past
#     KD_GPU_DEADLINE_S (540) since the start, so the script ends inside one device call. Everything
#     lands in $OUT/gpu_check.tar.gz; the table printed last (bench/gpu_summary.py, also
#     $OUT/summary.txt) summarises it. Any failed phase or test: the table names it and the script
#     exits 1.
#   here again, as CI does: bash scripts/gpu_check.sh dry
#     packs the built tree into a scratch bundle and runs every phase at toy size on this machine:
#     the CUDA parts say "skipped: no GPU"; the archive, the table and the failure path are checked.
set -euo pipefail
self=$(realpath "$0") # the phases and the dry run call it again, from the repository's root
cd "$(dirname "$0")/.."
root=$(pwd)
bundle=${KD_GPU_BUNDLE:-$root/.gpu}
kdflow=build/release/src/kdflow

pack() {
  [ "${KD_GPU_NO_BUILD:-0}" = 1 ] || bash scripts/build.sh release
  rm -rf "$bundle"
  mkdir -p "$bundle/lib"
  local venv
  venv=$(cat .kdflow-venv)
  # The paths the binaries were linked with: recreated on the lent machine.
  echo "$venv" >"$bundle/venv"
  (cd "$venv" && ls -d lib/python3*/site-packages) >"$bundle/site_packages"
  echo "$root" >"$bundle/source_dir"
  # The commit built (the lent machine's copy of .git may lag the working tree).
  git rev-parse --short HEAD >"$bundle/commit"
  # Every ELF file of the build tree, and what it loads, less torch (the lent machine has its own)
  # and the C/C++ runtime (the lent machine's is newer).
  local elves
  elves=$(find build/release -type f -executable -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
  # shellcheck disable=SC2086
  ldd $elves 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/torch/lib/|/nvidia/|/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so' |
    while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
  # Compressed: what travels to the lent machine is limited to 64 MiB (libdnnl alone is 63 MB);
  # precompiled headers (~700 MB each) are build inputs, not needed to run.
  XZ_OPT=${XZ_OPT:--T0 -6} tar -C "$bundle" -cJf "$bundle/lib.tar.xz" lib
  rm -rf "$bundle/lib"
  XZ_OPT=${XZ_OPT:--T0 -6} tar -C build -cJf "$bundle/build.tar.xz" \
    --exclude='*.o' --exclude='*.a' --exclude='*.gch' --exclude='*.pch' --exclude='.ninja_*' \
    --exclude='build.ninja' \
    --exclude='release/tests/fixtures' release
  cp -r /usr/share/datasets/fashion-mnist "$bundle/fashion-mnist"
  local size
  size=$(du -sm "$bundle" | cut -f1)
  if [ "$size" -ge 64 ]; then
    echo "gpu_check pack: the bundle is $size MiB; a device call carries 64 MiB in all" >&2
    exit 1
  fi
  du -sh "$bundle"/* | sed 's/^/gpu_check pack: /'
}

# The lent machine: the venv's paths, the source path and the dataset where the build expects them.
install_bundle() {
  local venv site source python torch_site
  venv=$(cat "$bundle/venv")
  site=$(cat "$bundle/site_packages")
  source=$(cat "$bundle/source_dir")
  if [ -f "$venv/pyvenv.cfg" ]; then
    # The machine that packed it (a dry run): its venv, source and build are the bundle's.
    tar -tJf "$bundle/lib.tar.xz" >/dev/null
    tar -tJf "$bundle/build.tar.xz" >/dev/null
    echo "gpu_check: the bundle's venv is this machine's ($venv): archives checked, nothing unpacked"
    return
  fi
  python=$(command -v python3)
  torch_site=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  mkdir -p "$venv/bin" "$venv/$(dirname "$site")"
  tar -C "$venv" -xJf "$bundle/lib.tar.xz"
  ln -sfn "$torch_site" "$venv/$site"
  printf '#!/bin/sh\nexec %s "$@"\n' "$python" >"$venv/bin/python"
  printf '#!/bin/sh\nexec %s -m torch.distributed.run "$@"\n' "$python" >"$venv/bin/torchrun"
  chmod +x "$venv/bin/python" "$venv/bin/torchrun"
  # The bench scripts find the venv as scripts/setup.sh leaves it (git-ignored, so not carried).
  [ -f .kdflow-venv ] || echo "$venv" >.kdflow-venv
  if [ "$source" != "$root" ]; then
    if [ -e "$source" ] && [ ! -L "$source" ]; then
      echo "gpu_check: $source (the source path the build names) exists on this machine" >&2
      exit 1
    fi
    mkdir -p "$(dirname "$source")"
    ln -sfn "$root" "$source"
  fi
  mkdir -p /usr/share/datasets
  [ -e /usr/share/datasets/fashion-mnist ] || ln -sfn "$bundle/fashion-mnist" /usr/share/datasets/fashion-mnist
  mkdir -p build
  tar -C build -xJf "$bundle/build.tar.xz"
  if ldd build/release/src/kdflow | grep -q 'not found'; then
    ldd build/release/src/kdflow | grep 'not found' >&2
    echo "gpu_check: libraries missing on this machine (above)" >&2
    exit 1
  fi
}

# Toy sizes for a dry run (KD_GPU_DRY=1): every step runs, none takes long.
size() { if [ "${KD_GPU_DRY:-0}" = 1 ]; then echo "$2"; else echo "$1"; fi; }

have_gpu() { "$kdflow" --version 2>/dev/null | grep -qE '^GPUs: +[1-9]'; }

# step NAME COMMAND...: the command's output in $work/NAME.log; on failure its tail, and the phase
# fails.
step() {
  local name=$1
  shift
  if ! "$@" >"$work/$name.log" 2>&1; then
    echo "gpu_check: step $name failed: $*" >&2
    tail -n 15 "$work/$name.log" >&2
    return 1
  fi
}

phase_install() { :; }

# skips_in CTEST_LOG: whether ctest reported a test skipped or not run (its "***Skipped" and
# "***Not Run" marks; a test whose name says "Skipped" is not one).
skips_in() { grep -qE '[*]{3}(Skipped|Not Run)' "$1"; }

phase_tests() {
  local only=()
  [ -z "${KD_CTEST_REGEX:-}" ] || only=(-R "$KD_CTEST_REGEX")
  local rc=0
  # TensorBoard's checks read the event files with the venv's tensorboard package, kdflow report
  # draws with gnuplot, and the Python module is built for this machine's python 3.11 with pytest:
  # the lent machine has none of these (CI runs them).
  ctest --test-dir build/release -j "${KD_CTEST_JOBS:-8}" --timeout 300 --no-tests=error -LE zoo \
    -E 'TensorBoardEvents|^Report[.]|^python_module$' --output-on-failure --output-junit "$work/ctest.xml" "${only[@]}" >"$work/ctest.log" 2>&1 ||
    rc=$?
  grep -E 'tests passed|tests failed|\(Failed|\(Timeout|\(SEGFAULT|Skipped|Not Run' "$work/ctest.log" |
    tail -n 30 || true
  if [ "$rc" -ne 0 ]; then
    echo "gpu_check: ctest exit $rc" >&2
    return 1
  fi
  # Every CUDA test must run where a GPU is: a skip there is a test that did not check anything.
  if have_gpu && skips_in "$work/ctest.log"; then
    echo "gpu_check: tests skipped on a GPU machine" >&2
    return 1
  fi
}

phase_train() {
  local gpu=0
  have_gpu && gpu=1
  if [ $gpu = 1 ]; then
    step train_cuda "$kdflow" train --out "$work/train_cuda" --set train.max_steps="$(size 300 10)"
    # The same seed, batches and teacher on both students, every step logged.
    for device in cuda cpu; do
      step "follow_$device" "$kdflow" train --out "$work/follow_$device" --set student.device=$device \
        --set train.max_steps="$(size 40 5)" --set train.log_every=1 --set cores.elastic=false
    done
  else
    echo "train: the CUDA run and CUDA vs CPU: skipped: no GPU"
  fi
  # torchrun with one GPU: no group (the plain run), a Gloo group of one (CUDA tensors through the
  # host), an NCCL group of one; two plain runs say whether CUDA is bit-reproducible here at all.
  local same=(--set train.max_steps="$(size 100 10)" --set cores.elastic=false --set train.export=off)
  step plain_a "$kdflow" train --out "$work/plain_a" "${same[@]}"
  step plain_b "$kdflow" train --out "$work/plain_b" "${same[@]}"
  local backends=(auto gloo)
  if [ $gpu = 1 ]; then backends+=(nccl); else echo "train: the NCCL group of one: skipped: no GPU"; fi
  for backend in "${backends[@]}"; do
    step "torchrun_$backend" "$(cat "$bundle/venv")/bin/torchrun" --standalone --nproc-per-node 1 \
      --no-python "$kdflow" train --out "$work/torchrun_$backend" "${same[@]}" \
      --set dist.backend=$backend
  done
}

phase_default() {
  step overlap_default "$kdflow" bench-overlap --steps "$(size 50 4)" --repeats "$(size 3 1)" \
    --min-seconds "$(size 2 0)" --json "$work/overlap_default.json" \
    --trace "$work/overlap_default.trace.json"
  tail -n 14 "$work/overlap_default.log"
}

phase_gpu() {
  if ! have_gpu; then
    echo "gpu: the GPU-sized job: skipped: no GPU"
    return 0
  fi
  step tune_gpu "$kdflow" tune-cores --config bench/overlap_gpu.toml --budget-s 60 \
    --out "$work/plan_gpu.json"
  step overlap_gpu "$kdflow" bench-overlap --config bench/overlap_gpu.toml \
    --cores "$work/plan_gpu.json" --steps 50 --repeats 3 --json "$work/overlap_gpu.json" \
    --trace "$work/overlap_gpu.trace.json"
  tail -n 14 "$work/overlap_gpu.log"
}

# The GPU-sized job on the tuned plan with the loader and the teacher moved to CPUs far from the
# student's (same roles and counts): whether the student's host thread feels its CPU neighbours.
phase_placement() {
  if ! have_gpu; then
    echo "placement: skipped: no GPU"
    return 0
  fi
  local far=(--set cores.plan=auto --set cores.student_cpus=0 --set cores.loader_cpus=8
    --set cores.teacher_cpus=12 --set teacher.precision=bf16)
  step overlap_gpu_far "$kdflow" bench-overlap --config bench/overlap_gpu.toml "${far[@]}" \
    --steps 50 --repeats 3 --min-seconds 2 --json "$work/overlap_gpu_far.json"
  tail -n 12 "$work/overlap_gpu_far.log"
}

phase_real() {
  if ! have_gpu; then
    echo "real: the 224 job on the GPU: skipped: no GPU"
    return 0
  fi
  # Its data and teacher are made on the spot, outside the results (the folder is ~150 MB): a
  # ResNet-50 teacher (bf16 on the CPU by default, as the peer's under autocast on the GPU;
  # KD_REAL_PRECISION=int8 for the CPU's int8 kernels; KD_REAL_TEACHER another torchvision
  # teacher, KD_REAL_CACHE=none no cached arm, KD_REAL_TEACHER_EPOCHS=E the teacher trained E
  # epochs on the folder first, on the GPU, and each arm's time to the accuracy both reach), a ResNet-18
  # student, three epochs of the 4000 training images, with and without kd.cache; the peer's
  # loader workers are the CPUs but the main process's and its pinning thread's.
  KD_REAL_JOB_DIR=/tmp/kdflow_real_job step real_224 bash bench/real_job.sh --job folder \
    --device cuda --size 224 --batch 64 --steps "${KD_REAL_STEPS:-190}" \
    --teacher "${KD_REAL_TEACHER:-resnet50}" --student resnet18 --cache "${KD_REAL_CACHE:-memory}" --workers $(($(nproc) > 3 ? $(nproc) - 2 : 1)) \
    --teacher-epochs "${KD_REAL_TEACHER_EPOCHS:-0}" \
    --set "teacher.precision=${KD_REAL_PRECISION:-bf16}" --out "$work/real_224.json"
  grep -E '"(ratio|ratio_to_peer|kdflow_samples_per_s|peer_samples_per_s|samples_per_s)"' -A2 \
    "$work/real_224.json" | head -16
}

# The teacher alone on the machine's cores (issue 38's N-core row; no GPU needed): the real phase's
# ResNet-50 at 224 (made here when that phase did not run first), batch 64, in fp32, bf16 and int8
# where the CPU has them, as one replica of every physical core and as replicas of 4 threads;
# int8 calibrated on the JPEG folder's first validation images (its last batch held out: the
# agreement with fp32 is reported).
phase_teacher() {
  local dir py arch size cores model cal p splits
  dir=${KD_REAL_JOB_DIR:-$(size /tmp/kdflow_real_job "$work/real_job")}
  py=$(cat "$bundle/venv")/bin/python
  arch=$(size resnet50 resnet18) size=$(size 224 32)
  model=$dir/teacher_$size/$arch.onnx
  [ -f "$model" ] || step teacher_make "$py" bench/make_real_teacher.py --arch "$arch" --classes 10 \
    --size "$size" --out "$dir/teacher_$size"
  [ -d "$dir/data/val" ] || step teacher_data "$py" bench/make_fmnist_folder.py --out "$dir/data" \
    --train "$(size 4000 20)" --val "$(size 500 200)" --min "$(size 300 40)" --max "$(size 500 60)"
  cal=$dir/teacher_calibration_$size.npy # 115 MB at 224: kept out of the results
  step teacher_calibration "$py" bench/folder_calibration.py --folder "$dir/data/val" \
    --images "$(size 192 12)" --size "$size" --out "$cal"
  cores=$("$kdflow" cores 2>/dev/null | sed -n 's/^topology:.* \([0-9]*\) core(s).*/\1/p')
  cores=${cores:-$(nproc)}
  splits="1x$cores"
  if [ "$cores" -ge 8 ]; then splits+=" $((cores / 4))x4"; else splits+=" ${cores}x1"; fi
  local precisions=(fp32)
  grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && precisions+=(bf16)
  grep -qwE 'avx512_vnni|avx_vnni|amx_int8' /proc/cpuinfo && precisions+=(int8)
  local split r t extra
  for p in "${precisions[@]}"; do
    for split in $splits; do
      r=${split%x*} t=${split#*x} extra=()
      [ "$p" != int8 ] || extra=(--calibration "$cal")
      step "teacher_${p}_$split" "$kdflow" teacher bench --model "$model" --batch "$(size 64 4)" \
        --threads "$t" --replicas "$r" --precision "$p" --seconds "$(size 4 0.3)" "${extra[@]}" \
        --json "$work/teacher_${p}_$split.json"
    done
  done
  rm -rf "$work/real_job" # the dry run's toy teacher and folder
  grep -h '^  "images_per_s"' "$work"/teacher_*_*x*.json
}

phase_tune() {
  # The elastic / pipeline / tuner tests, unless the tests phase of this run ran them all.
  if [ "${KD_GPU_DRY:-0}" != 1 ] && [ ! -f "$work/ctest.log" ]; then
    # The fixtures the tests phase made are kept (a selection would otherwise remake them).
    local kept=()
    [ -z "$(ls -A build/release/tests/fixtures/models 2>/dev/null)" ] ||
      kept=(--fixture-exclude-setup teacher_fixtures)
    step ctest_tune ctest --test-dir build/release -R 'Elastic|CpuPipeline|TuneCores|Pipeline' \
      "${kept[@]}" --timeout 600 --output-on-failure
    tail -n 4 "$work/ctest_tune.log"
  fi
  step tune_default "$kdflow" tune-cores --budget-s "$(size 60 4)" --exhaustive \
    --out "$work/tune_default.json"
  grep -E '^exhaustive|^plan' "$work/tune_default.log" || true
  # The default job on the tuned plan (which may pick the bf16 teacher where the CPU has AMX).
  step overlap_default_tuned "$kdflow" bench-overlap --cores "$work/tune_default.json" \
    --steps "$(size 50 4)" --repeats "$(size 3 1)" --min-seconds "$(size 2 0)" \
    --json "$work/overlap_default_tuned.json"
  tail -n 14 "$work/overlap_default_tuned.log"
}

# Seconds each phase may take on the lent machine (KD_LIMIT_<PHASE> overrides).
limit_of() {
  local var="KD_LIMIT_${1^^}" fallback
  case $1 in
  tests) fallback=330 ;; train) fallback=120 ;; default) fallback=75 ;; gpu) fallback=150 ;;
  tune) fallback=180 ;; placement) fallback=75 ;; real) fallback=200 ;; teacher) fallback=150 ;;
  *) fallback=60 ;;
  esac
  echo "${!var:-$fallback}"
}

run() {
  local phases=("$@")
  [ ${#phases[@]} -gt 0 ] || phases=(tests default real tune gpu train)
  : "${OUT:?run on the lent machine: \$OUT is where results go}"
  work=$OUT/gpu_check
  export work
  mkdir -p "$work"
  # Whatever happens, the results come back as one archive (the device tool returns few files).
  trap 'tar -C "$OUT" -czf "$OUT/gpu_check.tar.gz" gpu_check; rm -rf "$work"' EXIT
  install_bundle
  KD_SOURCE_COMMIT=$(cat "$bundle/commit")
  export KD_SOURCE_COMMIT
  echo "$KD_SOURCE_COMMIT" >"$work/commit.txt"
  { nvidia-smi; lscpu; "$kdflow" --version; "$kdflow" cores; } >"$work/machine.txt" 2>&1 || true
  grep -E 'Model name|^CPU\(s\)|NVIDIA H|^GPUs' "$work/machine.txt" | cut -c1-160 || true
  local deadline=${KD_GPU_DEADLINE_S:-540} failed=() p limit left rc
  for p in "${phases[@]}"; do
    limit=$(limit_of "$p")
    left=$((deadline - SECONDS))
    [ "$left" -ge "$limit" ] || limit=$left
    if [ "$limit" -lt 15 ]; then
      echo "== $p: not started: ${left} s left of the ${deadline} s deadline"
      failed+=("$p:not-started")
      continue
    fi
    local t0=$SECONDS
    echo "== $p (limit $limit s)"
    rc=0
    timeout -k 5 "$limit" bash "$self" _phase "$p" || rc=$?
    if [ "$rc" -ne 0 ]; then
      # 124: timeout's TERM; 137: its KILL after the grace.
      if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then failed+=("$p:over-${limit}s"); else failed+=("$p:exit-$rc"); fi
      echo "gpu_check: phase $p FAILED (exit $rc)"
    fi
    echo "== $p: $((SECONDS - t0)) s"
  done
  printf '%s\n' "${failed[@]}" >"$work/failed_phases.txt"
  python3 bench/gpu_summary.py "$work" | tee "$OUT/summary.txt"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check: FAILED: ${failed[*]}" >&2
    exit 1
  fi
}

# The dry run (CI, this machine): pack the built tree into a scratch bundle, run every phase at
# toy size, check what comes back; then a run whose tests match nothing must fail and say so.
dry() {
  scratch=$(mktemp -d /tmp/kdflow-gpu-dry.XXXXXX)
  trap 'rm -rf "$scratch"' EXIT
  export KD_GPU_BUNDLE=$scratch/bundle KD_GPU_NO_BUILD=1 KD_GPU_DRY=1 XZ_OPT="-T0 -1"
  local t0=$SECONDS
  bash "$self" pack
  echo "gpu_check dry: pack $((SECONDS - t0)) s"
  t0=$SECONDS
  mkdir -p "$scratch/out"
  OUT=$scratch/out KD_CTEST_REGEX="${KD_DRY_CTEST_REGEX:-^DistEnv[.]}" \
    bash "$self" run tests train default gpu tune placement real teacher
  echo "gpu_check dry: run $((SECONDS - t0)) s"
  local listing
  listing=$(tar -tzf "$scratch/out/gpu_check.tar.gz")
  for f in machine.txt ctest.log ctest.xml summary.json failed_phases.txt plain_a/summary.json \
    torchrun_gloo/summary.json overlap_default.json tune_default.json overlap_default_tuned.json \
    teacher_fp32_1x2.json; do
    grep -qx "gpu_check/$f" <<<"$listing" || {
      echo "gpu_check dry: gpu_check/$f is not in the archive" >&2
      exit 1
    }
  done
  grep -q 'skipped: no GPU' "$scratch/out/summary.txt" || {
    echo "gpu_check dry: the table does not say the CUDA parts were skipped" >&2
    exit 1
  }
  # The skip check reads ctest's marks, not test names (a lease's green run once failed on
  # Train.NonFiniteLossAbortsOrIsSkipped).
  printf '%s\n' '1/2 Test #1: Train.NonFiniteLossAbortsOrIsSkipped ......   Passed    1.00 sec' >"$scratch/names.log"
  printf '%s\n' '2/2 Test #2: Trainer.CudaStep ......***Skipped   0.01 sec' >"$scratch/skip.log"
  if skips_in "$scratch/names.log" || ! skips_in "$scratch/skip.log"; then
    echo "gpu_check dry: the skip check reads test names or misses ctest's skip mark" >&2
    exit 1
  fi
  rm -rf "$scratch/out"/*
  if OUT=$scratch/out KD_CTEST_REGEX='^NoSuchTest$' bash "$self" run tests >"$scratch/fail.log" 2>&1; then
    echo "gpu_check dry: a run whose tests did not run exited 0" >&2
    exit 1
  fi
  grep -q 'FAILED: tests:exit' "$scratch/fail.log" || {
    cat "$scratch/fail.log" >&2
    echo "gpu_check dry: the failed run did not name its phase" >&2
    exit 1
  }
  echo "gpu_check dry: passed"
}

case "${1:-}" in
pack) pack ;;
run)
  shift
  run "$@"
  ;;
dry) dry ;;
_phase) "phase_$2" ;;
*)
  echo "usage: scripts/gpu_check.sh pack | run [tests train default real gpu tune placement teacher install] | dry" >&2
  exit 2
  ;;
esac
