#!/usr/bin/env bash
# The GPU check (../shared/GPU.md) in one script, in two halves:
#   here (no GPU):       bash scripts/gpu_check.sh pack
#     builds the release preset and bundles into .gpu/ (git-ignored) the build tree (no objects),
#     every shared library the binaries load that is not torch's or the C/C++ runtime's, and
#     Fashion-MNIST;
#   on the lent machine: bash scripts/gpu_check.sh run [PHASE...]     (device tool, carry [".gpu"])
#     recreates the dependency venv's paths that the binaries' RPATH names (its site-packages is the
#     machine's own, so LibTorch is the machine's torch 2.11.0+cu130), then runs the phases:
#       tests    the whole ctest suite (the CUDA feeder and trainer tests must not skip there)
#       default  kdflow bench-overlap on the default job (with H2D bandwidth: slots vs cudaMemcpy)
#       gpu      tune-cores, then bench-overlap with its plan, on bench/overlap_gpu.toml
#       train    a short CUDA run (bf16 autocast), CPU vs CUDA losses for the same seed, and a
#                one-GPU torchrun run against the plain run
#       tune     the elastic / pipeline / tuner tests, tune-cores --exhaustive on the default job,
#                and bench-overlap of the default job on the tuned plan
#       placement  (not in the default set) the GPU-sized job with its loader and teacher on CPUs
#                far from the student's
#       install  (not in the default set) nothing but the set-up, for commands run after it
#     (all but the last two when none is named). Everything lands in $OUT/gpu_check.tar.gz; the table printed last
#     (bench/gpu_summary.py, also $OUT/summary.txt) summarises it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bundle=$root/.gpu

