// Fuzz target: a core-plan JSON file (`kdflow tune-cores`' output, `--cores`), read and then
// validated against a synthetic machine of 2 packages x 4 cores x 2 PUs.
#include "fuzz_files.hpp"

#include "kdflow/affinity/plan.hpp"
#include "kdflow/affinity/topology.hpp"
#include "kdflow/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto topology = kdflow::affinity::Topology::synthetic("pack:2 core:4 pu:2");
  const std::string path = kdflow::fuzz::write("plan.json", data, size);
  try {
    auto file = kdflow::affinity::read_plan_file(path);
    kdflow::affinity::validate(file.plan, topology, true);
  } catch (const kdflow::InputError&) {
  }
  return 0;
}
