// `kdflow bench-overlap`: the six modes of one distillation setup measured side by side in one run
// (student-alone, teacher-alone, loader-alone, serial-cpu, colocated, overlapped), with the
// pipeline's efficiency against the slowest stage alone and its speedup over the two baselines.
#pragma once

#include <string>
#include <vector>

namespace kdflow::app {

struct OverlapArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string cores;        // plan file (tune-cores)
  int steps = 50;           // measured steps per repetition
  int warmup = 0;           // steps before measuring; at least the ring's slot count
  int repeats = 3;          // repetitions per mode; the median is reported
  double min_seconds = 1.0; // each measured window lasts at least this long
  std::string json, trace, plot;
};

int bench_overlap_command(const OverlapArgs& args);

} // namespace kdflow::app
