// The CPU half of the pipeline (pipeline.hpp): the ring, the pinned loader and teacher arenas,
// their stage graphs, and the moves of CPUs between the pools.
#include "pipeline.hpp"

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

namespace kdflow::app {

void run_in_arena(oneapi::tbb::task_arena& arena, const std::function<void()>& fn) {
  std::atomic<bool> done{false};
  std::exception_ptr error;
  arena.enqueue([&] {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    done.store(true, std::memory_order_release);
    done.notify_all();
  });
  while (!done.load(std::memory_order_acquire)) done.wait(false, std::memory_order_acquire);
  if (error) std::rethrow_exception(error);
}

namespace {

// The teacher's outputs are the graph's (the first is the logits), then its features.
std::size_t first_feature(const teacher::Teacher& t) { return t.graph().outputs.size(); }

// Buffers for every output of `t` but those a slot holds: the logits and the features.
std::vector<std::vector<float>> other_outputs(const teacher::Teacher& t) {
  std::vector<std::vector<float>> out;
  for (std::size_t k = 1; k < first_feature(t); ++k)
    out.emplace_back(static_cast<std::size_t>(teacher::numel(t.output_shape(k))));
  return out;
}

} // namespace

std::string feature_region(const std::string& value, std::size_t teacher) {
  return teacher == 0 ? "feature:" + value : fmt::format("feature{}:{}", teacher, value);
}

std::string teacher_logits_region(std::size_t k) { return fmt::format("logits:teacher{}", k); }

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
  return loader_layout(run.train, run.sampler.batch_size, run.augment.normalize, std::move(extra));
}

CpuPipeline::CpuPipeline(const RunInputs& run, const Sampler& sampler, std::uint32_t slots,
                         HostMemory memory)
    : run_(run), sampler_(sampler) {
  SlotLayout layout = layout_for(run);
  regions_.loader = {layout.index_of("inputs"), layout.index_of("labels"), layout.index_of("ids")};
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
  if (run.teachers.size() > 1) cache_decisions_ = std::make_unique<SlotDecisions>(slots);

  // Every arena's workers come from oneTBB's one global pool: size it for all of them (kd-ctl's
  // moves keep the sum).
  const std::size_t threads = run.plan.loader.size() + affinity::cpu_count(run.plan.teacher);
  parallelism_ = std::make_unique<oneapi::tbb::global_control>(
      oneapi::tbb::global_control::max_allowed_parallelism, threads + 1);
  loader_arena_ = std::make_unique<affinity::PinnedArena>(run.topology, run.plan.loader, "loader");
  assignment_.loader = run.plan.loader;
  if (run.teacher_runs()) {
    int first_index = 0;
    for (std::size_t r = 0; r < run.plan.teacher.size(); ++r) {
      const auto& cpus = run.plan.teacher[r];
      teachers_.push_back(
          make_teacher(cpus, first_index, static_cast<std::size_t>(run.plan.teacher_of.at(r))));
      first_index += static_cast<int>(cpus.size());
    }
    assignment_.teacher = run.plan.teacher;
  }
  replica_count_.store(teachers_.size());
}

CpuPipeline::~CpuPipeline() { stop(); }

std::unique_ptr<CpuPipeline::TeacherUnit>
CpuPipeline::make_teacher(const affinity::CpuList& cpus, int first_index, std::size_t teacher) {
  auto unit = std::make_unique<TeacherUnit>();
  unit->teacher = teacher;
  unit->mixed.assign(run_.teachers.size(), nullptr);
  unit->arena =
      std::make_unique<affinity::PinnedArena>(run_.topology, cpus, "teacher", first_index);
  // The replica's buffers are first touched on its own cores (its NUMA node); with uint8 slots, so
  // is its float32 copy of the batch's inputs.
  run_in_arena(unit->arena->arena(), [&] {
    const auto& model = run_.teachers[teacher].model;
    unit->replica = std::make_unique<teacher::Replica>(model);
    unit->other_outputs = other_outputs(*model);
    unit->outputs.assign(model->output_names().size(), nullptr);
    for (std::size_t k = 0; k < unit->other_outputs.size(); ++k)
      unit->outputs[1 + k] = unit->other_outputs[k].data();
    const ImageAdapter& adapt = run_.teachers[teacher].input;
    if (!run_.augment.normalize || !adapt.passes_floats())
      unit->inputs.assign(run_.sampler.batch_size * adapt.to().numel(), 0.f);
  });
  return unit;
}

