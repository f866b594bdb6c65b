// Every module's version lines: kdflow --version and the benchmarks' JSON.
#pragma once

#include "kdflow/core/versions.hpp"

namespace kdflow::app {

VersionLines all_versions();

} // namespace kdflow::app
