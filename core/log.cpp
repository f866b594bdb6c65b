// The one place that talks to spdlog.
#include "kdflow/core/log.hpp"

#include <spdlog/spdlog.h>

namespace kdflow {

void log_info(const std::string& message) { spdlog::info("{}", message); }
void log_warn(const std::string& message) { spdlog::warn("{}", message); }

} // namespace kdflow
