// The CPU half of the pipeline: the slot ring in pinned memory, the pinned loader and teacher
// arenas and their stage graphs, and the moves of CPUs between them. It knows nothing of the
// student (the run assembles both, run.hpp) nor of kd-ctl's policy (kd_ctl.hpp drives reassign()).
#pragma once

#include "run_inputs.hpp"

#include "kdflow/affinity/elastic.hpp"
#include "kdflow/affinity/pinning.hpp"
#include "kdflow/affinity/plan.hpp"
#include "kdflow/core/loader.hpp"
#include "kdflow/core/slot_decisions.hpp"
#include "kdflow/core/slot_ring.hpp"
#include "kdflow/core/stage_graph.hpp"
#include "kdflow/core/teacher_cache.hpp"
#include "kdflow/cpu_teacher/engine.hpp"

#include <oneapi/tbb/global_control.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace kdflow::app {

// Runs `fn` on one of `arena`'s own (pinned) workers and waits for it; rethrows what it throws.
void run_in_arena(oneapi::tbb::task_arena& arena, const std::function<void()>& fn);

struct SlotRegions {
  LoaderRegions loader;
  std::optional<std::size_t> logits; // the teacher's output region (several: their mix, the target)
  // Each teacher's features' regions, in its order ([teacher]'s: teacher.features first).
  std::vector<std::vector<std::size_t>> features;
  std::vector<std::size_t> teacher_logits; // several teachers: each one's own logits, in order
};

// The slot region of teacher `teacher`'s feature `value` (an ONNX value name).
std::string feature_region(const std::string& value, std::size_t teacher = 0);
// The slot region of teacher k's own logits, with several teachers.
std::string teacher_logits_region(std::size_t k);

// Construction builds the ring and the pinned arenas (and the teacher replicas); start() starts
// the stage graphs: ring batches [0, batches) carry the sampler's batches first_batch + b.
class CpuPipeline {
public:
  // `run` and `sampler` must outlive the pipeline.
  CpuPipeline(const RunInputs& run, const Sampler& sampler, std::uint32_t slots, HostMemory memory);
  ~CpuPipeline(); // stops
  CpuPipeline(const CpuPipeline&) = delete;
  CpuPipeline& operator=(const CpuPipeline&) = delete;

  // The slot layout a run of `run` needs (for sizing the memory before construction).
  static SlotLayout layout_for(const RunInputs& run);

  struct StartOptions {
    // false: the loader stage does not run, and the caller fills the slots itself (a benchmark's
    // own producer), publishing filling -> after_load().
    bool loaders = true;
    bool teacher = true; // false: the teacher's stage does not run (loaded batches go to ready)
    // With several teachers: only this one's replicas run (each batch waits for it alone, and the
    // target is not mixed): a benchmark's stage alone.
    std::optional<std::size_t> only_teacher;
    // The run's teacher-output cache (run.cache) is read and filled (a training run,
    // bench-overlap's cached mode); false: the teacher runs for every batch.
    bool cache = false;
    // The loaders start on the teacher's CPUs too (share_teacher_cpus(), for a cache that already
    // holds every sample).
    bool share_teacher_cpus = false;
  };
  void start(std::uint64_t first_batch, std::uint64_t batches) {
    start(first_batch, batches, StartOptions{});
  }
  void start(std::uint64_t first_batch, std::uint64_t batches, const StartOptions& options);
  // Where a loaded batch goes in the run start() began: filled (the teacher's next) or ready.
  [[nodiscard]] SlotState after_load() const { return after_load_; }
  // Runs each teacher's first replica's forward pass on `slot` on its cores, one after the other,
  // and their mix, for the calling thread, which waits (a hand-written loop's order of work, for
  // the serial baseline); counted as teacher work.
  void teach_now(const Slot& slot);
  // The contention ceiling's load: every replica runs its forward pass again and again on its own
  // cores, on a batch of its own (no ring), until stop_background_teachers(), which waits for
  // them. Their work counts as teacher work.
  void start_background_teachers();
  void stop_background_teachers();
  // Closes the ring and waits for every stage. Idempotent.
  void stop();

  // The CPUs each pool holds now.
  [[nodiscard]] affinity::PoolAssignment assignment() const;
  // Moves the pools to `to` now: the giving pool is rebuilt first, then the taking one, each while
  // the other stage runs (a stage being stopped finishes its batches only while the stages around
  // it go on). `to` may hold no more CPUs in all than the plan's loaders and teachers (oneTBB's
  // pool is sized for them), or the run has several teachers: std::invalid_argument. False when
  // the pipeline stopped meanwhile. Serialized with other moves and with stop().
  bool reassign(const affinity::PoolAssignment& to);

