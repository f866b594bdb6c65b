// The student networks, by name and width multiplier, in LibTorch. Input shape and class count
// come from the data. Private to gpu_student (includes torch).
#pragma once

#include "kdflow/gpu_student/students.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace kdflow::student {

struct Net : torch::nn::Module {
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

// The registry's network for `spec`. InputError for an unknown name or an input too small for the
// network's strides.
std::shared_ptr<Net> make_student(const StudentSpec& spec);

// script_net.cpp: a TorchScript module (spec.path) as a Net, checked at load with one dry batch of
// the data's shape (InputError naming the file: not an archive, no forward, an input it rejects,
// logits that are not [batch, spec.classes], no floating-point parameters); the digest of its
// file, for checkpoints; and the module saved back (trained, in eval mode) to `out`.
std::shared_ptr<Net> make_script_net(const StudentSpec& spec);
std::string script_digest(const std::string& path);
void save_script_net(Net& net, std::ostream& out);

} // namespace kdflow::student
