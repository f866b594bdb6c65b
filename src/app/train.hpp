// `kdflow train`: loaders -> teacher replicas -> ring -> student, with the run folder described in
// docs/DESIGN.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace kdflow::app {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string out = "runs/latest";
  std::string resume; // "", "auto" or a checkpoint path
  std::string cores;  // plan file (overrides cores.plan)
  // Each metrics.jsonl line as it is written, as JSON text (rank 0; kdflow's Python train()'s
  // callback). Called on the student's thread, or kd-ctl's.
  std::function<void(const std::string&)> on_metrics;
};

int train_command(const TrainArgs& args);

} // namespace kdflow::app
