// Shared error helpers: every errno goes through one place that adds what was done and where.
#include "kdflow/core/error.hpp"

#include <filesystem>
#include <system_error>

namespace kdflow {

void throw_errno(int err, const std::string& doing, const char* file, int line) {
  throw std::system_error(err, std::generic_category(),
                          doing + " (" + std::filesystem::path(file).filename().string() + ":" +
                              std::to_string(line) + ")");
}

} // namespace kdflow
