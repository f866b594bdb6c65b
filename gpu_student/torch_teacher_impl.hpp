// TorchTeacher's torch-level side: the trainer runs the forward pass on device tensors directly.
#pragma once

#include "kdflow/gpu_student/torch_teacher.hpp"

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace kdflow::student {

struct TorchTeacher::Impl {
  teacher::Graph graph;
  torch::Device device{torch::kCPU};
  bool bf16 = false;
  std::map<std::string, torch::Tensor> constants; // on the device

  // The graph's outputs for `input` (on the device, the graph's input shape), without autograd.
  [[nodiscard]] std::vector<torch::Tensor> forward(const torch::Tensor& input) const;
};

} // namespace kdflow::student
