// A teacher's int8 calibration and check as summary.json (teacher_int8) and `teacher bench --json`
// (int8) report them.
#pragma once

#include "kdflow/cpu_teacher/engine.hpp"

#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace kdflow::app {

// The calibration's and check's figures of teacher `t` (file `model`), with the check's warning
// (int8_check_warning) or null, and how many quantized products have weights of each magnitude
// (StepInfo::weight_levels and weight_pairs: {"127": n, "127 in pairs": m, "63": k}); null for a
// teacher that does not run in int8.
inline nlohmann::json int8_report(const teacher::Teacher& t, const std::string& model) {
  const auto check = t.int8_check();
  if (!check) return nullptr;
  const std::string warning = teacher::int8_check_warning(*check, model);
  std::map<std::string, int> levels;
  for (const auto& step : t.step_info())
    if (step.weight_levels > 0)
      ++levels[std::to_string(step.weight_levels) + (step.weight_pairs ? " in pairs" : "")];
  return {{"calibration_samples", t.calibration()->samples},
          {"weight_levels", levels},
          {"check_samples", check->samples},
          {"top1_agreement", check->top1},
          {"kl", check->kl},
          {"warning", warning.empty() ? nlohmann::json(nullptr) : nlohmann::json(warning)}};
}

} // namespace kdflow::app
