// The student networks, by name and width multiplier, in LibTorch. Input shape and class count
// come from the data. Private to gpu_student (includes torch).
#pragma once

#include "kdflow/gpu_student/students.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kdflow::student {

struct Net : torch::nn::Module {
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

// The registry's network for `spec`. InputError for an unknown name or an input too small for the
// network's strides.
std::shared_ptr<Net> make_student(const StudentSpec& spec);

} // namespace kdflow::student
