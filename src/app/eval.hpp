// `kdflow eval --model F.onnx|F.pt`: a model's accuracy on the data's test split and its speed,
// ONNX through kdflow's oneDNN engine (with the teacher's input settings), TorchScript through
// LibTorch on the student's device.
#pragma once

#include <string>
#include <vector>

namespace kdflow::app {

struct EvalArgs {
  std::string model, config, json;
  std::vector<std::string> sets;
};

int eval_command(const EvalArgs& args);

} // namespace kdflow::app
