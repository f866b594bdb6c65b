// `kdflow cores [--synthetic DESC [--gpu-numa N,...]] [--local-world-size N] [--json]`: the
// topology and the core plan of the configuration (cores.*, kd.alpha, the teachers' costs).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kdflow::app {

struct CoresArgs {
  std::string synthetic;
  bool json = false;
  std::string gpu_numa; // with synthetic: NUMA node of each GPU, "0" or "0,0,1,1"
  int local_world = 1;  // torchrun's ranks on the node: each one's share and plan
  std::string config;
  std::vector<std::string> sets;
  // Where the output goes (stdout when unset; kdflow's Python cores() takes the JSON).
  std::function<void(const std::string&)> print;
};

int cores_command(const CoresArgs& args);

} // namespace kdflow::app
