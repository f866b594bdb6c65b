// FNV-1a (64-bit) over bytes: a cheap, stable digest for cache keys and state comparisons (not a
// cryptographic hash). Chain calls by passing the previous digest as `h`. And splitmix64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>

namespace kdflow {

inline constexpr std::uint64_t kFnv1aOffset = 14695981039346656037ull;

inline std::uint64_t fnv1a(std::span<const std::byte> bytes, std::uint64_t h = kFnv1aOffset) {
  for (const std::byte b : bytes) {
    h ^= static_cast<std::uint64_t>(b);
    h *= 1099511628211ull;
  }
  return h;
}

// The same steps over 8 bytes at a time (then the tail byte by byte): another value than fnv1a's,
// about 8 times faster, for digests of large buffers (a dataset's pixels).
inline std::uint64_t fnv1a_wide(std::span<const std::byte> bytes, std::uint64_t h = kFnv1aOffset) {
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, bytes.data() + i, 8);
    h ^= word;
    h *= 1099511628211ull;
  }
  return fnv1a(bytes.subspan(i), h);
}

// splitmix64's step: a 64-bit value to a well-mixed one (a bijection), for hash-derived random
// draws that depend on their key alone (the loader's shuffles, crops and flips).
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A file's bytes as "<fnv1a, 16 hex digits>-<size>" ("cbf29ce484222325-0" when it cannot be read).
std::string file_digest(const std::filesystem::path& path);

} // namespace kdflow
