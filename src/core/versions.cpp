// Versions of kdflow and of the oneTBB runtime loaded into this process.
#include "kdflow/core/versions.hpp"

#include "kdflow_build_info.hpp"

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

} // namespace kdflow
