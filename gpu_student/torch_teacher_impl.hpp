// TorchTeacher's torch-level side: the trainer runs the forward pass on device tensors directly.
#pragma once

#include "kdflow/core/image_adapter.hpp"
#include "kdflow/gpu_student/torch_teacher.hpp"

#include <torch/torch.h>

#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kdflow::student {

struct TorchTeacher::Impl {
  teacher::Graph graph;
  torch::Device device{torch::kCPU};
  bool bf16 = false;
  std::map<std::string, torch::Tensor> constants; // on the device

  // What a node's LibTorch call reads: the values computed so far, the constants, the graph.
  struct Values {
    const Impl& m;
    const std::unordered_map<std::string, torch::Tensor>& env;
    [[nodiscard]] const torch::Tensor& operator()(const std::string& name) const;
  };
  // A node's outputs (Split has several).
  using OpFn = std::vector<torch::Tensor> (*)(const Values& value, const teacher::Node& node);
  using ActivationFn = torch::Tensor (*)(const torch::Tensor& x, float alpha, float beta);
  // One node's call and its post-ops (an activation and nullptr: a residual sum), taken from the
  // op table at load so that a batch looks nothing up.
  struct Step {
    OpFn run;
    std::vector<std::pair<teacher::PostOp, ActivationFn>> post;
  };
  std::vector<Step> steps; // one per graph node

  // The graph's outputs, then its kept values (the teacher's features), for `input` (on the
  // device, the graph's input shape), without autograd.
  [[nodiscard]] std::vector<torch::Tensor> forward(const torch::Tensor& input) const;
  // One run at graph.batch rows (forward runs it graph.chunks times for a model that fixes its
  // batch).
  [[nodiscard]] std::vector<torch::Tensor> forward_once(const torch::Tensor& input) const;
};

// ImageAdapter's work with LibTorch ops on the device: float32 images [N, C, H, W] normalized as
// the adapter's input -> the teacher's input (box average, bilinear without antialiasing, channel
// 0 repeated, renormalized), equal to ImageAdapter::run within float rounding.
torch::Tensor adapt_images(const ImageAdapter& adapter, const torch::Tensor& images);

} // namespace kdflow::student
