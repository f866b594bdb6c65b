// Versions of kdflow and of the oneTBB runtime loaded into this process, and the CPU's name.
#include "kdflow/core/versions.hpp"

#include "kdflow_build_info.hpp"

#include <fstream>

#include <fmt/format.h>
#include <oneapi/tbb/version.h>

namespace kdflow {

VersionLines core_versions() {
  return {
      {"kdflow", fmt::format("{} ({} build)", kKdflowVersion, kKdflowBuildType)},
      {"oneTBB",
       fmt::format("{} (interface {})", TBB_runtime_version(), TBB_runtime_interface_version())},
  };
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("model name")) {
      const auto colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  return "unknown CPU";
}

} // namespace kdflow
