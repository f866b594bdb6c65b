// Fuzz target: an ONNX model through kdflow's import, graph validation and passes, and the oneDNN
// execution plan at batch 2 (as `kdflow teacher info` and a training run load it).
#include "fuzz_files.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/cpu_teacher/engine.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kdflow::fuzz::write("model.onnx", data, size);
  kdflow::teacher::TeacherOptions options;
  options.batch = 2;
  options.tune = kdflow::teacher::Tune::off;
  try {
    const auto teacher = kdflow::teacher::Teacher::load(path, options);
  } catch (const kdflow::InputError&) {
  }
  return 0;
}
