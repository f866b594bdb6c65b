// The measuring modes (modes.hpp): one repetition assembles the run's pipeline and student, feeds
// them from the loaders or from the benchmark's own producers, and measures its window.
#include "modes.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/arena_thread.hpp"
#include "kdflow/core/trace.hpp"
#include "kdflow/gpu_student/device.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

namespace kdflow::app {

using Clock = std::chrono::steady_clock;

const char* mode_name(Mode m) {
  switch (m) {
  case Mode::student_alone: return "student-alone";
  case Mode::student_contended: return "student-contended";
  case Mode::teacher_alone: return "teacher-alone";
  case Mode::loader_alone: return "loader-alone";
  case Mode::serial_cpu: return "serial-cpu";
  case Mode::colocated: return "colocated";
  case Mode::loop: return "loop";
  case Mode::overlapped: return "overlapped";
  case Mode::overlapped_cached: return "overlapped-cached";
  }
  return "?";
}

bool student_runs(Mode m) { return m != Mode::teacher_alone && m != Mode::loader_alone; }

namespace {

// One teacher batch done, begun at `since`: its time counts as teacher work.
void count_teacher_batch(CpuPipeline& pipeline, Clock::time_point since) {
  StageTotals& totals = pipeline.teacher_totals();
  totals.busy_ns.fetch_add(
      static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count()),
      std::memory_order_relaxed);
  totals.batches.fetch_add(1, std::memory_order_relaxed);
}

// The serial baseline's teacher work: each teacher's first replica's forward pass on `slot` on
// its cores, one after the other, then their mix, for the calling thread, which waits (a
// hand-written loop's order of work); counted as teacher work.
void teach_now(CpuPipeline& pipeline, const Slot& slot) {
  const auto t0 = Clock::now();
  for (std::size_t t = 0; t < pipeline.teachers(); ++t) {
    TeacherUnit& unit = pipeline.teacher(t).unit(0);
    run_in_arena(unit.arena(), [&] {
      trace::Span span("teacher", slot.header().batch);
      pipeline.targets().teach(unit, slot);
    });
  }
  pipeline.targets().finish(slot);
  count_teacher_batch(pipeline, t0);
}

// The contention ceiling's load: every replica runs its forward pass again and again on its own
// cores, on a batch of its own (no ring), until stop() (or destruction), which waits for them.
// Their work counts as teacher work.
class BackgroundTeachers {
public:
  explicit BackgroundTeachers(CpuPipeline& pipeline) {
    const RunInputs& run = pipeline.run();
    std::vector<TeacherUnit*> units;
    for (std::size_t t = 0; t < pipeline.teachers(); ++t)
      for (std::size_t r = 0; r < pipeline.teacher(t).replicas(); ++r)
        units.push_back(&pipeline.teacher(t).unit(r));
    // A thread refused midway: those started are stopped and joined before the error goes on.
    try {
      start(pipeline, run, units);
    } catch (...) {
      stop();
      throw;
    }
    // Every replica is at work when the measured steps begin.
    for (std::size_t n = state_.started.load(); n < units.size(); n = state_.started.load())
      state_.started.wait(n);
  }
  ~BackgroundTeachers() { stop(); }
  BackgroundTeachers(const BackgroundTeachers&) = delete;
  BackgroundTeachers& operator=(const BackgroundTeachers&) = delete;

