// Vector ISA dispatch for kdflow's own kernels (internal): a kernel is compiled for AVX-512, for
// AVX2 with FMA and for the baseline (the KD_TARGET_* attributes on copies of one template), and
// runs at the widest of them that oneDNN's effective ISA allows (the CPU's, or less under
// ONEDNN_MAX_CPU_ISA), so that a capped run measures kdflow's kernels at the width oneDNN's run at.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <unistd.h>

#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KD_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")))
#define KD_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define KD_TARGET_X86 1
#endif

namespace kdflow::teacher {

enum class VectorIsa { baseline, avx2, avx512 };

inline VectorIsa vector_isa() {
#ifdef KD_TARGET_X86
  const auto has = [](dnnl::cpu_isa want) {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    return (isa & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
  };
  if (has(dnnl::cpu_isa::avx512_core)) return VectorIsa::avx512;
  // (oneDNN's avx2 does not promise FMA, which the AVX2 builds may use.)
  if (has(dnnl::cpu_isa::avx2) && __builtin_cpu_supports("fma")) return VectorIsa::avx2;
#endif
  return VectorIsa::baseline;
}

inline const char* isa_name(VectorIsa isa) {
  return isa == VectorIsa::avx512 ? "avx512" : isa == VectorIsa::avx2 ? "avx2" : "baseline";
}

// This CPU's level-2 cache per core (sysconf), 1 MiB where the system does not say: what kdflow's
// own kernels size their chunks of work by.
inline std::int64_t l2_bytes() {
  const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l2 > 0 ? l2 : std::int64_t{1} << 20;
}

} // namespace kdflow::teacher
