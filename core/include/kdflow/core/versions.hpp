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

// The CPU as far as it decides which kernels and blockings run fastest: the model name, the
// vendor, family, model and stepping (one model name covers several cores: AMD's "AMD EPYC" is a
// Zen 3, 4 or 5) and the per-core L2 size, e.g. "AMD EPYC | AuthenticAMD 26/2/1 | L2 2048 KiB".
// Tuned plans are keyed by it: choices timed on one core are not another's.
std::string cpu_identity();

} // namespace kdflow
