// The student networks, by name and width multiplier, in LibTorch. Input shape and class count
// come from the data. Private to gpu_student (includes torch).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kdflow::student {

struct Net : torch::nn::Module {
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

// arch: mlp | cnn | resnet20 | resnet56 | resnet18 | mobilenetv2. InputError for an unknown name
// or an input too small for the network's strides.
std::shared_ptr<Net> make_student(const std::string& arch, double width, std::int64_t channels,
                                  std::int64_t height, std::int64_t width_px, std::int64_t classes);

// The architectures make_student knows.
const std::vector<std::string>& student_archs();

} // namespace kdflow::student
