// Fuzz target: kd.cache = disk's file (TeacherOutputCache::load), with the logits alone or the
// teachers' features kept beside them. The input's first byte picks the cache (bit 0: every logit,
// or the 2 largest and the rest's; bit 1: 3 feature floats per sample, as teacher.features and
// kd.features keep them); the rest is the payload, written with a valid checked-file header so the
// read gets past the CRC to the cache's own parsing. A file it accepts must give every kept sample
// finite logits.
#include "fuzz_files.hpp"

#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/teacher_cache.hpp"

#include <cmath>
#include <cstdlib>
#include <span>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  constexpr std::size_t kSamples = 8, kClasses = 5;
  const std::size_t top_k = (data[0] & 1) != 0 ? 2 : 0;
  const std::size_t features = (data[0] & 2) != 0 ? 3 : 0;
  const std::string path = kdflow::fuzz::folder() + "/outputs.kdcache";
  kdflow::write_checked_file(path,
                             std::span(reinterpret_cast<const std::byte*>(data + 1), size - 1));
  kdflow::TeacherOutputCache cache(kSamples, kClasses, top_k, 4.0, features);
  try {
    const std::size_t added = cache.load(path, "kdflow teacher outputs\nfuzz=1\n");
    if (added != cache.stored()) std::abort();
  } catch (const kdflow::InputError&) {
    if (cache.stored() != 0) std::abort(); // nothing kept from a refused file
    return 0;
  }
  std::vector<float> out(kClasses), kept_features(features);
  for (std::uint64_t id = 0; id < kSamples; ++id) {
    if (!cache.has(id)) continue;
    cache.load(id, out, kept_features);
    for (const float v : out)
      if (!std::isfinite(v)) std::abort();
  }
  return 0;
}