void CpuPipeline::start_teacher(TeacherUnit& unit) {
  SlotRing& ring = *ring_;
  const auto lane = static_cast<std::uint32_t>(unit.teacher);
  unit.graph = std::make_unique<StageGraph>(
      run_.teachers.size() > 1 ? fmt::format("teacher {}", unit.teacher) : std::string("teacher"),
      unit.arena->arena(), 1, ring, RingStage::teacher, end_,
      [this, &ring, u = &unit, lane](std::uint64_t b, int) {
        auto slot = ring.acquire_filled(b, lane);
        if (!slot) return false;
        fault::at(fault::Site::teacher, first_batch_ + b, ring);
        {
          trace::Span span("teacher", b);
          run_teacher(*u, *slot);
        }
        // With several teachers the last one to finish the batch mixes them and hands it on.
        if (ring.finish_teaching(*slot)) {
          if (mixing_) mix(*u, *slot);
          ring.publish(*slot, SlotState::teaching, SlotState::ready);
        }
        return true;
      },
      &teacher_totals_, first_batch_, lane);
  unit.graph->start();
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
  if (options.cache && run_.cache) {
    std::size_t features = 0;
    for (const auto& mine : regions_.features)
      for (const std::size_t r : mine)
        features += ring_->layout().regions()[r].bytes / sizeof(float) / batch_rows();
    if (run_.cache->features() != features)
      throw std::invalid_argument(fmt::format(
          "CpuPipeline::start: the cache keeps {} feature values per sample, the slot holds {}",
          run_.cache->features(), features));
  }
  cache_ = options.cache ? run_.cache.get() : nullptr;
  first_batch_ = first_batch;
  end_ = batches;
  after_load_ = teacher ? SlotState::filled : SlotState::ready;
  if (teacher)
    ring_->set_teachers(options.only_teacher ? 1
                                             : static_cast<std::uint32_t>(
                                                   std::max<std::size_t>(run_.teachers.size(), 1)));
  mixing_ = run_.mix.has_value() && !options.only_teacher;
  if (options.loaders) {
    loaders_run_ = true;
    if (options.share_teacher_cpus && run_.teacher_runs())
      if (const affinity::CpuList cpus = widen_loaders(); !cpus.empty())
        loader_arena_ = std::make_unique<affinity::PinnedArena>(run_.topology, cpus, "loader");
    start_loader_graph();
  }
  if (!teacher) return;
  for (auto& unit : teachers_)
    if (!options.only_teacher || unit->teacher == *options.only_teacher) start_teacher(*unit);
}

void CpuPipeline::run_teacher(TeacherUnit& unit, const Slot& slot) {
  // One teacher writes the target itself; several each write their own logits, mixed after.
  const std::span<float> logits = slot.region<float>(regions_.teacher_logits[unit.teacher]);
  if (cache_ && run_.teachers.size() > 1) {
    if (!batch_cached(slot)) forward(unit, slot, logits.data());
    return;
  }
  if (cache_ && from_cache(slot, logits)) return;
  forward(unit, slot, logits.data());
  if (cache_) keep_in_cache(slot, logits);
}

void CpuPipeline::mix(TeacherUnit& unit, const Slot& slot) {
  const std::span<float> target = slot.region<float>(*regions_.logits);
  if (cache_) {
    // Every teacher has read the decision (finish_teaching): cleared for the slot's next batch.
    if (cache_decisions_->take(slot.index())) {
      if (!from_cache(slot, target))
        throw std::logic_error("CpuPipeline: a cached batch lost a sample");
      return;
    }
  }
  for (std::size_t k = 0; k < unit.mixed.size(); ++k)
    unit.mixed[k] = slot.region<float>(regions_.teacher_logits[k]).data();
  const std::size_t rows = batch_rows();
  (*run_.mix)(unit.mixed, rows, target.size() / rows, target.data());
  if (cache_) keep_in_cache(slot, target);
}

bool CpuPipeline::batch_cached(const Slot& slot) {
  return cache_decisions_->ask(slot.index(), [&] { return holds(slot); });
}

bool CpuPipeline::holds(const Slot& slot) const {
  const auto ids = slot.region<std::int64_t>(regions_.loader.ids);
  const std::size_t n = slot.header().samples;
  for (std::size_t i = 0; i < n; ++i)
    if (!cache_->has(static_cast<std::uint64_t>(ids[i]))) return false;
  return true;
}

