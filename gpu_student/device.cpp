// student.device resolved against what LibTorch sees, once per run (device.hpp).
#include "kdflow/gpu_student/device.hpp"

#include "kdflow/core/error.hpp"

#include <torch/cuda.h>

namespace kdflow::student {

Device resolve_device(const std::string& wanted) {
  if (wanted != "auto" && wanted != "cpu" && wanted != "cuda")
    throw InputError("student.device = " + wanted + ": not auto, cpu or cuda");
  const bool cuda = torch::cuda::is_available();
  if (wanted == "cuda" && !cuda)
    throw InputError("student.device = cuda: no CUDA device is visible to this process");
  if (wanted == "cuda" || (wanted == "auto" && cuda)) return {Device::Kind::cuda, 0};
  return {};
}

} // namespace kdflow::student
