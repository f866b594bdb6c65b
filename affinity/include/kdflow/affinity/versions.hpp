// hwloc as loaded at run time.
#pragma once

#include "kdflow/core/versions.hpp"

namespace kdflow::affinity {

VersionLines affinity_versions();

} // namespace kdflow::affinity
