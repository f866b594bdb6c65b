// `kdflow tune-cores`: profiles each stage alone on candidate core counts, predicts every valid
// plan's throughput as its slowest stage's rate, verifies the best predictions with short real
// pipeline runs, and writes the winner as a plan file `train --cores` and `bench-overlap --cores`
// read. --exhaustive also runs every valid plan, for the quality comparison.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace kdflow::app {

struct TuneArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string out;
  double budget_s = 120;   // the tuning's own time (an exhaustive comparison comes on top)
  int verify = 2;          // predictions verified with real runs
  bool exhaustive = false; // also measure every valid plan, and compare
};

int tune_cores_command(const TuneArgs& args);

// How many of a teacher's `replicas` to keep: halved while `rate_of(kept)` (the stage measured on
// that many) still reaches `target` samples/s; at least one.
std::size_t fewest_replicas(std::size_t replicas, double target,
                            const std::function<double(std::size_t)>& rate_of);

} // namespace kdflow::app
