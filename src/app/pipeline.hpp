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
#include "kdflow/gpu_student/trainer.hpp"

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

// The configuration of a command: defaults, then the file, then each --set, then --cores (a plan
// file, as cores.plan).
Config resolve_config(const std::string& file, const std::vector<std::string>& sets,
                      const std::string& cores = {});

// Loads and checks everything the configuration names; InputError (exit 2) naming the key, the
// file, or both sides of a mismatch (teacher classes vs dataset classes, input shapes).
RunInputs prepare_run(const Config& config);

// The student's options from the run's configuration; `total_steps` is the schedule's length.
student::TrainerOptions trainer_options(const RunInputs& run, std::int64_t total_steps);

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

  // Where batches come from: the loader stage, or a replay of the first lap (each slot loaded once,
  // then handed on again as it is; the logits region gets fixed synthetic values unless the
  // teacher runs), so a benchmark can measure the stages after the loaders alone.
  enum class Source { loaders, replay };
  struct StartOptions {
    Source source = Source::loaders;
    bool teacher = true; // false: the teacher's stage does not run (loaded batches go to ready)
  };
  void start(std::uint64_t first_batch, std::uint64_t batches) {
    start(first_batch, batches, StartOptions{});
  }
  void start(std::uint64_t first_batch, std::uint64_t batches, const StartOptions& options);
  // Without starting the stages: the calling thread loads ring batch `b` on the loader cores, then
  // runs the teacher on it on the first replica's cores, one after the other, and leaves it ready
  // (a hand-written loop's order of work, for the serial baseline).
  void produce_serially(std::uint64_t b);
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
  [[nodiscard]] const RunInputs& run() const { return run_; }

private:
  // Replica k's forward pass on `slot`'s inputs into its logits region.
  void run_teacher(std::size_t k, const Slot& slot);

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
  std::unique_ptr<StageGraph> replay_;
  std::vector<std::vector<float>> teacher_inputs_; // per replica, uint8 slots only
  LoaderScratch serial_scratch_;
  std::uint64_t serial_loader_ns_ = 0, serial_teacher_ns_ = 0;
};

} // namespace kdflow::app