  void stop() {
    state_.stop.store(true);
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

private:
  void start(CpuPipeline& pipeline, const RunInputs& run, const std::vector<TeacherUnit*>& units) {
    threads_.reserve(units.size()); // a started thread is never dropped by a failed push_back
    for (TeacherUnit* u : units) {
      threads_.push_back(start_in_arena(u->arena(), [state = &state_, &pipeline, &run, u] {
        state->started.fetch_add(1);
        state->started.notify_all();
        // An unrelated batch: fixed values, the replica's own input and output buffers.
        const teacher::Teacher& model = *run.teachers[u->teacher()].model;
        const std::size_t in =
            static_cast<std::size_t>(model.batch()) *
            static_cast<std::size_t>(run.teachers[u->teacher()].input.to().numel());
        std::vector<float> inputs(in, 0.5f);
        teacher::OutputBuffers outputs(model);
        for (std::uint64_t n = 0; !state->stop.load(std::memory_order_relaxed); ++n) {
          const auto t0 = Clock::now();
          try {
            trace::Span span("teacher", n);
            u->forward(inputs.data(), outputs.pointers);
          } catch (...) {
            break; // the same replica fails in the measured modes, which report it
          }
          count_teacher_batch(pipeline, t0);
        }
      }));
    }
  }

  struct State {
    std::atomic<bool> stop{false};
    std::atomic<std::size_t> started{0};
  };
  State state_;                      // the threads read it until stop() has joined them
  std::vector<std::thread> threads_; // one per replica, inside its arena
};

// The benchmark's own producers, in place of the loader stage: what the modes that measure the
// stages after the loaders, or a hand-written loop, need. Their loading counts as loader work.
class BenchProducer {
public:
  BenchProducer(CpuPipeline& pipeline, const Sampler& sampler)
      : pipeline_(pipeline), sampler_(sampler) {}
  ~BenchProducer() {
    // Whatever way the repetition ends: the closed ring stops the replay, which is then waited for.
    pipeline_.ring().close();
    if (replay_) replay_->wait();
  }
  BenchProducer(const BenchProducer&) = delete;
  BenchProducer& operator=(const BenchProducer&) = delete;

  // A replay of the first lap: each slot is loaded once, then handed on again as it is. The
  // logits region gets fixed normal values unless the teacher runs (what a student step costs
  // does not depend on them).
  void start_replay(std::uint64_t batches, bool teacher) {
    SlotRing& ring = pipeline_.ring();
    const std::uint32_t slots = ring.slots();
    const SlotState after_load = pipeline_.after_load();
    replay_ = std::make_unique<StageGraph>(
        "replay", pipeline_.loader_arena(), 1, ring, RingStage::loader, batches,
        [this, &ring, slots, after_load, teacher](std::uint64_t b, int) {
          auto slot = ring.acquire_free(b);
          if (!slot) return false;
          if (b < slots) {
            trace::Span span("load", b);
            load(b, *slot);
            if (const auto& logits = pipeline_.regions().logits; logits && !teacher) {
              std::mt19937 rng(static_cast<std::uint32_t>(b));
              std::normal_distribution<float> normal(0.f, 2.f);
              for (float& v : slot->region<float>(*logits)) v = normal(rng);
            }
          }
          ring.publish(*slot, SlotState::filling, after_load);
          return true;
        },
        &totals_);
    replay_->start();
  }

  // One thread's loop: the calling thread loads batch `b` on the loader cores, then runs the
  // teacher on it on the first replica's cores, one after the other, and leaves it ready.
  void produce_serially(std::uint64_t b) {
    SlotRing& ring = pipeline_.ring();
    const bool teacher = pipeline_.run().teacher_runs();
    auto slot = ring.acquire_free(b);
    if (!slot) return;
    const auto t0 = Clock::now();
    run_in_arena(pipeline_.loader_arena(), [&] {
      trace::Span span("load", b);
      load(b, *slot);
    });
    totals_.busy_ns.fetch_add(static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()));
    ring.publish(*slot, SlotState::filling, teacher ? SlotState::filled : SlotState::ready);
    if (!teacher) return;
    slot = ring.acquire_filled(b);
    if (!slot) return;
    teach_now(pipeline_, *slot);
    ring.publish(*slot, SlotState::teaching, SlotState::ready);
  }

  [[nodiscard]] std::uint64_t busy_ns() const { return totals_.busy_ns.load(); }

private:
  void load(std::uint64_t b, const Slot& slot) {
    const RunInputs& run = pipeline_.run();
    fill_batch(run.train, sampler_, run.augment, b, slot, pipeline_.regions().loader, scratch_);
  }

