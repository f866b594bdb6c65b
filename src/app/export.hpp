// The trained student out of a run: written in the format people deploy (ONNX for the built-in
// students, TorchScript for a TorchScript student) and checked, not trusted: the written file is
// run again on test images and compared with the student's own logits.
#pragma once

#include "run_inputs.hpp"

#include "kdflow/core/config.hpp"
#include "kdflow/gpu_student/trainer.hpp"

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace kdflow::app {

// `wanted` (train.export's vocabulary, from `key`) resolved for the configured student: "onnx",
// "torchscript" or "off" (auto: the student's own form). InputError naming the key for a format
// the student has no form in.
std::string export_format(const Config& config, const std::string& wanted, const std::string& key);

struct ExportCheck {
  std::string runner;              // what ran the written file
  std::size_t samples = 0;         // test images compared
  double max_normalized_error = 0; // max |exported - student| / max(1, max |student|)
  double top1_agreement = 0;       // share of images whose top-1 class agrees
  bool ok = false;                 // error <= 1e-3 and agreement >= 99%
};

// The check as summary.json and `kdflow export` write it.
nlohmann::json to_json(const ExportCheck& check);

// How many images an export is checked on, at most.
inline constexpr std::size_t kExportCheckSamples = 256;

// Writes the student to `path` (atomically) and checks it on `images` (float32 [count, C, H, W],
// normalized as the data; at most the first kExportCheckSamples are used).
ExportCheck export_student(student::Trainer& trainer, const student::TrainerOptions& options,
                           const std::string& format, const std::filesystem::path& path,
                           std::span<const float> images);

// A run's trained student written to `path` and checked on the first test images of `run`'s data
// (as evaluation sees them); logs the check.
ExportCheck export_run_student(student::Trainer& trainer, const student::TrainerOptions& options,
                               const std::string& format, const std::filesystem::path& path,
                               const RunInputs& run);

// `kdflow export --run DIR [--step N] [--format F] --out FILE`: a run's checkpoint (the latest,
// or step N's) exported and checked as the run's end does; one JSON line on stdout.
struct ExportArgs {
  std::string run, out, format = "auto";
  std::int64_t step = -1; // -1 (not given): the latest checkpoint
  bool force = false;     // replace --out if it exists
};
int export_command(const ExportArgs& args);

} // namespace kdflow::app
