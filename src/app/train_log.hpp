// What a training run records while its steps run (train.cpp): metrics.jsonl's line for each
// interval (train.log_every steps, an epoch's end, the last step), the log line, the terminal's
// live line and the epoch lines, from the trainer's step figures and the ring's and the teacher
// stages' counters.
#pragma once

#include "pipeline.hpp"
#include "progress.hpp"
#include "run_folder.hpp"
#include "run_report.hpp"

#include "kdflow/gpu_student/trainer.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

namespace kdflow::app {

class TrainLog {
public:
  // The run's extent: batches per epoch, epochs, its last batch (exclusive), ring slots, and how
  // many steps an interval has.
  struct Extent {
    std::uint64_t per_epoch = 1, epochs = 1, last = 0;
    std::uint32_t slots = 0;
    std::uint64_t log_every = 1;
  };
  // `folder`: rank 0's run folder; null on the other ranks (they write and show nothing).
  // `wall_s`: the run's time so far (earlier starts of a resumed run included), each line's.
  TrainLog(CpuPipeline& pipeline, student::Trainer& trainer, RunFolder* folder, Extent extent,
           std::function<double()> wall_s);

  // The steps start at batch `begin`: the first interval's clock and counters start now; the
  // rates count from `loop_start` (the step loop's, as summary.json's loop_s does).
  void start(std::uint64_t begin, std::chrono::steady_clock::time_point loop_start);
  // After batch b's step (`samples`: the job's so far): the interval, its line when due, the
  // live line.
  void step(std::uint64_t b, const student::StepStats& stats, std::uint64_t samples);
  // After the evaluation at the end of batch b's epoch.
  void epoch(std::uint64_t b, double test_accuracy, std::optional<double> teacher_accuracy);
  // An evaluation or a checkpoint just after an interval's start is left out of its samples/s.
  void restart_empty_interval();
  // The live line cleared.
  void finish() { progress_.finish(); }

  // The student's wait on the ring since start().
  [[nodiscard]] std::uint64_t student_wait_ns() const;
  // The teacher replicas' working time so far: their bodies' time less their waits on the ring
  // for a loaded slot (as bench-overlap and kd-ctl count it).
  [[nodiscard]] std::uint64_t teacher_work_ns() const;

private:
  using Clock = std::chrono::steady_clock;
  void write_interval(std::uint64_t b, const student::StepStats& last);
  [[nodiscard]] std::uint64_t ring_wait_ns() const;

  CpuPipeline& pipeline_;
  student::Trainer& trainer_;
  RunFolder* folder_;
  const Extent extent_;
  const std::function<double()> wall_s_;
  Progress progress_;
  std::uint64_t begin_ = 0, wait_before_ = 0;
  Clock::time_point started_{};
  double rate_ = 0; // the job's samples/s since start()
  MetricsInterval interval_;
  std::uint64_t interval_wait_ns_ = 0, interval_teacher_ns_ = 0; // at the interval's start
  bool pace_said_ = false; // the first interval's line on which stage sets the pace
};

} // namespace kdflow::app
