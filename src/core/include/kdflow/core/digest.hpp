// FNV-1a (64-bit) over bytes: a cheap, stable digest for cache keys and state comparisons (not a
// cryptographic hash). Chain calls by passing the previous digest as `h`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kdflow {

inline constexpr std::uint64_t kFnv1aOffset = 14695981039346656037ull;

inline std::uint64_t fnv1a(std::span<const std::byte> bytes, std::uint64_t h = kFnv1aOffset) {
  for (const std::byte b : bytes) {
    h ^= static_cast<std::uint64_t>(b);
    h *= 1099511628211ull;
  }
  return h;
}

} // namespace kdflow
