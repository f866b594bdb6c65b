// Version lines for `kdflow --version`: each module reports what its library says at run time.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kdflow {

// (component, description) pairs, printed one per line.
using VersionLines = std::vector<std::pair<std::string, std::string>>;

// kdflow itself and oneTBB (the runtime library actually loaded, not the headers).
VersionLines core_versions();

// The CPU as the kernel names it ("model name" in /proc/cpuinfo), or "unknown CPU".
std::string cpu_model_name();

} // namespace kdflow
