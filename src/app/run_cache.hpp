// kd.cache during a training run: whether it holds every sample this rank is dealt an epoch, the
// move that then lets the loaders run on the teacher's CPUs too (on a thread of its own: it waits
// for the loaders to drain, which needs the student to go on), its file kept up to date, and what
// summary.json says of it.
#pragma once

#include "pipeline.hpp"
#include "run_inputs.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <thread>

#include <nlohmann/json_fwd.hpp>

namespace kdflow::app {

class RunCache {
public:
  // `per_epoch`: the batches of an epoch. The cache's samples now are those its file held.
  RunCache(const RunInputs& run, CpuPipeline& pipeline, std::uint64_t per_epoch);
  ~RunCache(); // closes the ring if a move is still in progress, and joins it
  RunCache(const RunCache&) = delete;
  RunCache& operator=(const RunCache&) = delete;

  // Whether the cache holds every sample this rank is dealt an epoch.
  [[nodiscard]] bool holds_an_epoch() const;
  // The pipeline started with the loaders on the teacher's CPUs already (at `batch`): recorded.
  void shared_at_start(std::uint64_t batch);
  // At an epoch's end (`batch`, the next the student takes): once the cache holds an epoch, starts
  // the move on its own thread (`kd_ctl`: kd-ctl runs, and moves no more after it).
  void share_when_full(std::uint64_t batch, bool kd_ctl);
  // Joins a move in progress (after the ring closed, which ends it).
  void join();
  // kd.cache = disk: writes the outputs kept so far to the run's file when some were added since
  // it was read or last written. A write that fails is a warning: the run goes on, the previous
  // file whole.
  void save();
  // summary.json's teacher_cache (null without a cache).
  [[nodiscard]] nlohmann::json summary() const;

private:
  const RunInputs& run_;
  CpuPipeline& pipeline_;
  const std::uint64_t per_epoch_;
  std::size_t saved_ = 0;                    // samples in the file as read or last written
  std::size_t read_ = 0;                     // samples read from the file at start
  std::optional<std::uint64_t> shared_from_; // written by the move's thread, read after the join
  std::thread sharing_;
};

} // namespace kdflow::app
