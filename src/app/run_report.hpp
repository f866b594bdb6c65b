// A training run's figures, each derived once from what its step loop measured: summary.json's
// rates and shares, each rank's line in it, and metrics.jsonl's interval lines read them from here.
#pragma once

#include "run_inputs.hpp"
#include "run_state.hpp"

#include "kdflow/affinity/plan.hpp"
#include "kdflow/core/dist_env.hpp"
#include "kdflow/core/slot_ring.hpp"
#include "kdflow/gpu_student/process_group.hpp"
#include "kdflow/gpu_student/trainer.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace kdflow::app {

// What one rank's step loop measured.
struct RunMeasures {
  double loop_s = 0;              // the loop, its evaluations and checkpoint writes included
  double eval_s = 0, save_s = 0;  // evaluations; checkpoint and cache writes
  std::uint64_t samples = 0;      // trained by the job
  std::uint64_t rank_samples = 0; // trained by this rank
  std::uint64_t stall_ns = 0;     // the student's waits for a ready slot
  std::uint64_t teacher_work_ns =
      0;                    // the replicas' working time (their waits on the ring left out)
  std::size_t replicas = 0; // teacher replicas (0: no teacher ran)
};

struct RunFigures {
  double steps_s = 0;               // the steps' own time: the loop's less evaluations and writes
  double samples_per_s = 0;         // the job's training throughput over steps_s
  double rank_samples_per_s = 0;    // this rank's
  double stall_fraction = 0;        // the student's waits, a share of steps_s
  double teacher_busy_fraction = 0; // each replica's working share of the loop (0 without one)
};

inline RunFigures figures_of(const RunMeasures& m) {
  RunFigures f;
  f.steps_s = m.loop_s - m.eval_s - m.save_s;
  if (f.steps_s < 1e-9) f.steps_s = 1e-9;
  f.samples_per_s = static_cast<double>(m.samples) / f.steps_s;
  f.rank_samples_per_s = static_cast<double>(m.rank_samples) / f.steps_s;
  f.stall_fraction = static_cast<double>(m.stall_ns) / (f.steps_s * 1e9);
  if (m.replicas > 0 && m.loop_s > 0)
    f.teacher_busy_fraction =
        static_cast<double>(m.teacher_work_ns) / (m.loop_s * 1e9 * static_cast<double>(m.replicas));
  return f;
}

// A rank's own figures in summary.json's `ranks`.
nlohmann::json rank_line(const DistEnv& dist, const std::string& device, const RunFigures& figures,
                         const affinity::Plan& plan, const std::string& state_digest);

// Every rank's line (each rank's `mine`, in rank order); one process: its own alone.
nlohmann::json all_ranks(student::ProcessGroup* group, const nlohmann::json& mine);

// What summary.json says beside the figures: the run's state and measures, the student, the ring,
// the job, and what the run's other parts report of themselves.
struct SummaryParts {
  const RunState& state;
  const RunMeasures& measured;
  const student::Trainer& trainer;
  const student::TrainerOptions& options;
  const RunInputs& run;
  const SlotRing& ring;
  std::uint32_t slots;
  std::uint64_t per_epoch;
  double wall_s;
  bool interrupted;
  const student::ProcessGroup* group; // null for one process
  nlohmann::json exported, cache, elastic, ranks;
  std::string state_digest;
};
nlohmann::json run_summary(const SummaryParts& parts);

// One metrics.jsonl interval: the steps' losses and hits since the last line, weighted by their
// samples.
struct MetricsInterval {
  double loss = 0, kd = 0, ce = 0, feature = 0;
  std::int64_t correct = 0, samples = 0, steps = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  void add(const student::StepStats& step);
  [[nodiscard]] double seconds() const; // since `start`
  // The interval's means: loss, kd_loss, ce_loss, feature_loss (kd.features' weighted sum, 0
  // without), train_accuracy and samples_per_s.
  [[nodiscard]] nlohmann::json line() const;
};

} // namespace kdflow::app
