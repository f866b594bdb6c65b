// student.device resolved against what LibTorch sees, once per run (device.hpp).
#include "kdflow/gpu_student/device.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/gpu_student/settings.hpp"
#include "kdflow/gpu_student/versions.hpp"

#include <torch/cuda.h>

#include <fmt/format.h>

namespace kdflow::student {

Device resolve_device(const std::string& wanted, int local_rank) {
  check_name("student.device", wanted, device_names());
  const bool cuda = torch::cuda::is_available();
  if (wanted == "cuda" && !cuda)
    throw InputError("student.device = cuda: no CUDA device is visible to this process");
  if (wanted == "cuda" || (wanted == "auto" && cuda)) {
    if (local_rank >= cuda_device_count())
      throw InputError(fmt::format("LOCAL_RANK = {}: this node has {} CUDA device(s), one per "
                                   "local rank (torchrun --nproc-per-node at most {})",
                                   local_rank, cuda_device_count(), cuda_device_count()));
    return {Device::Kind::cuda, local_rank};
  }
  return {};
}

} // namespace kdflow::student
