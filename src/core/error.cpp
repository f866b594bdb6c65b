// Shared error helpers: every errno goes through one place that adds what was done and where.
#include "kdflow/core/error.hpp"

#include <filesystem>
#include <system_error>

namespace kdflow {

void throw_errno(int err, const std::string& doing, std::source_location where) {
  const std::string file = std::filesystem::path(where.file_name()).filename().string();
  throw std::system_error(err, std::generic_category(),
                          doing + " (" + file + ":" + std::to_string(where.line()) + ")");
}

} // namespace kdflow
