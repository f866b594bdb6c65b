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

} // namespace kdflow
