// The training run's record while its steps run (train_log.hpp).
#include "train_log.hpp"

#include "kdflow/core/log.hpp"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {

using nlohmann::json;

TrainLog::TrainLog(CpuPipeline& pipeline, student::Trainer& trainer, RunFolder* folder,
                   Extent extent, std::function<double()> wall_s)
    : pipeline_(pipeline), trainer_(trainer), folder_(folder), extent_(extent),
      wall_s_(std::move(wall_s)), progress_(folder != nullptr && ::isatty(STDERR_FILENO) == 1) {}

std::uint64_t TrainLog::ring_wait_ns() const {
  return pipeline_.ring().stats().stages[static_cast<int>(RingStage::student)].wait_ns;
}

std::uint64_t TrainLog::student_wait_ns() const { return ring_wait_ns() - wait_before_; }

std::uint64_t TrainLog::teacher_work_ns() const {
  const std::uint64_t busy = pipeline_.teacher_totals().busy_ns.load();
  const std::uint64_t wait =
      pipeline_.ring().stats().stages[static_cast<int>(RingStage::teacher)].wait_ns;
  return busy > wait ? busy - wait : 0;
}

void TrainLog::start(std::uint64_t begin, Clock::time_point loop_start) {
  begin_ = begin;
  started_ = loop_start;
  wait_before_ = ring_wait_ns();
  interval_wait_ns_ = wait_before_;
  interval_teacher_ns_ = teacher_work_ns();
  interval_ = MetricsInterval{};
}

void TrainLog::step(std::uint64_t b, const student::StepStats& stats, std::uint64_t samples) {
  interval_.add(stats);
  const double elapsed = std::chrono::duration<double>(Clock::now() - started_).count();
  rate_ = static_cast<double>(samples) / std::max(1e-9, elapsed);
  const std::uint64_t per_epoch = extent_.per_epoch, last = extent_.last;
  if ((b + 1) % extent_.log_every == 0 || (b + 1) % per_epoch == 0 || b + 1 == last)
    write_interval(b, stats);
  if (progress_.due())
    progress_.show(fmt::format(
        "epoch {}/{} step {}/{} loss {:.4f} acc {:.1f}% {:.0f} samples/s ETA {} ring {}/{}",
        b / per_epoch + 1, extent_.epochs, b + 1, last, stats.loss,
        100.0 * static_cast<double>(stats.correct) / std::max<std::uint32_t>(1, stats.samples),
        rate_,
        clock_text(static_cast<double>(last - b - 1) *
                   (elapsed / static_cast<double>(b + 1 - begin_))),
        pipeline_.ring().stats().occupancy[static_cast<int>(SlotState::ready)], extent_.slots));
}

void TrainLog::epoch(std::uint64_t b, double test_accuracy,
                     std::optional<double> teacher_accuracy) {
  if (folder_ == nullptr) return;
  progress_.line(fmt::format("epoch {}/{}: test accuracy {:.4f}{} ({:.0f} samples/s)",
                             b / extent_.per_epoch + 1, extent_.epochs, test_accuracy,
                             teacher_accuracy ? fmt::format(" (teacher {:.4f})", *teacher_accuracy)
                                              : std::string(),
                             rate_));
}

void TrainLog::restart_empty_interval() {
  if (interval_.steps == 0) interval_.start = Clock::now();
}

void TrainLog::write_interval(std::uint64_t b, const student::StepStats& last) {
  const RingStats ring = pipeline_.ring().stats();
  const std::uint64_t wait_ns = ring.stages[static_cast<int>(RingStage::student)].wait_ns;
  const std::uint64_t teacher_ns = teacher_work_ns();
  const double span = interval_.seconds();
  const double replicas = static_cast<double>(std::max<std::size_t>(1, pipeline_.replicas()));
  const bool teacher_runs = pipeline_.run().teacher_runs();
  json line = interval_.line();
  line["step"] = trainer_.steps_done();
  line["epoch"] = b / extent_.per_epoch;
  line["lr"] = last.lr;
  line["wall_s"] = wall_s_();
  line["interval_s"] = span;
  line["student_wait_ms"] = static_cast<double>(wait_ns - interval_wait_ns_) / 1e6;
  // Work is busy time less waits, and a wait is counted before its body's busy time: the
  // difference may dip between two readings.
  const std::uint64_t work =
      teacher_ns > interval_teacher_ns_ ? teacher_ns - interval_teacher_ns_ : 0;
  line["teacher_busy"] = teacher_runs ? static_cast<double>(work) / (span * 1e9 * replicas) : 0.0;
  line["ring_ready"] = ring.occupancy[static_cast<int>(SlotState::ready)];
  line["skipped_steps"] = trainer_.skipped_steps();
  // Teacher batches read from kd.cache so far (null without a cache).
  TeacherTargets& targets = pipeline_.targets();
  line["teacher_cached_batches"] = targets.cache() ? json(targets.cached_batches()) : json(nullptr);
  if (folder_ != nullptr && teacher_runs && !pace_said_) {
    // After the first interval's few timed batches: which stage sets the pace, from the teacher's
    // share of busy time and the student's share of waiting (each stage's rate at full use).
    pace_said_ = true;
    const double rate = line["samples_per_s"].get<double>();
    const double busy = line["teacher_busy"].get<double>();
    const double waited = std::clamp(line["student_wait_ms"].get<double>() / (span * 1e3), 0., 1.);
    const std::string rates = fmt::format(
        "first {} steps: {:.0f} samples/s; the teacher's {} replica(s) busy {:.0f}% (~{:.0f} "
        "samples/s at full use), the student waiting {:.0f}% (~{:.0f} samples/s never waiting)",
        trainer_.steps_done(), rate, pipeline_.replicas(), 100 * busy, busy > 0 ? rate / busy : 0.0,
        100 * waited, waited < 1 ? rate / (1 - waited) : 0.0);
    if (waited > 0.2 && busy > 0.8)
      log_warn(rates + ": the teacher is the slower stage. Levers: teacher.precision = bf16 where "
                       "the CPU has it or int8 (AVX2 or later), kd.cache (the teacher's "
                       "outputs of earlier epochs; "
                       "kd.cache_augmented = true under random views), a "
                       "lighter or single teacher, or more teacher CPUs (kdflow tune-cores)");
    else
      log_info(rates + (waited <= 0.2 ? ": the student sets the pace (the teacher keeps up)"
                                      : ": the loader or the ring sets the pace"));
  }
  if (folder_ != nullptr) {
    folder_->write_metrics(line);
    if (!progress_.terminal())
      log_info(fmt::format("step {}/{} epoch {} loss {:.4f} lr {:.4f} {:.0f} samples/s",
                           trainer_.steps_done(), extent_.last, b / extent_.per_epoch + 1,
                           line["loss"].get<double>(), last.lr,
                           line["samples_per_s"].get<double>()));
  }
  interval_wait_ns_ = wait_ns;
  interval_teacher_ns_ = teacher_ns;
  interval_ = MetricsInterval{};
}

} // namespace kdflow::app
