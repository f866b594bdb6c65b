#!/usr/bin/env bash
# ASan+UBSan over every kdflow library (LibTorch built in, not instrumented) with the torch-free
# tests and the pipeline's whole runs with injected faults, and TSan (the tests labelled `tsan`)
# over the lock-free core (kdflow_ring_tests: the slot ring, its protocol model and the
# teacher-output cache, driven by plain threads) and the flow-graph pipeline
# (kdflow_pipeline_core_tests: stage graphs, loaders, teacher replicas and lanes, kd.cache's
# decisions with two teachers, the moves of CPUs), built on a TSan-built oneTBB
# (scripts/tbb_tsan.sh; no suppressions: oneDNN is not instrumented, so the TSan tests give its
# calls one thread each, where it runs inline; pipeline_core_test.cpp says why). Usage:
# scripts/sanitize.sh [asan|tsan]...
set -euo pipefail
cd "$(dirname "$0")/.."
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
for preset in "${@:-asan tsan}"; do
  for p in $preset; do
    bash scripts/build.sh "$p"
    ctest --preset "$p" -j "$(nproc)" --timeout 1800
  done
done
