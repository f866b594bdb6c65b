// Small LibTorch helpers the student's modules share.
#pragma once

#include "kdflow/gpu_student/device.hpp"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <string>

namespace kdflow::student {

// The run's device (resolved once, device.hpp) as LibTorch's.
inline torch::Device to_torch(const Device& device) {
  return device.is_cuda() ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device.index))
                          : torch::Device(torch::kCPU);
}

// Scoped autocast on CUDA; a no-op when off.
class AutocastScope {
public:
  AutocastScope(bool on, torch::ScalarType dtype) : on_(on) {
    if (!on_) return;
    at::autocast::set_autocast_dtype(at::kCUDA, dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
  }
  ~AutocastScope() {
    if (!on_) return;
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

private:
  bool on_;
};

} // namespace kdflow::student
