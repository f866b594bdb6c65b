#!/usr/bin/env bash
# ASan+UBSan over every kdflow library (LibTorch built in, not instrumented) with the torch-free
# tests and the pipeline's whole runs with injected faults, and TSan (the tests labelled `tsan`)
# over the lock-free core (kdflow_ring_tests: the slot ring, its protocol model and the
# teacher-output cache, driven by plain threads) and the flow-graph pipeline
# (kdflow_pipeline_core_tests: stage graphs, loaders, teacher replicas and lanes, kd.cache's
# decisions with two teachers, the moves of CPUs), built on a TSan-built oneTBB
# (scripts/tbb_tsan.sh; oneDNN's own kernels stay uninstrumented). Usage:
# scripts/sanitize.sh [asan|tsan]...
set -euo pipefail
cd "$(dirname "$0")/.."
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp}
# tests/tsan.supp: one suppression, oneDNN's uninstrumented parallel regions (the file says why).
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp}
for preset in "${@:-asan tsan}"; do
  for p in $preset; do
    bash scripts/build.sh "$p"
    ctest --preset "$p" -j "$(nproc)" --timeout 1800
  done
done
