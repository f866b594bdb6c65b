// Exporting the trained student and checking the written file (export.hpp): ONNX through kdflow's
// own oneDNN engine (the round trip that makes a distilled student the next run's teacher),
// TorchScript through LibTorch's loader.
#include "export.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/cpu_teacher/engine.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace kdflow::app {

std::string export_format(const Config& config) {
  const std::string wanted = config.get_string("train.export");
  const bool script = config.get_string("student.arch") == "torchscript";
  if (wanted == "auto") return script ? "torchscript" : "onnx";
  if (wanted == "onnx" && script)
    throw InputError("train.export = onnx: a TorchScript student is exported as TorchScript "
                     "(train.export = torchscript; torch.onnx.export in Python converts it)");
  if (wanted == "torchscript" && !script)
    throw InputError(fmt::format("train.export = torchscript: the built-in student {} is "
                                 "exported as ONNX (train.export = onnx)",
                                 config.get_string("student.arch")));
  return wanted;
}

std::string export_file_name(const std::string& format) {
  return format == "onnx" ? "student.onnx" : "student.pt";
}

ExportCheck export_student(student::Trainer& trainer, const student::TrainerOptions& options,
                           const std::string& format, const std::filesystem::path& path,
                           std::span<const float> images) {
  trainer.export_student(path, format);
  const auto& spec = options.model;
  const auto sample = static_cast<std::size_t>(spec.channels * spec.height * spec.width_px);
  const std::size_t count = std::min<std::size_t>(256, images.size() / sample);
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

} // namespace kdflow::app
