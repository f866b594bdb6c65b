// student.device resolved against what LibTorch sees, once per run (device.hpp).
#include "kdflow/gpu_student/device.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/gpu_student/settings.hpp"
#include "kdflow/gpu_student/versions.hpp"

#include <ATen/Parallel.h>
#include <fmt/format.h>

namespace kdflow::student {

Device choose_device(const std::string& wanted, int cuda_devices, int local_rank, int local_world) {
  check_name("student.device", wanted, device_names());
  if (wanted == "cuda" && cuda_devices == 0)
    throw InputError("student.device = cuda: no CUDA device is visible to this process");
  if (wanted == "cpu" || cuda_devices == 0) return {};
  if (local_world > cuda_devices)
    throw InputError(fmt::format(
        "LOCAL_WORLD_SIZE = {}: this node has {} CUDA device(s) for {} local ranks, and ranks do "
        "not share a GPU (torchrun --nproc-per-node at most {}, or student.device = cpu)",
        local_world, cuda_devices, local_world, cuda_devices));
  return {Device::Kind::cuda, local_rank};
}

Device resolve_device(const std::string& wanted, int local_rank, int local_world) {
  check_name("student.device", wanted, device_names());
  const int devices = wanted == "cpu" ? 0 : cuda_device_count();
  return choose_device(wanted, devices, local_rank, local_world);
}

int intra_op_threads() { return at::get_num_threads(); }

} // namespace kdflow::student
