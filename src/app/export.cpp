// Exporting the trained student and checking the written file (export.hpp): ONNX through kdflow's
// own oneDNN engine (the round trip that makes a distilled student the next run's teacher),
// TorchScript through LibTorch's loader.
#include "export.hpp"

#include "run.hpp"
#include "run_folder.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"
#include "kdflow/core/loader.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/cpu_teacher/engine.hpp"
#include "kdflow/gpu_student/pinned_host.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {

std::string export_format(const Config& config, const std::string& wanted, const std::string& key) {
  const bool script = config.get_string("student.arch") == "torchscript";
  if (wanted == "auto") return script ? "torchscript" : "onnx";
  if (wanted == "onnx" && script)
    throw InputError(fmt::format("{} = onnx: a TorchScript student is exported as TorchScript "
                                 "({} = torchscript; torch.onnx.export in Python converts it)",
                                 key, key));
  if (wanted == "torchscript" && !script)
    throw InputError(fmt::format("{} = torchscript: the built-in student {} is exported as ONNX "
                                 "({} = onnx)",
                                 key, config.get_string("student.arch"), key));
  return wanted;
}

ExportCheck export_student(student::Trainer& trainer, const student::TrainerOptions& options,
                           const std::string& format, const std::filesystem::path& path,
                           std::span<const float> images) {
  trainer.export_student(path, format);
  const auto& spec = options.model;
  const auto sample = static_cast<std::size_t>(spec.channels * spec.height * spec.width_px);
  const std::size_t count = std::min(kExportCheckSamples, images.size() / sample);
  const std::span<const float> batch = images.first(count * sample);
  const std::vector<float> want = trainer.predict(batch);
  ExportCheck check;
  check.samples = count;
  std::vector<float> got(want.size());
  if (format == "onnx") {
    check.runner = "kdflow's oneDNN engine (the teacher's)";
    teacher::TeacherOptions to;
    to.batch = static_cast<std::int64_t>(count);
    teacher::Replica replica(teacher::Teacher::load(path.string(), to));
    float* outputs[] = {got.data()};
    replica.run(batch.data(), outputs);
  } else {
    check.runner = "LibTorch's torch::jit::load";
    got = student::run_torchscript(path.string(), batch, spec, options.device);
  }
  if (got.size() != want.size())
    throw std::runtime_error(fmt::format("{}: the exported student gives {} values for {} images, "
                                         "the student {}",
                                         path.string(), got.size(), count, want.size()));
  double worst = 0, scale = 1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  const auto classes = static_cast<std::size_t>(spec.classes);
  std::size_t agree = 0;
  for (std::size_t r = 0; r < count; ++r) {
    const auto row = static_cast<std::ptrdiff_t>(r * classes);
    const auto end = row + static_cast<std::ptrdiff_t>(classes);
    agree += std::max_element(got.begin() + row, got.begin() + end) - got.begin() ==
             std::max_element(want.begin() + row, want.begin() + end) - want.begin();
  }
  check.max_normalized_error = worst / scale;
  check.top1_agreement = count > 0 ? static_cast<double>(agree) / static_cast<double>(count) : 0;
  check.ok = check.max_normalized_error <= 1e-3 && check.top1_agreement >= 0.99;
  return check;
}

ExportCheck export_run_student(student::Trainer& trainer, const student::TrainerOptions& options,
                               const std::string& format, const std::filesystem::path& path,
                               const RunInputs& run) {
  AugmentConfig eval = run.augment;
  eval.augment = false;
  const std::size_t n = std::min(kExportCheckSamples, run.test.size());
  const ExportCheck check =
      export_student(trainer, options, format, path, normalized_images(run.test, eval, 0, n));
  log_info(fmt::format("student exported: {} ({}), checked on {} test images with {}: max "
                       "normalized error {:.2e}, top-1 agreement {:.4f}",
                       path.string(), format, check.samples, check.runner,
                       check.max_normalized_error, check.top1_agreement));
  return check;
}

nlohmann::json to_json(const ExportCheck& check) {
  return {{"runner", check.runner},
          {"samples", check.samples},
          {"max_normalized_error", check.max_normalized_error},
          {"top1_agreement", check.top1_agreement},
          {"ok", check.ok}};
}

namespace {

// --out: never a file of a run folder (a checkpoint, its config, metrics or summary: the run could
// no longer resume), never a folder, an existing file only with --force.
void check_export_target(const RunFolder& folder, const std::filesystem::path& out, bool force) {
  check_output_path(out, "--out");
  std::error_code ec;
  const auto status = std::filesystem::symlink_status(out, ec);
  const bool exists = !ec && std::filesystem::exists(status);
  if (folder.owns(out) || RunFolder::owned_by_a_run(out))
    throw InputError(fmt::format("--out {}: a file of a run folder (a checkpoint, config.toml, "
                                 "metrics.jsonl or summary.json); choose another file",
                                 out.string()));
  if (exists && std::filesystem::is_directory(out, ec))
    throw InputError(fmt::format("--out {}: a folder, not a file", out.string()));
  if (exists && !force)
    throw InputError(fmt::format("--out {}: exists (add --force to replace it)", out.string()));
}

} // namespace

int export_command(const ExportArgs& args) {
  const RunFolder folder = RunFolder::existing(args.run, "--run");
  if (args.out.empty()) throw InputError("--out: the file to write is required");
  check_export_target(folder, args.out, args.force);
  // The run's student and data. Its teachers are not needed to export the student, unless the
  // checkpoints hold kd.features adapters: their shapes are the teachers' values'.
  const Config config = resolve_config(folder.config_file().string(), {});
  RunRequest request;
  if (config.get_tables("kd.features").empty()) request.teachers.emplace();
  const RunInputs run = prepare_run(config, {}, request);
  const std::string format = export_format(run.config, args.format, "--format");
  if (format == "off") throw InputError("--format off: nothing to export");
  const std::filesystem::path checkpoint = folder.checkpoint(args.step);
  const student::TrainerOptions options = trainer_options(run, 1);
  // The trainer reads no batch here: the smallest ring of the run's layout is all it needs.
  const SlotLayout layout = loader_layout(run.train, run.sampler.batch_size, true);
  SlotRing ring(layout, 2, student::allocate_pinned_for_device(2 * layout.slot_bytes()));
  student::Trainer trainer(options, ring, {0, 1, std::nullopt});
  trainer.load(checkpoint);
  AugmentConfig eval = run.augment;
  eval.augment = false;
  const std::vector<float> images =
      normalized_images(run.test, eval, 0, std::min(kExportCheckSamples, run.test.size()));
  const ExportCheck check = export_student(trainer, options, format, args.out, images);
  fmt::print("{}\n", nlohmann::json{{"checkpoint", checkpoint.string()},
                                    {"file", args.out},
                                    {"format", format},
                                    {"check", to_json(check)}}
                         .dump());
  return check.ok ? kExitOk : 1;
}

} // namespace kdflow::app
