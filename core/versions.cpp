// Versions of kdflow and of the oneTBB runtime loaded into this process, and the CPU's name.
#include "kdflow/core/versions.hpp"

#include "kdflow_build_info.hpp"

#include <filesystem>
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

namespace {

// The first "key : value" line of /proc/cpuinfo with this key, "" if none.
std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto name = line.substr(0, colon);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.pop_back();
    if (name == key) return colon + 2 <= line.size() ? line.substr(colon + 2) : std::string();
  }
  return {};
}

// CPU 0's level-2 cache size as sysfs says it ("2048K"), "" where sysfs has none.
std::string l2_size() {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/sys/devices/system/cpu/cpu0/cache", ec)) {
    std::ifstream level(entry.path() / "level");
    std::ifstream size(entry.path() / "size");
    std::string l, s;
    if (level >> l && l == "2" && size >> s) return s;
  }
  return {};
}

} // namespace

std::string cpu_model_name() {
  const std::string name = cpuinfo_field("model name");
  return name.empty() ? "unknown CPU" : name;
}

std::string cpu_identity() {
  std::string l2 = l2_size();
  if (!l2.empty() && l2.back() == 'K') l2 = l2.substr(0, l2.size() - 1) + " KiB";
  return fmt::format("{} | {} {}/{}/{} | L2 {}", cpu_model_name(), cpuinfo_field("vendor_id"),
                     cpuinfo_field("cpu family"), cpuinfo_field("model"), cpuinfo_field("stepping"),
                     l2.empty() ? "unknown" : l2);
}

} // namespace kdflow
