// `kdflow train`: loaders -> teacher replicas -> ring -> student, with the run folder described in
// docs/DESIGN.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace kdflow::app {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string out = "runs/latest";
  std::string resume; // "", "auto" or a checkpoint path
  std::string cores;  // plan file (overrides cores.plan)
};

int train_command(const TrainArgs& args);

// A run folder's checkpoint of `step`, and the finished checkpoints in `folder`, oldest first
// (temporaries of a killed writer are skipped).
std::filesystem::path checkpoint_name(const std::filesystem::path& folder, std::int64_t step);
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& folder);

} // namespace kdflow::app
