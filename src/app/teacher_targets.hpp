// The slot's targets from the run's teachers: each teacher's forward pass into its region, the
// last one to finish a batch mixing several into the target, and kd.cache as a decorator around
// them: a batch whose samples are all kept reads them (logits and features) instead of running
// the teachers, and what the teachers compute is kept. With several teachers, whether a batch is
// cached is decided once, by the first teacher to reach it (SlotDecisions), so every teacher skips
// its forward pass or none does.
#pragma once

#include "teacher_unit.hpp"

#include "kdflow/core/slot_decisions.hpp"
#include "kdflow/core/slot_ring.hpp"
#include "kdflow/core/teacher_cache.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace kdflow::app {

class TeacherTargets {
public:
  // `run` and `regions` outlive it; `slots`: the ring's.
  TeacherTargets(const RunInputs& run, const SlotRegions& regions, const SlotLayout& layout,
                 std::uint32_t slots);

  // What a run of the pipeline asks: `cache` (run.cache, or null: every batch runs the teachers;
  // std::invalid_argument when its features are not the slot's) and whether the last teacher
  // mixes several (false: one teacher, or one teacher of several measured alone).
  void configure(TeacherOutputCache* cache, bool mixing);

  // Teacher `unit.teacher()`'s part of the slot's targets: its forward pass into its logits
  // region (and features), unless the cache serves the batch; with one teacher, what it computed
  // is kept.
  void teach(TeacherUnit& unit, const Slot& slot);
  // After every teacher's teach() (the last one to finish the batch): the target, mixed from
  // their logits or read from the cache, then kept. Nothing to do without mixing.
  void finish(const Slot& slot);

  [[nodiscard]] const TeacherOutputCache* cache() const { return cache_; }
  [[nodiscard]] std::uint64_t cached_batches() const {
    return cached_batches_.load(std::memory_order_relaxed);
  }

private:
  // Whether the cache holds every sample of the slot, decided once per batch however many
  // teachers ask (the first to ask decides; finish() clears it for the slot's next batch).
  bool batch_cached(const Slot& slot);
  [[nodiscard]] bool holds(const Slot& slot) const; // every sample of the slot is kept
  bool from_cache(const Slot& slot, std::span<float> logits);
  // Keeps each of the slot's samples the cache lacks, and each sample's row becomes what the
  // cache serves for it (TeacherOutputCache::keep): one kept already (a batch that was not all
  // cached when a teacher reached it, as the first batches of epoch 2 can be while the last of
  // epoch 1 are still mixed) reads the kept row; under top-K each row is what is kept of it. A
  // sample's target is the same every epoch, whichever way its batch met the cache.
  void keep(const Slot& slot, std::span<float> logits);
  // Sample `row`'s features, every teacher's in order, between the slot's feature regions and
  // `kept` (the cache's features for one sample): into the slot, or out of it.
  void move_features(const Slot& slot, std::size_t row, std::span<float> kept,
                     bool into_slot) const;

  const RunInputs& run_;
  const SlotRegions& regions_;
  const std::size_t rows_;        // of every slot region (the batch size)
  std::size_t slot_features_ = 0; // feature values per sample in the slot's regions
  TeacherOutputCache* cache_ = nullptr;
  bool mixing_ = false;
  std::atomic<std::uint64_t> cached_batches_{0};
  std::unique_ptr<SlotDecisions> decisions_; // several teachers: each slot's batch_cached() answer
};

} // namespace kdflow::app
