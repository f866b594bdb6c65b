// Small LibTorch helpers the student's modules share.
#pragma once

#include "kdflow/core/error.hpp"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <string>

namespace kdflow::student {

// "cpu", "cuda" or "auto" (CUDA when one is visible); InputError for cuda without a device.
inline torch::Device pick_device(const std::string& wanted) {
  const bool cuda = torch::cuda::is_available();
  if (wanted == "cuda" && !cuda)
    throw InputError("student.device = cuda: no CUDA device is visible to this process");
  return (wanted == "cuda" || (wanted == "auto" && cuda)) ? torch::Device(torch::kCUDA, 0)
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