bool CpuPipeline::from_cache(const Slot& slot, std::span<float> logits) {
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
      std::fill(all.begin() + static_cast<std::ptrdiff_t>(n * (all.size() / batch_rows())),
                all.end(), 0.f);
    }
  cached_batches_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void CpuPipeline::keep_in_cache(const Slot& slot, std::span<float> logits) {
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

std::size_t CpuPipeline::batch_rows() const { return run_.sampler.batch_size; }

void CpuPipeline::move_features(const Slot& slot, std::size_t row, std::span<float> kept,
                                bool into_slot) const {
  std::size_t at = 0;
  for (const auto& mine : regions_.features)
    for (const std::size_t r : mine) {
      const std::span<float> all = slot.region<float>(r);
      const std::size_t per = all.size() / batch_rows();
      const std::span<float> sample = all.subspan(row * per, per);
      if (into_slot)
        std::copy_n(kept.begin() + static_cast<std::ptrdiff_t>(at), per, sample.begin());
      else
        std::copy(sample.begin(), sample.end(), kept.begin() + static_cast<std::ptrdiff_t>(at));
      at += per;
    }
}

void CpuPipeline::forward(TeacherUnit& unit, const Slot& slot, float* logits) {
  std::span<float*> outputs(unit.outputs);
  outputs[0] = logits;
  const std::size_t features = first_feature(*run_.teachers[unit.teacher].model);
  const auto& mine = regions_.features[unit.teacher];
  for (std::size_t k = 0; k < mine.size(); ++k)
    outputs[features + k] = slot.region<float>(mine[k]).data();
  const ImageAdapter& adapt = run_.teachers[unit.teacher].input;
  const std::size_t n = batch_rows();
  if (run_.augment.normalize) {
    const float* images = slot.region<float>(regions_.loader.inputs).data();
    if (adapt.passes_floats()) {
      unit.replica->run(images, outputs);
      return;
    }
    adapt.run(images, n, unit.inputs.data(), unit.scratch);
  } else {
    // uint8 slots: normalized as the loader would have (and resized for the teacher's input).
    adapt.run(slot.region<std::uint8_t>(regions_.loader.inputs).data(), n, unit.inputs.data(),
              unit.scratch);
  }
  unit.replica->run(unit.inputs.data(), outputs);
}

void CpuPipeline::teach_now(const Slot& slot) {
  const auto t0 = std::chrono::steady_clock::now();
  TeacherUnit* last = nullptr;
  for (std::size_t t = 0; t < std::max<std::size_t>(run_.teachers.size(), 1); ++t) {
    const auto unit = std::find_if(teachers_.begin(), teachers_.end(),
                                   [&](const auto& u) { return u->teacher == t; });
    last = unit->get();
    run_in_arena(last->arena->arena(), [&] {
      trace::Span span("teacher", slot.header().batch);
      run_teacher(*last, slot);
    });
  }
  if (run_.mix) mix(*last, slot);
  count_teacher_batch(t0);
}

void CpuPipeline::count_teacher_batch(std::chrono::steady_clock::time_point since) {
  teacher_totals_.busy_ns.fetch_add(
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now() - since)
                                     .count()),
      std::memory_order_relaxed);
  teacher_totals_.batches.fetch_add(1, std::memory_order_relaxed);
}

void CpuPipeline::start_background_teachers() {
  background_stop_.store(false);
  background_started_.store(0);
  for (auto& unit : teachers_) {
    background_running_.fetch_add(1);
    unit->arena->arena().enqueue([this, u = unit.get()] {
      background_started_.fetch_add(1);
      background_started_.notify_all();
      // An unrelated batch: fixed values, the replica's own input and output buffers.
      const teacher::Teacher& model = *run_.teachers[u->teacher].model;
      const std::size_t in = static_cast<std::size_t>(model.batch()) *
                             static_cast<std::size_t>(run_.teachers[u->teacher].input.to().numel());
      std::vector<float> inputs(in, 0.5f);
      teacher::OutputBuffers outputs(model);
      for (std::uint64_t n = 0; !background_stop_.load(std::memory_order_relaxed); ++n) {
        const auto t0 = std::chrono::steady_clock::now();
        try {
          trace::Span span("teacher", n);
          u->replica->run(inputs.data(), outputs.pointers);
        } catch (...) {
          break; // the same replica fails in the measured modes, which report it
        }
        count_teacher_batch(t0);
      }
      if (background_running_.fetch_sub(1) == 1) background_running_.notify_all();
    });
  }
  // Every replica is at work when the measured steps begin.
  for (std::size_t n = background_started_.load(); n < teachers_.size();
       n = background_started_.load())
    background_started_.wait(n);
}

void CpuPipeline::stop_background_teachers() {
  background_stop_.store(true);
  for (int n = background_running_.load(); n != 0; n = background_running_.load())
    background_running_.wait(n);
}

void CpuPipeline::stop() {
  // A move in progress ends: the closed ring releases every body it waits for.
  ring_->close();
  std::lock_guard lock(structure_mutex_);
  stopped_ = true;
  for (auto& unit : teachers_)
    if (unit->graph) unit->graph->wait();
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
  loader_arena_ = std::make_unique<affinity::PinnedArena>(run_.topology, cpus, "loader");
  start_loader_graph();
  return true;
}

bool CpuPipeline::rebuild_teachers(const std::vector<affinity::CpuList>& replicas) {
  int first_index = 0;
  for (std::size_t k = 0; k < std::max(replicas.size(), teachers_.size()); ++k) {
    const bool keep =
        k < replicas.size() && k < teachers_.size() && teachers_[k]->arena->cpus() == replicas[k];
    if (!keep && k < teachers_.size()) {
      teachers_[k]->graph->request_stop();
      teachers_[k]->graph->wait();
      if (ring_->closed()) return false;
    }
    if (k < replicas.size()) {
      if (!keep) {
        auto unit = make_teacher(replicas[k], first_index, 0);
        start_teacher(*unit);
        if (k < teachers_.size())
          teachers_[k] = std::move(unit);
        else
          teachers_.push_back(std::move(unit));
      }
      first_index += static_cast<int>(replicas[k].size());
    }
  }
  teachers_.resize(replicas.size());
  replica_count_.store(teachers_.size(), std::memory_order_relaxed);
  return true;
}

} // namespace kdflow::app
