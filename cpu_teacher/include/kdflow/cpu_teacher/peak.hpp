// The machine's measured fp32 FMA peak on the calling thread's arena: the yardstick that turns a
// teacher's GFLOP/s into a fraction of what these cores can do.
#pragma once

#include <string>

namespace kdflow::teacher {

struct PeakResult {
  double gflops_per_s = 0; // all threads of the current arena together
  std::string isa;         // "avx512", "avx2", or "scalar"
  int threads = 0;
};

// Runs independent FMA chains on every thread of the current TBB arena for about `seconds`.
PeakResult measure_fma_peak(double seconds);

} // namespace kdflow::teacher
