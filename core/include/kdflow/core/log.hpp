// kdflow's log, behind plain functions so that modules compiled against another fmt (the student
// sees torch's bundled fmt) never include spdlog's headers. Never called per sample.
#pragma once

#include <string>

namespace kdflow {

void log_info(const std::string& message);
void log_warn(const std::string& message);

} // namespace kdflow
