// The slot's targets from the teachers, through kd.cache (teacher_targets.hpp).
#include "teacher_targets.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace kdflow::app {

TeacherTargets::TeacherTargets(const RunInputs& run, const SlotRegions& regions,
                               const SlotLayout& layout, std::uint32_t slots)
    : run_(run), regions_(regions), rows_(run.sampler.batch_size) {
  for (const auto& mine : regions.features)
    for (const std::size_t r : mine)
      slot_features_ += layout.regions()[r].bytes / sizeof(float) / rows_;
  if (run.teachers.size() > 1) decisions_ = std::make_unique<SlotDecisions>(slots);
}

void TeacherTargets::configure(TeacherOutputCache* cache, bool mixing) {
  if (cache && cache->features() != slot_features_)
    throw std::invalid_argument(fmt::format(
        "CpuPipeline::start: the cache keeps {} feature values per sample, the slot holds {}",
        cache->features(), slot_features_));
  cache_ = cache;
  mixing_ = mixing;
}

void TeacherTargets::teach(TeacherUnit& unit, const Slot& slot) {
  // One teacher writes the target itself; several each write their own logits, mixed after.
  const std::span<float> logits = slot.region<float>(regions_.teacher_logits[unit.teacher()]);
  if (cache_ && run_.teachers.size() > 1) {
    if (!batch_cached(slot)) unit.forward(slot, regions_, rows_, logits.data());
    return;
  }
  if (cache_ && from_cache(slot, logits)) return;
  unit.forward(slot, regions_, rows_, logits.data());
  if (cache_) keep(slot, logits);
}

void TeacherTargets::finish(const Slot& slot) {
  if (!mixing_) return;
  const std::span<float> target = slot.region<float>(*regions_.logits);
  if (cache_) {
    // Every teacher has read the decision (finish_teaching): cleared for the slot's next batch.
    if (decisions_->take(slot.index())) {
      if (!from_cache(slot, target))
        throw std::logic_error("CpuPipeline: a cached batch lost a sample");
      return;
    }
  }
  thread_local std::vector<const float*> each; // grows once per thread, then reused
  each.resize(regions_.teacher_logits.size());
  for (std::size_t k = 0; k < each.size(); ++k)
    each[k] = slot.region<float>(regions_.teacher_logits[k]).data();
  (*run_.mix)(each, rows_, target.size() / rows_, target.data());
  if (cache_) keep(slot, target);
}

bool TeacherTargets::batch_cached(const Slot& slot) {
  return decisions_->ask(slot.index(), [&] { return holds(slot); });
}

bool TeacherTargets::holds(const Slot& slot) const {
  const auto ids = slot.region<std::int64_t>(regions_.loader.ids);
  const std::size_t n = slot.header().samples;
  for (std::size_t i = 0; i < n; ++i)
    if (!cache_->has(static_cast<std::uint64_t>(ids[i]))) return false;
  return true;
}

bool TeacherTargets::from_cache(const Slot& slot, std::span<float> logits) {
  if (!holds(slot)) return false;
  const auto ids = slot.region<std::int64_t>(regions_.loader.ids);
  const std::size_t n = slot.header().samples, classes = cache_->classes();
  thread_local std::vector<float> features; // grows once per thread, then reused
  features.resize(cache_->features());
  for (std::size_t i = 0; i < n; ++i) {
    cache_->load(static_cast<std::uint64_t>(ids[i]), logits.subspan(i * classes, classes),
                 features);
    move_features(slot, i, features, true);
  }
  std::fill(logits.begin() + static_cast<std::ptrdiff_t>(n * classes), logits.end(), 0.f);
  for (const auto& mine : regions_.features)
    for (const std::size_t r : mine) {
      const std::span<float> all = slot.region<float>(r);
      std::fill(all.begin() + static_cast<std::ptrdiff_t>(n * (all.size() / rows_)), all.end(),
                0.f);
    }
  cached_batches_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void TeacherTargets::keep(const Slot& slot, std::span<float> logits) {
  const auto ids = slot.region<std::int64_t>(regions_.loader.ids);
  const std::size_t n = slot.header().samples, classes = cache_->classes();
  thread_local std::vector<float> features;
  features.resize(cache_->features());
  for (std::size_t i = 0; i < n; ++i) {
    move_features(slot, i, features, false);
    cache_->keep(static_cast<std::uint64_t>(ids[i]), logits.subspan(i * classes, classes),
                 features);
    move_features(slot, i, features, true);
  }
}

void TeacherTargets::move_features(const Slot& slot, std::size_t row, std::span<float> kept,
                                   bool into_slot) const {
  std::size_t at = 0;
  for (const auto& mine : regions_.features)
    for (const std::size_t r : mine) {
      const std::span<float> all = slot.region<float>(r);
      const std::size_t per = all.size() / rows_;
      const std::span<float> sample = all.subspan(row * per, per);
      if (into_slot)
        std::copy_n(kept.begin() + static_cast<std::ptrdiff_t>(at), per, sample.begin());
      else
        std::copy(sample.begin(), sample.end(), kept.begin() + static_cast<std::ptrdiff_t>(at));
      at += per;
    }
}

} // namespace kdflow::app
