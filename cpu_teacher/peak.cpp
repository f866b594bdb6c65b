// FMA peak microbenchmark: per thread, 16 (AVX-512) or 12 (AVX2) independent accumulator chains,
// enough to cover the FMA latency on two ports; compiled per ISA with target attributes and chosen
// at run time at the width the engine runs at: oneDNN's effective ISA, which ONEDNN_MAX_CPU_ISA
// caps (a run capped at AVX2 on a core with 512-bit FMA units is measured against the AVX2 peak,
// half the AVX-512 one there, not against a peak its kernels cannot reach).
#include "kdflow/cpu_teacher/peak.hpp"

#include "ops/simd.hpp"

#include <immintrin.h>

#include <atomic>
#include <chrono>

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

namespace kdflow::teacher {
namespace {

constexpr long kInner = 1 << 14;

__attribute__((target("avx512f"))) double fma_avx512(long reps) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(0.f);
  const __m512 a = _mm512_set1_ps(0.9999f), b = _mm512_set1_ps(1e-7f);
  for (long r = 0; r < reps; ++r)
    for (long k = 0; k < kInner; ++k)
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  volatile float sink = out[0];
  (void)sink;
  return 2.0 * 16 * 16 * static_cast<double>(kInner) * static_cast<double>(reps);
}

__attribute__((target("avx2,fma"))) double fma_avx2(long reps) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(0.f);
  const __m256 a = _mm256_set1_ps(0.9999f), b = _mm256_set1_ps(1e-7f);
  for (long r = 0; r < reps; ++r)
    for (long k = 0; k < kInner; ++k)
      for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  float out[8];
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_storeu_ps(out, s);
  volatile float sink = out[0];
  (void)sink;
  return 2.0 * 8 * 12 * static_cast<double>(kInner) * static_cast<double>(reps);
}

} // namespace

PeakResult measure_fma_peak(double seconds) {
  PeakResult r;
  const VectorIsa width = vector_isa();
  const bool avx512 = width == VectorIsa::avx512;
  const bool avx2 = width == VectorIsa::avx2;
  r.isa = avx512 ? "avx512" : avx2 ? "avx2" : "scalar";
  if (!avx512 && !avx2) return r;
  r.threads = oneapi::tbb::this_task_arena::max_concurrency();
  const auto kernel = [&](long reps) { return avx512 ? fma_avx512(reps) : fma_avx2(reps); };
  (void)kernel(4); // warm up: frequency settles, code paged in
  // Calibrate reps so one call takes ~1/20 of the budget, then run that many calls per thread.
  auto t0 = std::chrono::steady_clock::now();
  long reps = 8;
  double dt = 0;
  while ((dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) <
         0.02) {
    (void)kernel(reps);
    reps *= 2;
  }
  const long per_call =
      std::max<long>(1, static_cast<long>(static_cast<double>(reps) * seconds / 20.0 / dt));
  std::atomic<double> flops{0};
  t0 = std::chrono::steady_clock::now();
  oneapi::tbb::parallel_for(
      0, r.threads,
      [&](int) {
        double mine = 0;
        for (int call = 0; call < 10; ++call) mine += kernel(per_call);
        double cur = flops.load();
        while (!flops.compare_exchange_weak(cur, cur + mine)) {
        }
      },
      oneapi::tbb::static_partitioner());
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.gflops_per_s = flops.load() / elapsed / 1e9;
  return r;
}

} // namespace kdflow::teacher
