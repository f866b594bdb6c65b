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
  // Each input's run stays short under the sanitizers: a mutated doubling bomb just under the
  // default bounds would still expand to a million nodes. The bounds' checks are the same code.
  options.limits.max_nodes = std::size_t{1} << 14;
  options.limits.max_function_bytes = std::size_t{16} << 20;
  try {
    const auto teacher = kdflow::teacher::Teacher::load(path, options);
  } catch (const kdflow::InputError&) {
  }
  return 0;
}
