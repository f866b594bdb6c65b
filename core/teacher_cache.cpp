#include "kdflow/core/teacher_cache.hpp"

#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/error.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace kdflow {
namespace {

// A teacher cache file's payload (inside the checked file's header): the magic, the format, the
// key's length and text, samples, classes and kept logits (u64 each), one byte per sample (1:
// kept), then the values (samples x stride floats: the logits kept, then the features) and, under
// top-K, the kept classes (samples x
// kept u32). Native byte order, as the checkpoints.
constexpr char kCacheMagic[8] = {'K', 'D', 'T', 'C', 'A', 'C', 'H', 'E'};
constexpr std::uint32_t kCacheFormat = 1;
constexpr std::size_t kMaxKeyBytes = 1 << 16;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The first line that differs, as "<theirs>, this run's <ours>".
std::string first_difference(const std::string& theirs, const std::string& ours) {
  const auto a = lines_of(theirs), b = lines_of(ours);
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string x = i < a.size() ? a[i] : "(nothing)", y = i < b.size() ? b[i] : "(nothing)";
    if (x != y) return fmt::format("'{}', this run's '{}'", x, y);
  }
  return "the same key";
}

class Reader {
public:
  Reader(std::span<const std::byte> bytes, const std::filesystem::path& path)
      : bytes_(bytes), path_(path) {}
  std::span<const std::byte> take(std::size_t n) {
    if (n > bytes_.size() - at_)
      throw InputError(fmt::format("teacher cache {}: ends {} bytes early (a damaged file)",
                                   path_.string(), n - (bytes_.size() - at_)));
    const auto out = bytes_.subspan(at_, n);
    at_ += n;
    return out;
  }
  template <typename T>
  T value() {
    T v{};
    std::memcpy(&v, take(sizeof(T)).data(), sizeof(T));
    return v;
  }

private:
  std::span<const std::byte> bytes_;
  const std::filesystem::path& path_;
  std::size_t at_ = 0;
};

void put(std::vector<std::byte>& out, const void* data, std::size_t n) {
  const auto* p = static_cast<const std::byte*>(data);
  out.insert(out.end(), p, p + n);
}

} // namespace

TeacherOutputCache::TeacherOutputCache(std::size_t samples, std::size_t classes, std::size_t top_k,
                                       double temperature, std::size_t features)
    : samples_(samples), classes_(classes), kept_(top_k == 0 || top_k >= classes ? classes : top_k),
      temperature_(temperature), features_(features),
      logit_floats_(kept_ == classes ? classes : kept_ + 1), stride_(logit_floats_ + features) {
  if (samples == 0 || classes == 0)
    throw std::invalid_argument("teacher output cache: no samples or no classes");
  if (!(temperature > 0))
    throw std::invalid_argument("teacher output cache: the temperature must be positive");
  values_.assign(samples_ * stride_, 0.f);
  if (!full()) indices_.assign(samples_ * kept_, 0);
  state_ = std::make_unique<std::atomic<std::uint8_t>[]>(samples_);
  for (std::size_t i = 0; i < samples_; ++i) state_[i].store(kEmpty, std::memory_order_relaxed);
}

std::size_t TeacherOutputCache::bytes() const {
  return values_.size() * sizeof(float) + indices_.size() * sizeof(std::uint32_t) + samples_;
}

