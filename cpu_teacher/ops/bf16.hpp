// bf16 elements as bf16 plans store activations (internal): the upper half of an f32's bits, and
// the scalar conversions kdflow's own kernels use to read and write them (beside the same
// overloads for f32, so that a kernel templated on its element type reads either).
#pragma once

#include <cstdint>
#include <cstring>

namespace kdflow::teacher {

struct Bf16 {
  std::uint16_t bits;
};

[[gnu::always_inline]] inline float to_float(float f) { return f; }
[[gnu::always_inline]] inline float to_float(Bf16 e) {
  const std::uint32_t u = std::uint32_t{e.bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
[[gnu::always_inline]] inline void put(float& e, float f) { e = f; }
// f32 -> bf16 rounded to nearest even, as oneDNN's conversions round; a NaN stays a quiet NaN
// (the rounding's carry would turn some into infinities).
[[gnu::always_inline]] inline void put(Bf16& e, float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  e.bits = (u & 0x7fffffffu) > 0x7f800000u
               ? std::uint16_t{0x7fc0}
               : static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Sixteen elements at a time (one AVX-512 register, two AVX2 ones, four SSE ones: each ISA's copy
// of a kernel compiles them to its own width), f32 or bf16 in memory, f32 in the register.
namespace simd16 {

constexpr int kLanes = 16;
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));

// (Out-parameters, not return values: a 64-byte vector returned by value has another ABI where
// AVX-512 is enabled than in the baseline build.)
[[gnu::always_inline]] inline void load(Vec& v, const float* p) { std::memcpy(&v, p, sizeof v); }
[[gnu::always_inline]] inline void store(float* p, const Vec& v) { std::memcpy(p, &v, sizeof v); }

using Bits = std::uint32_t __attribute__((vector_size(kLanes * sizeof(std::uint32_t))));
using Halves = std::uint16_t __attribute__((vector_size(kLanes * sizeof(std::uint16_t))));

// f32 -> bf16 bits rounded to nearest even (as oneDNN's conversions round); a NaN stays a quiet
// NaN (the rounding's carry would turn some into infinities).
[[gnu::always_inline]] inline void round_to_bf16(Bits& b) {
  const Bits rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  // All ones where b is a NaN (its magnitude above infinity's, so the difference wraps).
  const Bits nan = 0u - ((0x7f800000u - (b & 0x7fffffffu)) >> 31);
  b = (rounded & ~nan) | (0x7fc0u & nan);
}
[[gnu::always_inline]] inline void load(Vec& v, const Bf16* p) {
  Halves h;
  std::memcpy(&h, p, sizeof h);
  const Bits b = __builtin_convertvector(h, Bits) << 16;
  std::memcpy(&v, &b, sizeof v);
}
[[gnu::always_inline]] inline void store(Bf16* p, const Vec& v) {
  Bits b;
  std::memcpy(&b, &v, sizeof b);
  round_to_bf16(b);
  const Halves h = __builtin_convertvector(b, Halves);
  std::memcpy(p, &h, sizeof h);
}

} // namespace simd16

} // namespace kdflow::teacher
