// Reads the API version of the hwloc library loaded at run time (not the header's); hwloc has no
// run-time call for its release number.
#include "kdflow/affinity/versions.hpp"

#include <fmt/format.h>
#include <hwloc.h>

namespace kdflow::affinity {

VersionLines affinity_versions() {
  const unsigned v = hwloc_get_api_version();
  return {{"hwloc", fmt::format("API {}.{}.{}", v >> 16, (v >> 8) & 0xff, v & 0xff)}};
}

} // namespace kdflow::affinity
