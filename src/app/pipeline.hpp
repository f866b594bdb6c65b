// What a training run, the overlap benchmark and the core tuner share: the run's inputs resolved
// from the configuration (datasets, augmentation, plan, teacher), and the CPU side of the pipeline
// (the slot ring in pinned memory, the pinned loader and teacher arenas, their stage graphs).
#pragma once

#include "kdflow/affinity/elastic.hpp"
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

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

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

// The run's teacher (run.teacher_path) at the run's batch in `precision`, with every check
// prepare_run makes: its input takes the dataset's samples, its logits are the dataset's classes.
std::shared_ptr<const teacher::Teacher> load_run_teacher(const RunInputs& run,
                                                         teacher::Precision precision);

// Every CUDA device with the allowed CPUs nearest it (all allowed CPUs where hwloc does not know
// the device's locality, as in a container without PCI information); empty without a GPU.
std::vector<affinity::GpuLocality> gpu_localities(const affinity::Topology& topology);

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

// kd-ctl's settings (cores.elastic*).
struct ElasticSettings {
  affinity::ElasticOptions policy;
  double window_s = 1.0; // measurement window
  // Called on kd-ctl's thread after each move with its record (a metrics.jsonl line).
  std::function<void(const nlohmann::json&)> on_move;
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
  // Closes the ring, stops kd-ctl and waits for every stage. Idempotent.
  void stop();

  // After start() with the loaders as the source: starts kd-ctl, a thread (pinned beside the
  // student) that measures the stages every window and moves one CPU at a time between the loader
  // pool and the teacher replicas (affinity::ElasticPolicy decides, move_cpu picks the CPU) within
  // the plan's loader and teacher CPUs. Returns why it did not start when no CPU can move.
  std::optional<std::string> start_elastic(ElasticSettings settings);
  // The CPUs each pool holds now.
  [[nodiscard]] affinity::PoolAssignment assignment() const;
  // kd-ctl's record: windows observed, every move, the assignment now.
  [[nodiscard]] nlohmann::json elastic_summary() const;
  // Moves the pools to `to` now, as kd-ctl does for each move it decides: the giving pool is
  // rebuilt first, then the taking one, each while the other stage runs (a stage being stopped
  // finishes its batches only while the stages around it go on). `to` may hold no more CPUs in all
  // than the plan's loaders and teachers (oneTBB's pool is sized for them): std::invalid_argument.
  // False when the pipeline stopped meanwhile. Serialized with kd-ctl's own moves.
  bool reassign(const affinity::PoolAssignment& to);

  [[nodiscard]] SlotRing& ring() { return *ring_; }
  [[nodiscard]] const SlotRegions& regions() const { return regions_; }
  // Replica k's arena and the loaders' arena (a move replaces them: read them before start() or on
  // the thread that calls reassign()).
  [[nodiscard]] oneapi::tbb::task_arena* teacher_arena(std::size_t k) {
    return k < teachers_.size() ? &teachers_[k]->arena->arena() : nullptr;
  }
  [[nodiscard]] oneapi::tbb::task_arena& loader_arena() { return loader_arena_->arena(); }
  [[nodiscard]] std::size_t replicas() const {
    return replica_count_.load(std::memory_order_relaxed);
  }
  // Busy time summed over the stage's workers (ns), for utilisation figures.
  [[nodiscard]] std::uint64_t loader_busy_ns() const;
  [[nodiscard]] std::uint64_t teacher_busy_ns() const;
  [[nodiscard]] const RunInputs& run() const { return run_; }

private:
  // One teacher replica: its pinned arena, its oneDNN replica (buffers first touched on its
  // cores), its float32 inputs (uint8 slots only) and, once started, its stage graph. Bodies hold
  // a pointer to it: kd-ctl may add and remove replicas while others run.
  struct TeacherUnit {
    std::unique_ptr<affinity::PinnedArena> arena;
    std::unique_ptr<teacher::Replica> replica;
    std::vector<float> inputs;
    std::unique_ptr<StageGraph> graph; // destroyed first: it waits for its bodies
  };
  std::unique_ptr<TeacherUnit> make_teacher(const affinity::CpuList& cpus, int first_index);
  void start_teacher(TeacherUnit& unit);
  void start_loader_graph();
  // The replica's forward pass on `slot`'s inputs into its logits region.
  void run_teacher(TeacherUnit& unit, const Slot& slot);
  // kd-ctl's loop.
  void control(ElasticSettings settings);
  bool rebuild_loaders(const affinity::CpuList& cpus);
  bool rebuild_teachers(const std::vector<affinity::CpuList>& replicas);

  const RunInputs& run_;
  const Sampler& sampler_;
  SlotRegions regions_;
  std::unique_ptr<SlotRing> ring_;
  std::unique_ptr<oneapi::tbb::global_control> parallelism_;
  std::unique_ptr<affinity::PinnedArena> loader_arena_;
  std::unique_ptr<StageGraph> loaders_;
  std::vector<std::unique_ptr<TeacherUnit>> teachers_;
  std::unique_ptr<StageGraph> replay_;
  StageTotals loader_totals_, teacher_totals_;
  std::atomic<std::size_t> replica_count_{0};
  LoaderScratch serial_scratch_;
  std::uint64_t serial_loader_ns_ = 0, serial_teacher_ns_ = 0;

  // What start() was asked for, for the graphs kd-ctl starts later.
  std::uint64_t first_batch_ = 0, end_ = 0;
  SlotState after_load_ = SlotState::filled;
  bool loaders_run_ = false;

  // Structure (arenas, graphs, replicas): kd-ctl's moves against stop(). Never taken by the student
  // on its hot path; a move holds it while stages drain, which needs the student to go on.
  std::mutex structure_mutex_;
  bool stopped_ = false;
  mutable std::mutex record_mutex_; // the assignment and kd-ctl's record (cold, short)
  affinity::PoolAssignment assignment_;
  std::vector<nlohmann::json> moves_;
  std::uint64_t windows_ = 0;
  std::thread controller_;
  std::mutex control_mutex_;
  std::condition_variable control_wake_;
  bool control_stop_ = false;
};

} // namespace kdflow::app
