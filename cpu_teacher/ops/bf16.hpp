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

} // namespace kdflow::teacher