bool TeacherOutputCache::store(std::uint64_t id, std::span<const float> logits,
                               std::span<const float> features) {
  if (id >= samples_)
    throw std::out_of_range("teacher output cache: sample " + std::to_string(id) + " of " +
                            std::to_string(samples_));
  if (features.size() != features_)
    throw std::invalid_argument("teacher output cache: " + std::to_string(features.size()) +
                                " feature values for a cache of " + std::to_string(features_));
  // Under top-K, the thread's scratch grows before the sample is claimed: nothing past the claim
  // throws, so no entry stays half written (keep() waits for a claimed one).
  thread_local std::vector<std::uint32_t> order; // grows once per thread, then reused
  if (!full()) order.resize(classes_);
  std::uint8_t expected = kEmpty;
  if (!state_[id].compare_exchange_strong(expected, kWriting, std::memory_order_acquire,
                                          std::memory_order_relaxed))
    return false; // kept already, or being kept
  float* values = values_.data() + id * stride_;
  if (full()) {
    std::copy_n(logits.begin(), classes_, values);
  } else {
    // The K largest, ties to the lower class; then the rest's logit from their probability mass
    // at the temperature, summed over the rest itself (no 1 - sum cancellation).
    std::uint32_t* classes = indices_.data() + id * kept_;
    std::iota(order.begin(), order.end(), 0u);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kept_),
                      order.end(), [&](std::uint32_t a, std::uint32_t b) {
                        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    const double t = temperature_;
    double top = -HUGE_VAL;
    for (std::size_t c = 0; c < classes_; ++c) top = std::max(top, logits[c] / t);
    double all = 0, rest = 0;
    for (std::size_t c = 0; c < classes_; ++c) all += std::exp(logits[c] / t - top);
    for (std::size_t k = kept_; k < classes_; ++k) rest += std::exp(logits[order[k]] / t - top);
    const double lse = top + std::log(all);
    const double mass = std::max(rest / all, DBL_MIN); // the rest's probability, > 0
    for (std::size_t k = 0; k < kept_; ++k) {
      classes[k] = order[k];
      values[k] = logits[order[k]];
    }
    values[kept_] =
        static_cast<float>(t * (std::log(mass / static_cast<double>(classes_ - kept_)) + lse));
  }
  std::copy(features.begin(), features.end(), values + logit_floats_);
  state_[id].store(kStored, std::memory_order_release);
  stored_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void TeacherOutputCache::keep(std::uint64_t id, std::span<float> logits,
                              std::span<float> features) {
  if (!has(id) && store(id, logits, features) && full()) return; // kept as it is
  // Another writer's entry, or this one's as top-K keeps it: read whole once written.
  while (state_[id].load(std::memory_order_acquire) != kStored) std::this_thread::yield();
  load(id, logits, features);
}

bool TeacherOutputCache::has(std::uint64_t id) const {
  return id < samples_ && state_[id].load(std::memory_order_acquire) == kStored;
}

void TeacherOutputCache::load(std::uint64_t id, std::span<float> out,
                              std::span<float> features) const {
  if (!features.empty() && features.size() != features_)
    throw std::invalid_argument("teacher output cache: room for " +
                                std::to_string(features.size()) + " feature values, " +
                                std::to_string(features_) + " kept");
  const float* values = values_.data() + id * stride_;
  if (!features.empty()) std::copy_n(values + logit_floats_, features_, features.begin());
  if (full()) {
    std::copy_n(values, classes_, out.begin());
    return;
  }
  std::fill_n(out.begin(), classes_, values[kept_]);
  const std::uint32_t* classes = indices_.data() + id * kept_;
  for (std::size_t k = 0; k < kept_; ++k) out[classes[k]] = values[k];
}

std::size_t TeacherOutputCache::file_bytes(std::size_t key_bytes) const {
  return sizeof(kCacheMagic) + 2 * sizeof(std::uint32_t) + key_bytes + 3 * sizeof(std::uint64_t) +
         samples_ + values_.size() * sizeof(float) + indices_.size() * sizeof(std::uint32_t);
}

void TeacherOutputCache::save(const std::filesystem::path& path, const std::string& key) const {
  std::vector<std::byte> out;
  out.reserve(file_bytes(key.size()));
  put(out, kCacheMagic, sizeof(kCacheMagic));
  const std::uint32_t format = kCacheFormat, key_bytes = static_cast<std::uint32_t>(key.size());
  put(out, &format, sizeof(format));
  put(out, &key_bytes, sizeof(key_bytes));
  put(out, key.data(), key.size());
  for (const std::uint64_t v :
       {std::uint64_t{samples_}, std::uint64_t{classes_}, std::uint64_t{kept_}})
    put(out, &v, sizeof(v));
  // Which entries are whole now: those stored before this look; later ones are left out.
  const std::size_t flags_at = out.size();
  out.resize(out.size() + samples_, std::byte{0});
  for (std::size_t i = 0; i < samples_; ++i)
    if (state_[i].load(std::memory_order_acquire) == kStored) out[flags_at + i] = std::byte{1};
  const std::size_t values_at = out.size();
  out.resize(out.size() + values_.size() * sizeof(float), std::byte{0});
  const std::size_t indices_at = out.size();
  out.resize(out.size() + indices_.size() * sizeof(std::uint32_t), std::byte{0});
  for (std::size_t i = 0; i < samples_; ++i) {
    if (out[flags_at + i] == std::byte{0}) continue;
    std::memcpy(out.data() + values_at + i * stride_ * sizeof(float), values_.data() + i * stride_,
                stride_ * sizeof(float));
    if (!full())
      std::memcpy(out.data() + indices_at + i * kept_ * sizeof(std::uint32_t),
                  indices_.data() + i * kept_, kept_ * sizeof(std::uint32_t));
  }
  write_checked_file(path, out);
}

std::size_t TeacherOutputCache::load(const std::filesystem::path& path, const std::string& key) {
  const std::vector<std::byte> bytes =
      read_checked_file(path, "teacher cache", file_bytes(kMaxKeyBytes));
  Reader in(bytes, path);
  const auto magic = in.take(sizeof(kCacheMagic));
  if (std::memcmp(magic.data(), kCacheMagic, sizeof(kCacheMagic)) != 0)
    throw InputError(
        fmt::format("teacher cache {}: a kdflow file, but not a teacher cache", path.string()));
  if (const auto format = in.value<std::uint32_t>(); format != kCacheFormat)
    throw InputError(fmt::format("teacher cache {}: format {}, this kdflow reads {}", path.string(),
                                 format, kCacheFormat));
  const auto key_bytes = in.value<std::uint32_t>();
  if (key_bytes > kMaxKeyBytes)
    throw InputError(fmt::format("teacher cache {}: a key of {} bytes (a damaged file)",
                                 path.string(), key_bytes));
  const auto text = in.take(key_bytes);
  const std::string theirs(reinterpret_cast<const char*>(text.data()), text.size());
  if (theirs != key)
    throw InputError(fmt::format("teacher cache {}: written for other outputs: {}", path.string(),
                                 first_difference(theirs, key)));
  const auto samples = in.value<std::uint64_t>(), classes = in.value<std::uint64_t>(),
             kept = in.value<std::uint64_t>();
  if (samples != samples_ || classes != classes_ || kept != kept_)
    throw InputError(fmt::format(
        "teacher cache {}: {} samples x {} classes ({} kept), this run's {} x {} ({} kept)",
        path.string(), samples, classes, kept, samples_, classes_, kept_));
  if (bytes.size() != file_bytes(key.size()))
    throw InputError(fmt::format("teacher cache {}: {} bytes, {} expected for its sizes",
                                 path.string(), bytes.size(), file_bytes(key.size())));
  const auto flags = in.take(samples_);
  const auto values = in.take(values_.size() * sizeof(float));
  const auto indices = in.take(indices_.size() * sizeof(std::uint32_t));
  // Checked whole before anything is kept.
  for (std::size_t i = 0; i < samples_; ++i) {
    if (flags[i] == std::byte{0}) continue;
    if (flags[i] != std::byte{1})
      throw InputError(fmt::format("teacher cache {}: sample {}'s flag is {} (a damaged file)",
                                   path.string(), i, static_cast<int>(flags[i])));
    // The logits must be finite; a feature may be any float the teacher computed (an -inf of a
    // masked score), its bits guarded by the file's CRC.
    for (std::size_t k = 0; k < logit_floats_; ++k) {
      float v = 0;
      std::memcpy(&v, values.data() + (i * stride_ + k) * sizeof(float), sizeof(v));
      if (!std::isfinite(v))
        throw InputError(fmt::format("teacher cache {}: sample {} holds a logit of {} (a damaged "
                                     "file)",
                                     path.string(), i, v));
    }
    for (std::size_t k = 0; k < (full() ? 0 : kept_); ++k) {
      std::uint32_t c = 0;
      std::memcpy(&c, indices.data() + (i * kept_ + k) * sizeof(std::uint32_t), sizeof(c));
      if (c >= classes_)
        throw InputError(fmt::format("teacher cache {}: sample {} keeps class {} of {} (a "
                                     "damaged file)",
                                     path.string(), i, c, classes_));
    }
  }
  std::size_t added = 0;
  for (std::size_t i = 0; i < samples_; ++i) {
    if (flags[i] == std::byte{0} || state_[i].load(std::memory_order_relaxed) == kStored) continue;
    std::memcpy(values_.data() + i * stride_, values.data() + i * stride_ * sizeof(float),
                stride_ * sizeof(float));
    if (!full())
      std::memcpy(indices_.data() + i * kept_, indices.data() + i * kept_ * sizeof(std::uint32_t),
                  kept_ * sizeof(std::uint32_t));
    state_[i].store(kStored, std::memory_order_release);
    ++added;
  }
  stored_.fetch_add(added, std::memory_order_relaxed);
  return added;
}

} // namespace kdflow
