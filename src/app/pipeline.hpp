// What a training run, the overlap benchmark and the core tuner share: the run's inputs resolved
// from the configuration (datasets, augmentation, plan, teacher), and the CPU side of the pipeline
// (the slot ring in pinned memory, the pinned loader and teacher arenas, their stage graphs).
#pragma once

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/affinity/plan.hpp"
#include "kdflow/core/config.hpp"
#include "kdflow/core/dataset.hpp"
#include "kdflow/core/loader.hpp"
#include "kdflow/core/slot_ring.hpp"
#include "kdflow/core/stage_graph.hpp"
#include "kdflow/cpu_teacher/engine.hpp"

#include <oneapi/tbb/global_control.h>

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace kdflow::app {

struct RunInputs {
  Config config;
  Dataset train;
  Dataset test;
  AugmentConfig augment; // training augmentation (evaluation: the same with augment = false)
  SamplerConfig sampler;
  affinity::Topology topology;
  affinity::Plan plan;
  bool teacher_runs = false;                       // kd.alpha > 0
  std::shared_ptr<const teacher::Teacher> teacher; // loaded when it runs
  std::string teacher_path;
};

// Loads and checks everything the configuration names; InputError (exit 2) naming the key, the
// file, or both sides of a mismatch (teacher classes vs dataset classes, input shapes).
RunInputs prepare_run(const Config& config);

// Runs `fn` on one of `arena`'s own (pinned) workers and waits for it; rethrows what it throws.
void run_in_arena(oneapi::tbb::task_arena& arena, const std::function<void()>& fn);

// Teacher top-1 accuracy on the test split (`images`: normalized_images of it), on `arena`'s cores.
double teacher_test_accuracy(const RunInputs& run, std::span<const float> images,
                             oneapi::tbb::task_arena& arena);

struct SlotRegions {
  LoaderRegions loader;
  std::optional<std::size_t> logits; // the teacher's output region
};

// The CPU half of the pipeline. Construction builds the ring and the pinned arenas (and the teacher
// replicas); start() starts the stage graphs: ring batches [0, batches) carry the sampler's
// batches first_batch + b.
class CpuPipeline {
public:
  // `run` and `sampler` must outlive the pipeline.
  CpuPipeline(const RunInputs& run, const Sampler& sampler, std::uint32_t slots, HostMemory memory);
  ~CpuPipeline(); // stops
  CpuPipeline(const CpuPipeline&) = delete;
  CpuPipeline& operator=(const CpuPipeline&) = delete;

  // The slot layout a run of `run` needs (for sizing the memory before construction).
  static SlotLayout layout_for(const RunInputs& run);

  void start(std::uint64_t first_batch, std::uint64_t batches);
  // Closes the ring and waits for every stage. Idempotent.
  void stop();

  [[nodiscard]] SlotRing& ring() { return *ring_; }
  [[nodiscard]] const SlotRegions& regions() const { return regions_; }
  [[nodiscard]] oneapi::tbb::task_arena* teacher_arena(std::size_t k) {
    return k < teacher_arenas_.size() ? &teacher_arenas_[k]->arena() : nullptr;
  }
  [[nodiscard]] std::size_t replicas() const { return teacher_arenas_.size(); }
  // Busy time summed over the stage's workers (ns), for utilisation figures.
  [[nodiscard]] std::uint64_t loader_busy_ns() const;
  [[nodiscard]] std::uint64_t teacher_busy_ns() const;

private:
  const RunInputs& run_;
  const Sampler& sampler_;
  SlotRegions regions_;
  std::unique_ptr<SlotRing> ring_;
  std::unique_ptr<oneapi::tbb::global_control> parallelism_;
  std::unique_ptr<affinity::PinnedArena> loader_arena_;
  std::vector<std::unique_ptr<affinity::PinnedArena>> teacher_arenas_;
  std::vector<std::unique_ptr<teacher::Replica>> replicas_;
  std::unique_ptr<StageGraph> loaders_;
  std::vector<std::unique_ptr<StageGraph>> teachers_;
};

} // namespace kdflow::app
