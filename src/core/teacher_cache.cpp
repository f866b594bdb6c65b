#include "kdflow/core/teacher_cache.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace kdflow {

TeacherOutputCache::TeacherOutputCache(std::size_t samples, std::size_t classes, std::size_t top_k,
                                       double temperature)
    : samples_(samples), classes_(classes), kept_(top_k == 0 || top_k >= classes ? classes : top_k),
      temperature_(temperature), stride_(kept_ == classes ? classes : kept_ + 1) {
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

void TeacherOutputCache::store(std::uint64_t id, std::span<const float> logits) {
  if (id >= samples_)
    throw std::out_of_range("teacher output cache: sample " + std::to_string(id) + " of " +
                            std::to_string(samples_));
  std::uint8_t expected = kEmpty;
  if (!state_[id].compare_exchange_strong(expected, kWriting, std::memory_order_acquire,
                                          std::memory_order_relaxed))
    return; // kept already, or being kept
  float* values = values_.data() + id * stride_;
  if (full()) {
    std::copy_n(logits.begin(), classes_, values);
  } else {
    // The K largest, ties to the lower class; then the rest's logit from their probability mass
    // at the temperature, summed over the rest itself (no 1 - sum cancellation).
    std::uint32_t* classes = indices_.data() + id * kept_;
    thread_local std::vector<std::uint32_t> order; // grows once per thread, then reused
    order.resize(classes_);
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
  state_[id].store(kStored, std::memory_order_release);
  stored_.fetch_add(1, std::memory_order_relaxed);
}

bool TeacherOutputCache::has(std::uint64_t id) const {
  return id < samples_ && state_[id].load(std::memory_order_acquire) == kStored;
}

void TeacherOutputCache::load(std::uint64_t id, std::span<float> out) const {
  const float* values = values_.data() + id * stride_;
  if (full()) {
    std::copy_n(values, classes_, out.begin());
    return;
  }
  std::fill_n(out.begin(), classes_, values[kept_]);
  const std::uint32_t* classes = indices_.data() + id * kept_;
  for (std::size_t k = 0; k < kept_; ++k) out[classes[k]] = values[k];
}

} // namespace kdflow
