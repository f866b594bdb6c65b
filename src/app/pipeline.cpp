// The CPU half of the pipeline (pipeline.hpp): the ring, the pinned loader and teacher arenas,
// their stage graphs, and the moves of CPUs between the pools.
#include "pipeline.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/fault_hooks.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/core/trace.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <ranges>
#include <stdexcept>

#include <fmt/format.h>

#include <unistd.h>

namespace kdflow::app {

std::string feature_region(const std::string& value, std::size_t teacher) {
  return teacher == 0 ? "feature:" + value : fmt::format("feature{}:{}", teacher, value);
}

std::string teacher_logits_region(std::size_t k) { return fmt::format("logits:teacher{}", k); }

std::uint32_t auto_ring_slots(std::size_t producers, std::size_t slot_bytes, double memory_bytes,
                              int ranks_on_node) {
  constexpr std::size_t kFewest = 8, kStudent = 4, kMost = 4096;
  std::size_t slots = std::clamp(producers + kStudent, kFewest, kMost);
  const double share = memory_bytes / 8.0 / static_cast<double>(std::max(ranks_on_node, 1));
  const double fit = share / static_cast<double>(std::max<std::size_t>(slot_bytes, 1));
  if (static_cast<double>(slots) > fit)
    slots = std::max(kFewest, static_cast<std::size_t>(std::max(fit, 0.0)));
  return static_cast<std::uint32_t>(slots);
}

std::uint32_t CpuPipeline::slots_for(const RunInputs& run) {
  const std::int64_t set = run.config.get_int("ring.slots");
  if (set == 1)
    throw InputError("ring.slots = 1: the ring needs at least 2 (0: sized for the plan)");
  if (set > 0) return static_cast<std::uint32_t>(set);
  const double memory =
      static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  // A loader worker may run on every loader and teacher CPU (kd.cache's share, kd-ctl's moves),
  // beside every replica.
  const std::size_t producers =
      run.plan.loader.size() + affinity::cpu_count(run.plan.teacher) + run.plan.teacher.size();
  return auto_ring_slots(producers, layout_for(run).slot_bytes(), memory, run.dist.local_world);
}

SlotLayout CpuPipeline::layout_for(const RunInputs& run) {
  std::vector<RegionSpec> extra;
  if (run.teacher_runs()) {
    const teacher::Shape out = run.teachers.front().model->output_shape(0);
    extra.push_back({"logits", DType::f32, {out[0], out[1]}});
    for (std::size_t i = 0; i < run.teachers.size(); ++i) {
      const teacher::Teacher& t = *run.teachers[i].model;
      const auto names = t.output_names();
      for (std::size_t k = first_feature(t); k < names.size(); ++k)
        extra.push_back({feature_region(names[k], i), DType::f32, t.output_shape(k)});
    }
    if (run.teachers.size() > 1)
      for (std::size_t k = 0; k < run.teachers.size(); ++k)
        extra.push_back({teacher_logits_region(k), DType::f32, {out[0], out[1]}});
  }
  if (run.augment.mixes())
    for (auto& r : mix_regions(run.sampler.batch_size)) extra.push_back(std::move(r));
  return loader_layout(run.train, run.sampler.batch_size, run.augment.normalize, std::move(extra));
}

CpuPipeline::CpuPipeline(const RunInputs& run, const Sampler& sampler, std::uint32_t slots,
                         HostMemory memory)
    : run_(run), sampler_(sampler) {
  SlotLayout layout = layout_for(run);
  regions_.loader = loader_regions(layout);
  if (run.teacher_runs()) {
    regions_.logits = layout.index_of("logits");
    for (std::size_t i = 0; i < run.teachers.size(); ++i) {
      const teacher::Teacher& t = *run.teachers[i].model;
      const auto names = t.output_names();
      regions_.features.emplace_back();
      for (std::size_t k = first_feature(t); k < names.size(); ++k)
        regions_.features.back().push_back(layout.index_of(feature_region(names[k], i)));
    }
    if (run.teachers.size() > 1)
      for (std::size_t k = 0; k < run.teachers.size(); ++k)
        regions_.teacher_logits.push_back(layout.index_of(teacher_logits_region(k)));
    else
      regions_.teacher_logits.push_back(*regions_.logits);
  }
  ring_ = std::make_unique<SlotRing>(
      std::move(layout), slots, std::move(memory),
      static_cast<std::uint32_t>(std::max<std::size_t>(run.teachers.size(), 1)));
  targets_ = std::make_unique<TeacherTargets>(run, regions_, ring_->layout(), slots);

  // Every arena's workers come from oneTBB's one global pool: size it for all of them (kd-ctl's
  // moves keep the sum).
  const std::size_t threads = run.plan.loader.size() + affinity::cpu_count(run.plan.teacher);
  parallelism_ = std::make_unique<oneapi::tbb::global_control>(
      oneapi::tbb::global_control::max_allowed_parallelism, threads + 1);
  loader_arena_ = std::make_unique<affinity::PinnedArena>(
      run.topology, run.plan.loader, "loader", 0, producer_priority(run, run.plan.loader));
  assignment_.loader = run.plan.loader;
  if (run.teacher_runs()) {
    for (std::size_t t = 0; t < run.teachers.size(); ++t)
      teachers_.push_back(std::make_unique<TeacherStage>(run, t));
    int first_index = 0;
    for (std::size_t r = 0; r < run.plan.teacher.size(); ++r) {
      const auto& cpus = run.plan.teacher[r];
      teachers_.at(static_cast<std::size_t>(run.plan.teacher_of.at(r)))->add(cpus, first_index);
      first_index += static_cast<int>(cpus.size());
    }
    assignment_.teacher = run.plan.teacher;
  }
  replica_count_.store(run.teacher_runs() ? run.plan.teacher.size() : 0);
}

CpuPipeline::~CpuPipeline() { stop(); }

bool CpuPipeline::teach(TeacherUnit& unit, std::uint64_t b) {
  SlotRing& ring = *ring_;
  auto slot = ring.acquire_filled(b, static_cast<std::uint32_t>(unit.teacher()));
  if (!slot) return false;
  fault::at(fault::Site::teacher, first_batch_ + b, ring);
  {
    trace::Span span("teacher", b);
    targets_->teach(unit, *slot);
  }
  // With several teachers the last one to finish the batch mixes them and hands it on.
  if (ring.finish_teaching(*slot)) {
    targets_->finish(*slot);
    ring.publish(*slot, SlotState::teaching, SlotState::ready);
  }
  return true;
}

void CpuPipeline::start_loader_graph() {
  loaders_ = start_loaders(loader_arena_->arena(), static_cast<int>(loader_arena_->cpus().size()),
                           *ring_, run_.train, sampler_, run_.augment, regions_.loader,
                           first_batch_, end_, after_load_, &loader_totals_);
}

void CpuPipeline::start(std::uint64_t first_batch, std::uint64_t batches,
                        const StartOptions& options) {
  std::lock_guard lock(structure_mutex_);
  const bool teacher = run_.teacher_runs() && options.teacher;
  if (options.only_teacher && *options.only_teacher >= run_.teachers.size())
    throw std::invalid_argument("CpuPipeline::start: no such teacher");
  if (options.cache && options.only_teacher && run_.teachers.size() > 1)
    throw std::invalid_argument("CpuPipeline::start: the cache holds the teachers' mix, not the "
                                "outputs of one teacher alone");
  // The last of several teachers mixes their logits into the target, unless one runs alone.
  targets_->configure(options.cache ? run_.cache.get() : nullptr,
                      run_.mix.has_value() && !options.only_teacher);
  first_batch_ = first_batch;
  end_ = batches;
  after_load_ = teacher ? SlotState::filled : SlotState::ready;
  if (teacher)
    ring_->set_teachers(options.only_teacher ? 1
                                             : static_cast<std::uint32_t>(
                                                   std::max<std::size_t>(run_.teachers.size(), 1)));
  if (options.loaders) {
    loaders_run_ = true;
    if (options.share_teacher_cpus && run_.teacher_runs())
      if (const affinity::CpuList cpus = widen_loaders(); !cpus.empty())
        loader_arena_ = std::make_unique<affinity::PinnedArena>(run_.topology, cpus, "loader", 0,
                                                                producer_priority(run_, cpus));
    start_loader_graph();
  }
  if (!teacher) return;
  for (auto& stage : teachers_)
    if (!options.only_teacher || stage->teacher() == *options.only_teacher)
      stage->start({ring_.get(), first_batch_, end_, &teacher_totals_,
                    [this](TeacherUnit& unit, std::uint64_t b) { return teach(unit, b); }});
}

void CpuPipeline::stop() {
  // A move in progress ends: the closed ring releases every body it waits for.
  ring_->close();
  std::lock_guard lock(structure_mutex_);
  stopped_ = true;
  for (auto& stage : teachers_) stage->wait();
  if (loaders_) loaders_->wait();
}

affinity::PoolAssignment CpuPipeline::assignment() const {
  std::lock_guard lock(assignment_mutex_);
  return assignment_;
}

bool CpuPipeline::reassign(const affinity::PoolAssignment& to) {
  if (to.loader.empty() || to.teacher.empty() ||
      std::ranges::any_of(to.teacher, [](const affinity::CpuList& r) { return r.empty(); }) ||
      to.loader.size() + affinity::cpu_count(to.teacher) >
          run_.plan.loader.size() + affinity::cpu_count(run_.plan.teacher))
    throw std::invalid_argument("reassign: each pool needs a CPU, and all of them no more than the "
                                "plan's loader and teacher CPUs");
  std::lock_guard lock(structure_mutex_);
  if (!run_.teacher_runs() || !loaders_run_)
    throw std::invalid_argument("reassign: the loaders and the teacher are not running");
  if (run_.teachers.size() > 1)
    throw std::invalid_argument("reassign: the run has several teachers");
  if (stopped_ || ring_->closed() || shared_.load(std::memory_order_relaxed)) return false;
  const affinity::PoolAssignment from = assignment();
  const bool ok = to.loader.size() < from.loader.size()
                      ? rebuild_loaders(to.loader) && rebuild_teachers(to.teacher)
                      : rebuild_teachers(to.teacher) && rebuild_loaders(to.loader);
  if (!ok) return false;
  std::lock_guard record(assignment_mutex_);
  assignment_ = to;
  return true;
}

affinity::CpuList CpuPipeline::widen_loaders() {
  const affinity::PoolAssignment now = assignment();
  affinity::CpuList cpus = now.loader;
  for (const auto& replica : now.teacher)
    for (const int c : replica)
      if (std::find(cpus.begin(), cpus.end(), c) == cpus.end()) cpus.push_back(c);
  if (cpus.size() == now.loader.size()) return {};
  // oneTBB's pool gets room for the wider loader arena (the smallest limit in force applies: the
  // new one is made before the old one goes).
  auto wider = std::make_unique<oneapi::tbb::global_control>(
      oneapi::tbb::global_control::max_allowed_parallelism,
      cpus.size() + affinity::cpu_count(now.teacher) + 1);
  std::swap(parallelism_, wider);
  wider.reset();
  shared_.store(true, std::memory_order_relaxed);
  std::lock_guard record(assignment_mutex_);
  assignment_.loader = cpus;
  return cpus;
}

bool CpuPipeline::share_teacher_cpus() {
  std::lock_guard lock(structure_mutex_);
  if (!run_.teacher_runs() || !loaders_run_ || stopped_ || ring_->closed() ||
      shared_.load(std::memory_order_relaxed))
    return false;
  const affinity::CpuList cpus = widen_loaders();
  return !cpus.empty() && rebuild_loaders(cpus);
}

bool CpuPipeline::rebuild_loaders(const affinity::CpuList& cpus) {
  if (cpus == loader_arena_->cpus()) return true;
  loaders_->request_stop();
  loaders_->wait();
  if (ring_->closed()) return false;
  loaders_.reset();
  loader_arena_.reset(); // its workers return to oneTBB's pool; the new arena's are re-pinned
  loader_arena_ = std::make_unique<affinity::PinnedArena>(run_.topology, cpus, "loader", 0,
                                                          producer_priority(run_, cpus));
  start_loader_graph();
  return true;
}

bool CpuPipeline::rebuild_teachers(const std::vector<affinity::CpuList>& replicas) {
  // One teacher (reassign() refuses several).
  if (!teachers_.front()->rebuild(replicas, 0)) return false;
  replica_count_.store(replicas.size(), std::memory_order_relaxed);
  return true;
}

} // namespace kdflow::app
