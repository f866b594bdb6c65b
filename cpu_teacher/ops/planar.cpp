// A network's image input (NCHW float, 1 to 4 channels) quantized channels-last for an int8
// plan's first convolution. oneDNN's quantizing reorder took 1.39 ms of MobileNetV2's 22.2 ms
// batch at 224 (batch 16, one thread, a Zen 4: 6% of the int8 plan). Here 16 pixels are loaded
// from each plane, scaled, rounded and saturated, packed to bytes side by side in one vector, and
// one byte permute (AVX512_VBMI) interleaves them into the 16 pixels' channels-last bytes.
// Elsewhere (no AVX-512 or no VBMI, under ONEDNN_MAX_CPU_ISA below AVX-512) oneDNN's reorder runs.
// Only for u8/s8: the same interleave into f32 or bf16 writes 4x or 2x the bytes, and with the
// input and output out of cache (as a batch after the plan's other steps finds them) it was no
// faster than oneDNN's reorder in a scratch timing (f32 0.5-0.7x, bf16 0.9-1.1x; s8 1.9x).
#include "planar.hpp"

#include "simd.hpp"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>

#ifdef KD_TARGET_X86
// GCC 12's AVX-512 intrinsics start from an undefined vector (GCC bug 105593, fixed in 13):
// false -Wmaybe-uninitialized warnings at every use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace kdflow::teacher {
namespace {

#ifdef KD_TARGET_X86
#define KD_TARGET_VBMI                                                                             \
  __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vbmi,avx2,fma")))

constexpr std::int64_t kGroup = 16; // pixels per permute: 16 of each of up to 4 planes

// The byte permute's indices for the planes' bytes laid side by side (plane k at bytes
// 16 k ... 16 k + 15): output byte i * c + k (pixel i, channel k) is byte 16 k + i. Unused
// entries are 0.
std::array<std::uint8_t, 64> interleave_index(std::int64_t c) {
  std::array<std::uint8_t, 64> idx{};
  for (std::int64_t e = 0; e < c * kGroup; ++e)
    idx[static_cast<std::size_t>(e)] = static_cast<std::uint8_t>((e % c) * kGroup + e / c);
  return idx;
}

// Lanes [0, n) of a mask (n <= the mask's width).
inline std::uint64_t lanes(std::int64_t n) {
  return n >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
}

// Pixels [first, last) of one sample, x its planes (c of `pixels` each), y its channels-last
// pixels: x / scale rounded to nearest even (the CPU's default rounding) and saturated, as
// oneDNN's quantizing reorder writes it (it multiplies by the scale's reciprocal too).
// `interleave`: interleave_index(c).
template <bool Unsigned>
KD_TARGET_VBMI void int8_rows(const float* x, std::uint8_t* y, std::int64_t c, std::int64_t pixels,
                              std::int64_t first, std::int64_t last, float inverse,
                              const std::uint8_t* interleave) {
  const __m512i idx = _mm512_loadu_si512(interleave);
  const __m512 inv = _mm512_set1_ps(inverse);
  const __m512 low = _mm512_set1_ps(Unsigned ? 0.f : -128.f);
  const __m512 high = _mm512_set1_ps(Unsigned ? 255.f : 127.f);
  for (std::int64_t p = first; p < last; p += kGroup) {
    const std::int64_t n = std::min(kGroup, last - p);
    const auto in = static_cast<__mmask16>(lanes(n));
    __m512i all = _mm512_setzero_si512();
    for (std::int64_t k = 0; k < c; ++k) {
      // Saturated before the conversion, which turns values beyond the int32 range into its
      // lowest (max_ps with a NaN gives its second operand: the lower bound).
      const __m512 v = _mm512_min_ps(
          _mm512_max_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(in, x + k * pixels + p), inv), low),
          high);
      const __m128i q = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)); // in range: truncated
      all = _mm512_mask_broadcast_i32x4(all, static_cast<__mmask16>(0xFu << (4 * k)), q);
    }
    _mm512_mask_storeu_epi8(y + p * c, static_cast<__mmask64>(lanes(n * c)),
                            _mm512_permutexvar_epi8(idx, all));
  }
}
#endif

} // namespace

std::optional<PlanarKernel> planar_to_channels_last(const memory::desc& from,
                                                    const memory::desc& to, float scale) {
#ifdef KD_TARGET_X86
  using tag = memory::format_tag;
  const memory::dims dims = from.get_dims();
  if (dims.size() != 4 || dims[1] < 1 || dims[1] > 4 ||
      from != memory::desc(dims, dt::f32, tag::abcd))
    return std::nullopt;
  const dt type = to.get_data_type();
  if (to != memory::desc(dims, type, tag::acdb) || vector_isa() != VectorIsa::avx512)
    return std::nullopt;
  if ((type != dt::u8 && type != dt::s8) || !__builtin_cpu_supports("avx512vbmi"))
    return std::nullopt;
  const std::int64_t samples = dims[0], c = dims[1], pixels = dims[2] * dims[3];
  // Tasks of a sample's chunk of pixels: 16 KiB of each plane read.
  constexpr std::int64_t kChunk = 4096;
  const std::int64_t chunks = (pixels + kChunk - 1) / kChunk;
  const float inverse = 1.f / scale;
  const std::array<std::uint8_t, 64> table = interleave_index(c);
  Kernel k = [=](std::byte* const* ptrs) {
    const auto* x = reinterpret_cast<const float*>(ptrs[0]);
    auto* y = reinterpret_cast<std::uint8_t*>(ptrs[1]);
    oneapi::tbb::parallel_for(
        oneapi::tbb::blocked_range<std::int64_t>(0, samples * chunks),
        [&](const oneapi::tbb::blocked_range<std::int64_t>& r) {
          for (std::int64_t t = r.begin(); t < r.end(); ++t) {
            const std::int64_t n = t / chunks, first = t % chunks * kChunk;
            const std::int64_t last = std::min(pixels, first + kChunk);
            const float* xn = x + n * c * pixels;
            std::uint8_t* yn = y + n * c * pixels;
            if (type == dt::u8)
              int8_rows<true>(xn, yn, c, pixels, first, last, inverse, table.data());
            else
              int8_rows<false>(xn, yn, c, pixels, first, last, inverse, table.data());
          }
        });
  };
  return PlanarKernel{std::move(k), "kdflow planar->channels-last (avx512_vbmi)"};
#else
  (void)from;
  (void)to;
  (void)scale;
  return std::nullopt;
#endif
}

} // namespace kdflow::teacher
