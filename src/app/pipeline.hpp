// The CPU half of the pipeline: the slot ring in pinned memory, the pinned loader stage and one
// stage per teacher (teacher_stage.hpp: its replicas), the slot's targets through kd.cache
// (teacher_targets.hpp), and the moves of CPUs between the stages. It knows nothing of the
// student (the run assembles both, run.hpp), of kd-ctl's policy (kd_ctl.hpp drives reassign()),
// nor of the benchmarks' own producers (modes.cpp drives the units itself).
#pragma once

#include "run_inputs.hpp"
#include "teacher_stage.hpp"
#include "teacher_targets.hpp"

#include "kdflow/affinity/elastic.hpp"
#include "kdflow/affinity/pinning.hpp"
#include "kdflow/affinity/plan.hpp"
#include "kdflow/core/loader.hpp"
#include "kdflow/core/slot_ring.hpp"
#include "kdflow/core/stage_graph.hpp"

#include <oneapi/tbb/global_control.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace kdflow::app {

// The slot region of teacher `teacher`'s feature `value` (an ONNX value name).
std::string feature_region(const std::string& value, std::size_t teacher = 0);
// The slot region of teacher k's own logits, with several teachers.
std::string teacher_logits_region(std::size_t k);

// The ring auto-sized: every producer thread (`producers`: the loader workers and the teacher
// replicas that may hold a slot at once) can hold one while the student holds four more (its copy
// group, its step, the next ready ones), at least 8; but the ring (`slot_bytes` a slot) takes at
// most an eighth of `memory_bytes` shared by `ranks_on_node` rings, unless 8 slots already do.
std::uint32_t auto_ring_slots(std::size_t producers, std::size_t slot_bytes, double memory_bytes,
                              int ranks_on_node);

// Which stages CpuPipeline::start() runs: no loaders (a benchmark's own producer fills the slots,
// publishing filling -> after_load()); no teacher (loaded batches go to ready); of several
// teachers, one alone (each batch waits for it, no mix); kd.cache read and filled (run.cache: a
// training run, bench-overlap's cached mode); the loaders on the teacher's CPUs too from the start.
struct StartOptions {
  bool loaders = true, teacher = true;
  std::optional<std::size_t> only_teacher;
  bool cache = false, share_teacher_cpus = false;
};

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
  // The ring's slots for `run`'s plan: ring.slots, or with 0 (auto, the default) auto_ring_slots
  // for a loader worker on each loader and teacher CPU (kd.cache's share puts them on both) and
  // each teacher replica, this slot layout, this machine's memory and the node's ranks.
  // ring.slots = 1: InputError naming it.
  static std::uint32_t slots_for(const RunInputs& run);

  void start(std::uint64_t first_batch, std::uint64_t batches, const StartOptions& options = {});
  // Where a loaded batch goes in the run start() began: filled (the teacher's next) or ready.
  [[nodiscard]] SlotState after_load() const { return after_load_; }
  // Closes the ring and waits for every stage. Idempotent.
  void stop();

  // The CPUs each pool holds now.
  [[nodiscard]] affinity::PoolAssignment assignment() const;
  // Moves the pools to `to` now, the giving pool first, each while the other stage runs. More CPUs
  // than the plan's loaders and teachers (oneTBB's pool is sized for them), or several teachers:
  // std::invalid_argument. False when the pipeline stopped meanwhile. Serialized with stop().
  bool reassign(const affinity::PoolAssignment& to);
  // kd.cache full: the loaders run on the teacher's CPUs too, beside the replicas (which mostly
  // copy kept outputs); no move after it. Like a move it waits for the loaders to drain, which
  // needs the student to go on (call it from another thread). False when there is nothing to
  // share, no loaders run, or the pipeline stopped. (StartOptions::share_teacher_cpus starts so.)
  bool share_teacher_cpus();
  [[nodiscard]] bool shared() const { return shared_.load(std::memory_order_relaxed); }

  [[nodiscard]] SlotRing& ring() { return *ring_; }
  [[nodiscard]] const SlotRegions& regions() const { return regions_; }
  // Teacher t's stage (its replicas) and the loaders' arena (a move replaces replicas and arena:
  // read them before start() or on the thread that calls reassign()).
  [[nodiscard]] TeacherStage& teacher(std::size_t t) { return *teachers_.at(t); }
  [[nodiscard]] std::size_t teachers() const { return teachers_.size(); }
  [[nodiscard]] oneapi::tbb::task_arena& loader_arena() { return loader_arena_->arena(); }
  // Every teacher's replicas, now.
  [[nodiscard]] std::size_t replicas() const {
    return replica_count_.load(std::memory_order_relaxed);
  }
  // The slot's targets from the teachers (with kd.cache: the cache start() uses).
  [[nodiscard]] TeacherTargets& targets() { return *targets_; }
  // What each stage did so far (busy time summed over its workers, batches), across every graph
  // a move replaced; a benchmark's own teacher work is added to the teacher's.
  [[nodiscard]] const StageTotals& loader_totals() const { return loader_totals_; }
  [[nodiscard]] StageTotals& teacher_totals() { return teacher_totals_; }
  [[nodiscard]] const RunInputs& run() const { return run_; }
  // What start() was given: the sampler's batch of ring batch 0, and whether the loaders run.
  [[nodiscard]] std::uint64_t first_batch() const { return first_batch_; }
  [[nodiscard]] bool loaders_run() const { return loaders_run_; }

private:
  // What a replica does with ring batch b: teach its filled slot; the last teacher mixes.
  bool teach(TeacherUnit& unit, std::uint64_t b);
  void start_loader_graph();
  bool rebuild_loaders(const affinity::CpuList& cpus);
  // The loaders' CPUs and the teacher's together, oneTBB's pool raised for them, recorded as the
  // loaders' (under structure_mutex_); empty when the teacher has no CPU the loaders lack.
  affinity::CpuList widen_loaders();
  bool rebuild_teachers(const std::vector<affinity::CpuList>& replicas);

  const RunInputs& run_;
  const Sampler& sampler_;
  SlotRegions regions_;
  std::unique_ptr<SlotRing> ring_;
  std::unique_ptr<TeacherTargets> targets_;
  std::unique_ptr<oneapi::tbb::global_control> parallelism_;
  std::unique_ptr<affinity::PinnedArena> loader_arena_;
  std::unique_ptr<StageGraph> loaders_;
  std::vector<std::unique_ptr<TeacherStage>> teachers_; // one per teacher (a stage's address holds)
  StageTotals loader_totals_, teacher_totals_;
  std::atomic<std::size_t> replica_count_{0};

  // What start() was asked for, for the graphs a move starts later.
  std::uint64_t first_batch_ = 0, end_ = 0;
  SlotState after_load_ = SlotState::filled;
  bool loaders_run_ = false;
  std::atomic<bool> shared_{false}; // share_teacher_cpus() happened

  // Structure (arenas, graphs, replicas): moves against stop(). Never taken by the student on its
  // hot path; a move holds it while stages drain, which needs the student to go on.
  std::mutex structure_mutex_;
  bool stopped_ = false;
  mutable std::mutex assignment_mutex_; // cold, short
  affinity::PoolAssignment assignment_;
};

} // namespace kdflow::app
