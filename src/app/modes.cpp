#include "modes.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/trace.hpp"
#include "kdflow/gpu_student/pinned_host.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include <fmt/format.h>

namespace kdflow::app {

using Clock = std::chrono::steady_clock;

const char* mode_name(Mode m) {
  switch (m) {
  case Mode::student_alone: return "student-alone";
  case Mode::teacher_alone: return "teacher-alone";
  case Mode::loader_alone: return "loader-alone";
  case Mode::serial_cpu: return "serial-cpu";
  case Mode::colocated: return "colocated";
  case Mode::overlapped: return "overlapped";
  }
  return "?";
}

bool student_runs(Mode m) { return m != Mode::teacher_alone && m != Mode::loader_alone; }

Rep run_rep(const Setup& setup, Mode mode) {
  const RunInputs& run = setup.run;
  const SlotLayout layout = CpuPipeline::layout_for(run);
  CpuPipeline pipeline(run, setup.sampler, setup.slots,
                       student::allocate_pinned_for_device(
                           setup.slots * layout.slot_bytes(),
                           affinity::bind_to_numa_of(run.topology, run.plan.student)));
  SlotRing& ring = pipeline.ring();
  std::unique_ptr<student::Trainer> trainer;
  if (student_runs(mode)) {
    student::StepRegions regions{pipeline.regions().loader.inputs, pipeline.regions().loader.labels,
                                 pipeline.regions().logits};
    if (mode == Mode::colocated) regions.teacher_logits.reset();
    trainer = std::make_unique<student::Trainer>(setup.options, ring, regions);
    if (mode == Mode::colocated) trainer->set_colocated_teacher(setup.colocated);
  }
  // Fast modes (a loader alone runs thousands of batches a second) continue past `steps` until the
  // window has lasted min_seconds; the ring is closed then, which stops the producers.
  const std::uint64_t total = setup.warmup + setup.steps * 1000;
  using Source = CpuPipeline::Source;
  switch (mode) {
  case Mode::student_alone: pipeline.start(0, total, {Source::replay, false}); break;
  case Mode::teacher_alone: pipeline.start(0, total, {Source::replay, true}); break;
  case Mode::loader_alone:
  case Mode::colocated: pipeline.start(0, total, {Source::loaders, false}); break;
  case Mode::overlapped: pipeline.start(0, total, {Source::loaders, true}); break;
  case Mode::serial_cpu: break; // the loop below produces each batch itself
  }

  Rep rep;
  RingStats before{};
  std::uint64_t loader_before = 0, teacher_before = 0;
  Clock::time_point t0{};
  for (std::uint64_t b = 0; b < total; ++b) {
    if (b == setup.warmup) {
      if (trainer) trainer->drain(); // the device's queue too: the window starts empty
      t0 = Clock::now();
      before = ring.stats();
      loader_before = pipeline.loader_busy_ns();
      teacher_before = pipeline.teacher_busy_ns();
    }
    if (mode == Mode::serial_cpu) pipeline.produce_serially(b);
    std::uint32_t samples = 0;
    if (trainer) {
      const auto s0 = Clock::now();
      const auto stats = trainer->step(b);
      if (!stats) break;
      samples = stats->samples;
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
      if (rep.steps >= setup.steps &&
          std::chrono::duration<double>(Clock::now() - t0).count() >= setup.min_seconds)
        break;
    }
  }
  if (trainer) {
    trainer->drain();
    rep.device = trainer->device();
  }
  rep.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const RingStats after = ring.stats();
  const std::uint64_t loader_busy = pipeline.loader_busy_ns() - loader_before;
  const std::uint64_t teacher_busy = pipeline.teacher_busy_ns() - teacher_before;
  pipeline.stop();
  ring.rethrow_if_failed();
  if (rep.steps < setup.steps)
    throw std::runtime_error(fmt::format("{}: the pipeline ended after {} of {} measured steps",
                                         mode_name(mode), rep.steps, setup.steps));
  const auto waited = [&](RingStage s) {
    const auto i = static_cast<std::size_t>(s);
    return static_cast<double>(after.stages[i].wait_ns - before.stages[i].wait_ns) / 1e9;
  };
  rep.student_wait_s = waited(RingStage::student);
  rep.student_busy_s = std::max(0.0, rep.student_busy_s - rep.student_wait_s);
  rep.loader_wait_s = waited(RingStage::loader);
  rep.teacher_wait_s = waited(RingStage::teacher);
  rep.loader_work_s = std::max(0.0, static_cast<double>(loader_busy) / 1e9 - rep.loader_wait_s);
  rep.teacher_work_s = std::max(0.0, static_cast<double>(teacher_busy) / 1e9 - rep.teacher_wait_s);
  rep.ring_ready /= static_cast<double>(std::max<std::uint64_t>(1, rep.steps));
  return rep;
}

} // namespace kdflow::app
