// The student's settings' names (settings.hpp).
#include "kdflow/gpu_student/settings.hpp"

#include "kdflow/core/error.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kdflow::student {

const std::vector<std::string>& device_names() {
  static const std::vector<std::string> names = {"auto", "cpu", "cuda"};
  return names;
}

const std::vector<std::string>& amp_names() {
  static const std::vector<std::string> names = {"auto", "off", "bf16", "fp16"};
  return names;
}

const std::vector<std::string>& backend_names() {
  static const std::vector<std::string> names = {"auto", "nccl", "gloo"};
  return names;
}

void check_name(const std::string& key, const std::string& value,
                const std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), value) != names.end()) return;
  const std::vector<std::string> head(names.begin(), names.end() - 1);
  throw InputError(
      fmt::format("{} = {}: not {} or {}", key, value, fmt::join(head, ", "), names.back()));
}

} // namespace kdflow::student