  // kd.cache, once it holds what the teacher stage is asked for: the loaders run on the teacher's
  // CPUs too, beside the replicas (which then mostly copy kept outputs, or compute a sample the
  // cache lacks, on the CPUs they had); reassign() makes no move after it (it returns false).
  // Like a move it waits for the loaders to drain, which needs the student to go on: call it from
  // another thread while the student steps. False when there is nothing to share, no loaders
  // run, or the pipeline stopped meanwhile. (StartOptions::share_teacher_cpus starts so.)
  bool share_teacher_cpus();
  [[nodiscard]] bool shared() const { return shared_.load(std::memory_order_relaxed); }

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
  // What each stage did so far (busy time summed over its workers, batches), across every graph
  // a move replaced.
  [[nodiscard]] const StageTotals& loader_totals() const { return loader_totals_; }
  [[nodiscard]] const StageTotals& teacher_totals() const { return teacher_totals_; }
  // kd.cache: the teacher's outputs kept per sample (null without, or when start() was told not to
  // use it), and the teacher batches read from it instead of run.
  [[nodiscard]] const TeacherOutputCache* cache() const { return cache_; }
  [[nodiscard]] std::uint64_t cached_batches() const {
    return cached_batches_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] const RunInputs& run() const { return run_; }
  // What start() was given: the sampler's batch of ring batch 0, and whether the loaders run.
  [[nodiscard]] std::uint64_t first_batch() const { return first_batch_; }
  [[nodiscard]] bool loaders_run() const { return loaders_run_; }

private:
  // One teacher replica: its pinned arena, its oneDNN replica (buffers first touched on its
  // cores), its float32 input when the slot's images are not it as they are (uint8 slots, or
  // teacher.input_size/mean/std) and, once started, its stage graph. Bodies hold a pointer to it:
  // moves may add and remove replicas while others run.
  struct TeacherUnit {
    std::size_t teacher = 0; // which of the run's teachers it runs
    std::unique_ptr<affinity::PinnedArena> arena;
    std::unique_ptr<teacher::Replica> replica;
    std::vector<float> inputs, scratch; // scratch: the adapter's box reduction
    // The graph's outputs past the first, which no slot region holds; and every output's
    // pointer for the replica (the slot's regions are set per batch).
    std::vector<std::vector<float>> other_outputs;
    std::vector<float*> outputs;
    std::vector<const float*> mixed; // several teachers: each one's logits, for their mix

    std::unique_ptr<StageGraph> graph; // destroyed first: it waits for its bodies
  };
  std::unique_ptr<TeacherUnit> make_teacher(const affinity::CpuList& cpus, int first_index,
                                            std::size_t teacher);
  void start_teacher(TeacherUnit& unit);
  // One teacher batch done, begun at `since`: its time counts as teacher work.
  void count_teacher_batch(std::chrono::steady_clock::time_point since);
  void start_loader_graph();
  // `slot`'s logits (and features): from the cache when it holds every sample of the slot, else
  // the replica's forward pass on the slot's inputs (then kept in the cache). Several teachers: the
  // cache holds their mix, so a teacher runs unless the slot's batch is cached (the one decision of
  // batch_cached), and mix() reads the target from the cache or mixes and keeps it.
  void run_teacher(TeacherUnit& unit, const Slot& slot);
  void forward(TeacherUnit& unit, const Slot& slot, float* logits);
  // Several teachers: the slot's target from each teacher's logits (the last one to finish).
  void mix(TeacherUnit& unit, const Slot& slot);
  // Whether the cache holds every sample of the slot, decided once per batch however many
  // teachers ask (the first to ask decides; mix() clears it for the slot's next batch).
  bool batch_cached(const Slot& slot);
  [[nodiscard]] bool holds(const Slot& slot) const; // every sample of the slot is kept
  bool from_cache(const Slot& slot, std::span<float> logits);
  // Keeps each of the slot's samples the cache lacks, and each sample's row becomes what the
  // cache serves for it (TeacherOutputCache::keep): one kept already (a batch that was not all
  // cached when a teacher reached it, as the first batches of epoch 2 can be while the last of
  // epoch 1 are still mixed) reads the kept row; under top-K each row is what is kept of it. A
  // sample's target is the same every epoch, whichever way its batch met the cache.
  void keep_in_cache(const Slot& slot, std::span<float> logits);
  // Sample `row`'s features, every teacher's in order, between the slot's feature regions and
  // `kept` (the cache's features for one sample): into the slot, or out of it.
  void move_features(const Slot& slot, std::size_t row, std::span<float> kept,
                     bool into_slot) const;
  [[nodiscard]] std::size_t batch_rows() const; // the rows of every slot region
  bool rebuild_loaders(const affinity::CpuList& cpus);
  // The loaders' CPUs and the teacher's together, oneTBB's pool raised for them, recorded as the
  // loaders' (under structure_mutex_); empty when the teacher has no CPU the loaders lack.
  affinity::CpuList widen_loaders();
  bool rebuild_teachers(const std::vector<affinity::CpuList>& replicas);

  const RunInputs& run_;
  const Sampler& sampler_;
  SlotRegions regions_;
  std::unique_ptr<SlotRing> ring_;
  std::unique_ptr<oneapi::tbb::global_control> parallelism_;
  std::unique_ptr<affinity::PinnedArena> loader_arena_;
  std::unique_ptr<StageGraph> loaders_;
  std::vector<std::unique_ptr<TeacherUnit>> teachers_;
  StageTotals loader_totals_, teacher_totals_;
  TeacherOutputCache* cache_ = nullptr; // run.cache, when start() uses it
  std::atomic<std::uint64_t> cached_batches_{0};
  // Several teachers: per ring slot, its batch's batch_cached() answer.
  std::unique_ptr<SlotDecisions> cache_decisions_;
  std::atomic<bool> background_stop_{false};
  std::atomic<int> background_running_{0};
  std::atomic<std::size_t> background_started_{0};
  std::atomic<std::size_t> replica_count_{0};

  // What start() was asked for, for the graphs a move starts later.
  std::uint64_t first_batch_ = 0, end_ = 0;
  SlotState after_load_ = SlotState::filled;
  bool loaders_run_ = false;
  bool mixing_ = false; // every one of several teachers runs: the last one mixes their logits
  std::atomic<bool> shared_{false}; // share_teacher_cpus() happened

  // Structure (arenas, graphs, replicas): moves against stop(). Never taken by the student on its
  // hot path; a move holds it while stages drain, which needs the student to go on.
  std::mutex structure_mutex_;
  bool stopped_ = false;
  mutable std::mutex assignment_mutex_; // cold, short
  affinity::PoolAssignment assignment_;
};

} // namespace kdflow::app
