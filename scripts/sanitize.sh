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
# The test fixtures (scripts/make_*.py: exported models, op graphs, TorchScript students; 2.5
# minutes of Python on a 2-vCPU host) are data, the same whichever build reads them: where the
# release build's tests made a whole set after the scripts last changed (CI's run of the README's
# test command just did), the ASan run reads a copy of it instead of making its own.
release_fixtures() {
  local f=build/release/tests/fixtures
  [ -f $f/models/manifest.json ] && [ $f/models/manifest.json -nt scripts/make_teacher_fixtures.py ] &&
    [ -f $f/ops/manifest.json ] && [ $f/ops/manifest.json -nt scripts/make_op_fixtures.py ] &&
    [ -n "$(find $f/students -newer scripts/make_students.py -name '*.pt' 2>/dev/null | head -1)" ]
}
for preset in "${@:-asan tsan}"; do
  for p in $preset; do
    bash scripts/build.sh "$p"
    reuse=()
    if [ "$p" = asan ] && release_fixtures; then
      rm -rf "build/$p/tests/fixtures"
      cp -r build/release/tests/fixtures "build/$p/tests/fixtures"
      # Neither as the setup the teacher tests ask for nor as tests of their own (ctest runs every
      # test it selects, and the fixture tests would rewrite the files beside their readers).
      reuse=(-LE '^fixtures$' --fixture-exclude-setup teacher_fixtures)
      echo "sanitize: $p reads the release build's test fixtures (build/release/tests/fixtures)"
    fi
    ctest --preset "$p" -j "$(nproc)" --timeout 1800 "${reuse[@]}"
  done
done