pack() {
  bash scripts/build.sh release
  rm -rf "$bundle"
  mkdir -p "$bundle/lib"
  local venv
  venv=$(cat .kdflow-venv)
  # The paths the binaries were linked with: recreated on the lent machine.
  echo "$venv" >"$bundle/venv"
  (cd "$venv" && ls -d lib/python3*/site-packages) >"$bundle/site_packages"
  echo "$root" >"$bundle/source_dir"
  # Every ELF file of the build tree, and what it loads, less torch (the lent machine has its own)
  # and the C/C++ runtime (the lent machine's is newer).
  local elves
  elves=$(find build/release -type f -executable -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
  # shellcheck disable=SC2086
  ldd $elves 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/torch/lib/|/nvidia/|/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so' |
    while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
  # Compressed: what travels to the lent machine is limited to 64 MiB (libdnnl alone is 63 MB).
  tar -C "$bundle" -cJf "$bundle/lib.tar.xz" lib
  rm -rf "$bundle/lib"
  tar -C build -cJf "$bundle/build.tar.xz" \
    --exclude='*.o' --exclude='*.a' --exclude='.ninja_*' --exclude='build.ninja' \
    --exclude='release/tests/fixtures' release
  cp -r /usr/share/datasets/fashion-mnist "$bundle/fashion-mnist"
  du -sh "$bundle"/* | sed 's/^/gpu_check pack: /'
}

# The lent machine: the venv's paths, the source path and the dataset where the build expects them.
install_bundle() {
  local venv site source python torch_site
  venv=$(cat "$bundle/venv")
  site=$(cat "$bundle/site_packages")
  source=$(cat "$bundle/source_dir")
  python=$(command -v python3)
  torch_site=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  mkdir -p "$venv/bin" "$venv/$(dirname "$site")"
  tar -C "$venv" -xJf "$bundle/lib.tar.xz"
  ln -sfn "$torch_site" "$venv/$site"
  printf '#!/bin/sh\nexec %s "$@"\n' "$python" >"$venv/bin/python"
  chmod +x "$venv/bin/python"
  if [ "$source" != "$root" ]; then
    if [ -e "$source" ] && [ ! -L "$source" ]; then
      echo "gpu_check: $source (the source path the build names) exists on this machine" >&2
      exit 1
    fi
    mkdir -p "$(dirname "$source")"
    ln -sfn "$root" "$source"
  fi
  mkdir -p /usr/share/datasets
  ln -sfn "$bundle/fashion-mnist" /usr/share/datasets/fashion-mnist
  mkdir -p build
  tar -C build -xJf "$bundle/build.tar.xz"
  if ldd build/release/src/kdflow | grep -q 'not found'; then
    ldd build/release/src/kdflow | grep 'not found' >&2
    echo "gpu_check: libraries missing on this machine (above)" >&2
    exit 1
  fi
}

kdflow=build/release/src/kdflow

phase_install() { :; }

phase_tests() {
  timeout "${KD_CTEST_LIMIT_S:-360}" ctest --test-dir build/release -j 8 --timeout 300 --output-on-failure \
    --output-junit "$work/ctest.xml" >"$work/ctest.log" 2>&1 || true
  tail -n 40 "$work/ctest.log"
}

phase_default() {
  "$kdflow" bench-overlap --steps 50 --repeats 3 --json "$work/overlap_default.json" \
    --trace "$work/overlap_default.trace.json" 2>&1 | tee "$work/overlap_default.log" | tail -n 14
}

phase_gpu() {
  "$kdflow" tune-cores --config bench/overlap_gpu.toml --budget-s 60 --out "$work/plan_gpu.json" \
    >"$work/tune_gpu.log" 2>&1 || { tail -n 20 "$work/tune_gpu.log"; return 1; }
  "$kdflow" bench-overlap --config bench/overlap_gpu.toml --cores "$work/plan_gpu.json" \
    --steps 50 --repeats 3 --json "$work/overlap_gpu.json" \
    --trace "$work/overlap_gpu.trace.json" 2>&1 | tee "$work/overlap_gpu.log" | tail -n 14
}

# The GPU-sized job on the tuned plan with the loader and the teacher moved to CPUs far from the
# student's (same roles and counts): whether the student's host thread feels its CPU neighbours.
phase_placement() {
  local far=(--set cores.plan=auto --set cores.student_cpus=0 --set cores.loader_cpus=8
    --set cores.teacher_cpus=12 --set teacher.precision=bf16)
  "$kdflow" bench-overlap --config bench/overlap_gpu.toml "${far[@]}" --steps 50 --repeats 3 \
    --min-seconds 2 --json "$work/overlap_gpu_far.json" 2>&1 | tee "$work/overlap_gpu_far.log" |
    tail -n 12
}

phase_train() {
  "$kdflow" train --out "$work/train_cuda" --set train.max_steps=300 >"$work/train_cuda.log" 2>&1
  # The same seed, batches and teacher on both students, every step logged.
  for device in cuda cpu; do
    "$kdflow" train --out "$work/follow_$device" --set student.device=$device \
      --set train.max_steps=40 --set train.log_every=1 --set cores.elastic=false \
      >"$work/follow_$device.log" 2>&1
  done
  # torchrun with one GPU is the plain run (issue 18): two plain runs (is CUDA bit-reproducible
  # here at all?) and one under torchrun, compared by their parameters' digest.
  local same=(--set train.max_steps=100 --set cores.elastic=false)
  "$kdflow" train --out "$work/plain_a" "${same[@]}" >"$work/plain_a.log" 2>&1
  "$kdflow" train --out "$work/plain_b" "${same[@]}" >"$work/plain_b.log" 2>&1
  python3 -m torch.distributed.run --standalone --nproc-per-node 1 --no-python "$kdflow" train \
    --out "$work/torchrun_1" "${same[@]}" >"$work/torchrun_1.log" 2>&1
}

phase_tune() {
  ctest --test-dir build/release -R 'Elastic|CpuPipeline|TuneCores|Pipeline' --timeout 600 \
    --output-on-failure >"$work/ctest_tune.log" 2>&1 || true
  tail -n 8 "$work/ctest_tune.log"
  "$kdflow" tune-cores --budget-s 60 --exhaustive --out "$work/tune_default.json" \
    >"$work/tune_default.log" 2>&1 || { tail -n 20 "$work/tune_default.log"; return 1; }
  grep -E '^exhaustive|^plan' "$work/tune_default.log" || true
  # The default job on the tuned plan (which may pick the bf16 teacher where the CPU has AMX).
  "$kdflow" bench-overlap --cores "$work/tune_default.json" --steps 50 --repeats 3 \
    --json "$work/overlap_default_tuned.json" 2>&1 | tee "$work/overlap_default_tuned.log" | tail -n 14
}

run() {
  local phases=("$@")
  [ ${#phases[@]} -gt 0 ] || phases=(tests default gpu train tune)
  : "${OUT:?run on the lent machine: \$OUT is where results go}"
  work=$OUT/gpu_check
  mkdir -p "$work"
  # Whatever happens, the results come back as one archive (the device tool returns few files).
  trap 'tar -C "$OUT" -czf "$OUT/gpu_check.tar.gz" gpu_check; rm -rf "$work"' EXIT
  install_bundle
  { nvidia-smi; lscpu; "$kdflow" --version; "$kdflow" cores; } >"$work/machine.txt" 2>&1 || true
  grep -E 'Model name|^CPU\(s\)|NVIDIA H|Flags' "$work/machine.txt" | cut -c1-160 || true
  for p in "${phases[@]}"; do
    local t0=$SECONDS
    echo "== $p"
    "phase_$p" || echo "gpu_check: phase $p failed"
    echo "== $p: $((SECONDS - t0)) s"
  done
  python3 bench/gpu_summary.py "$work" | tee "$OUT/summary.txt"
}

case "${1:-}" in
pack) pack ;;
run)
  shift
  run "$@"
  ;;
*)
  echo "usage: scripts/gpu_check.sh pack | run [tests default gpu train tune]" >&2
  exit 2
  ;;
esac