  CpuPipeline& pipeline_;
  const Sampler& sampler_;
  LoaderScratch scratch_; // one producer thread at a time
  StageTotals totals_;
  std::unique_ptr<StageGraph> replay_;
};

StudentLogits student_logits(Mode mode) {
  switch (mode) {
  case Mode::teacher_alone:
  case Mode::loader_alone: return StudentLogits::none;
  case Mode::colocated:
  case Mode::loop: return StudentLogits::colocated;
  default: return StudentLogits::teacher;
  }
}

// Every CPU of the plan: the plain loop's share of the machine.
affinity::CpuList loop_cpus(const RunInputs& run) {
  affinity::CpuList cpus = run.plan.student;
  cpus.insert(cpus.end(), run.plan.loader.begin(), run.plan.loader.end());
  for (const auto& replica : run.plan.teacher)
    cpus.insert(cpus.end(), replica.begin(), replica.end());
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

// One repetition on the calling thread.
Rep run_rep_here(const Setup& setup, Mode mode);

} // namespace

Rep run_rep(const Setup& setup, Mode mode) {
  const RunInputs& run = setup.run;
  if (mode != Mode::loop || run.device.is_cuda()) return run_rep_here(setup, mode);
  // The loop's student on a thread of its own, bound to every CPU of the plan: LibTorch's intra-op
  // threads (OpenMP's team of the thread that starts a parallel region) are made by it, keep its
  // CPUs, and end with it, while the student's own thread and team keep the student's CPUs.
  Rep rep;
  std::exception_ptr error;
  std::thread loop([&] {
    try {
      affinity::pin_this_thread(run.topology, loop_cpus(run), "kd-student");
      rep = run_rep_here(setup, mode);
    } catch (...) {
      error = std::current_exception();
    }
  });
  loop.join();
  if (error) std::rethrow_exception(error);
  return rep;
}

namespace {

Rep run_rep_here(const Setup& setup, Mode mode) {
  const RunInputs& run = setup.run;
  student::TrainerOptions options = setup.options;
  if (mode == Mode::loop && !run.device.is_cuda())
    options.threads = static_cast<int>(loop_cpus(run).size());
  Assembled parts =
      assemble(run, setup.sampler, setup.slots, options, student_logits(mode), setup.colocated);
  Rep rep;
  if (parts.trainer && !run.device.is_cuda()) {
    // As they are on this thread now: the intra-op threads the trainer set, and this thread's
    // CPUs, which its intra-op threads inherit.
    rep.student_threads = student::intra_op_threads();
    rep.student_cpus = affinity::format_cpus(affinity::current_thread_cpus());
  }
  CpuPipeline& pipeline = *parts.pipeline;
  student::Trainer* trainer = parts.trainer.get();
  SlotRing& ring = pipeline.ring();
  BenchProducer producer(pipeline, setup.sampler);
  // The contention ceiling's replicas stop however the repetition ends (before the producer and
  // the pipeline go).
  std::optional<BackgroundTeachers> background;
  // Fast modes (a loader alone runs thousands of batches a second) continue past `steps` until the
  // window has lasted min_seconds; the ring is closed then, which stops the producers.
  const std::uint64_t total = setup.warmup + setup.steps * 1000;
  switch (mode) {
  case Mode::student_alone:
  case Mode::student_contended:
    pipeline.start(0, total, {.loaders = false, .teacher = false});
    producer.start_replay(total, false);
    if (mode == Mode::student_contended) background.emplace(pipeline);
    break;
  case Mode::teacher_alone:
    pipeline.start(0, total,
                   {.loaders = false, .teacher = true, .only_teacher = setup.only_teacher});
    producer.start_replay(total, true);
    break;
  case Mode::loader_alone:
  case Mode::colocated: pipeline.start(0, total, {.loaders = true, .teacher = false}); break;
  case Mode::loop:
    // A DataLoader's workers run anywhere: here on the teachers' CPUs too, which no teacher uses.
    pipeline.start(0, total, {.loaders = true, .teacher = false, .share_teacher_cpus = true});
    break;
  case Mode::overlapped: pipeline.start(0, total, {.loaders = true, .teacher = true}); break;
  case Mode::overlapped_cached:
    // As a run's epochs after the cache is full: the loaders take the teacher's CPUs too.
    pipeline.start(0, total,
                   {.loaders = true, .teacher = true, .cache = true, .share_teacher_cpus = true});
    break;
  case Mode::serial_cpu:
    // The loop below produces each batch itself; the stages do not run.
    pipeline.start(0, total, {.loaders = false, .teacher = false});
    break;
  }
  const auto loader_busy_ns = [&] {
    return pipeline.loader_totals().busy_ns.load() + producer.busy_ns();
  };

  // Several ranks end their window at one step: a rank that is done asks with its next step, and
  // every rank stops after the step any rank asked at (their all-reduces stay paired).
  const bool ranks = trainer != nullptr && setup.options.group != nullptr;
  bool done = false;
  RingStats before{};
  std::uint64_t loader_before = 0, teacher_before = 0;
  Clock::time_point t0{};
  for (std::uint64_t b = 0; b < total; ++b) {
    if (b == setup.warmup) {
      if (trainer) trainer->drain(); // the device's queue too: the window starts empty
      t0 = Clock::now();
      before = ring.stats();
      loader_before = loader_busy_ns();
      teacher_before = pipeline.teacher_totals().busy_ns.load();
    }
    if (mode == Mode::serial_cpu) producer.produce_serially(b);
    std::uint32_t samples = 0;
    bool last = false; // several ranks: a rank asked to stop at this step
    if (trainer) {
      const auto s0 = Clock::now();
      const auto stats = trainer->step(b, done);
      if (!stats) break;
      samples = stats->rank_samples; // this rank's (the job's rate is the ranks' sum)
      last = ranks && stats->stop;
      if (b >= setup.warmup)
        rep.student_busy_s += std::chrono::duration<double>(Clock::now() - s0).count();
    } else {
      trace::Span wait("wait", b);
      const auto slot = ring.acquire_ready(b);
      if (!slot) break;
      samples = slot->header().samples;
      ring.release(*slot);
    }
    if (b >= setup.warmup) {
      rep.samples += samples;
      ++rep.steps;
      rep.ring_ready += ring.stats().occupancy[static_cast<int>(SlotState::ready)];
      done = rep.steps >= setup.steps &&
             std::chrono::duration<double>(Clock::now() - t0).count() >= setup.min_seconds;
      if (done && !ranks) break;
    }
    if (last) break;
  }
  if (trainer) {
    trainer->drain();
    rep.device = trainer->device();
  }
  rep.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const RingStats after = ring.stats();
  const std::uint64_t loader_busy = loader_busy_ns() - loader_before;
  const std::uint64_t teacher_busy = pipeline.teacher_totals().busy_ns.load() - teacher_before;
  background.reset();
  pipeline.stop();
  ring.rethrow_if_failed();
  if (rep.steps < setup.steps)
    throw std::runtime_error(fmt::format("{}: the pipeline ended after {} of {} measured steps",
                                         mode_name(mode), rep.steps, setup.steps));
  const auto wait_ns = [&](RingStage s) {
    const auto i = static_cast<std::size_t>(s);
    return after.stages[i].wait_ns - before.stages[i].wait_ns;
  };
  rep.student_wait_s = static_cast<double>(wait_ns(RingStage::student)) / 1e9;
  rep.student_busy_s = std::max(0.0, rep.student_busy_s - rep.student_wait_s);
  rep.loader_wait_s = static_cast<double>(wait_ns(RingStage::loader)) / 1e9;
  rep.teacher_wait_s = static_cast<double>(wait_ns(RingStage::teacher)) / 1e9;
  rep.loader_work_s = stage_work_s(loader_busy, wait_ns(RingStage::loader));
  rep.teacher_work_s = stage_work_s(teacher_busy, wait_ns(RingStage::teacher));
  rep.ring_ready /= static_cast<double>(std::max<std::uint64_t>(1, rep.steps));
  return rep;
}

} // namespace

CacheFill fill_teacher_cache(const Setup& setup) {
  const RunInputs& run = setup.run;
  CacheFill fill;
  if (!run.cache) return fill;
  TeacherOutputCache& cache = *run.cache;
  const std::size_t before = cache.stored();
  const auto t0 = Clock::now();
  const std::uint64_t epoch = setup.sampler.batches_per_epoch();
  if (before < cache.samples()) {
    Assembled parts = assemble(run, setup.sampler, setup.slots, setup.options, StudentLogits::none);
    CpuPipeline& pipeline = *parts.pipeline;
    pipeline.start(0, epoch, {.loaders = true, .teacher = true, .cache = true});
    for (std::uint64_t b = 0; b < epoch; ++b) {
      const auto slot = pipeline.ring().acquire_ready(b);
      if (!slot) break;
      pipeline.ring().release(*slot);
    }
    pipeline.stop();
    pipeline.ring().rethrow_if_failed();
    fill.batches = epoch - pipeline.targets().cached_batches();
  }
  fill.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  fill.samples_added = cache.stored() - before;
  return fill;
}

} // namespace kdflow::app
