#include "kdflow/core/cache_home.hpp"

#include <cstdlib>

namespace kdflow {

std::filesystem::path cache_home() {
  const auto set = [](const char* name) -> const char* {
    const char* value = std::getenv(name);
    return value != nullptr && *value != 0 ? value : nullptr;
  };
  if (const char* d = set("KDFLOW_CACHE_DIR")) return d;
  if (const char* d = set("XDG_CACHE_HOME")) return std::filesystem::path(d) / "kdflow";
  if (const char* d = set("HOME")) return std::filesystem::path(d) / ".cache" / "kdflow";
  return {};
}

} // namespace kdflow
