// LibTorch's version is read from the `version.py` beside the libtorch_cpu that the dynamic linker
// actually loaded (dladdr), so it reports the wheel in use, not the headers kdflow was built with.
#include "kdflow/gpu_student/versions.hpp"

#include <dlfcn.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <ATen/Context.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#ifdef KD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kdflow::student {
namespace {

// "2.11.0+cu130, built for CUDA 13.0", read from the loaded wheel's version.py.
std::string torch_runtime_version() {
  Dl_info info{};
  // globalContext() is exported by libtorch_cpu (not inline), so dladdr names that library.
  if (dladdr(reinterpret_cast<void*>(&at::globalContext), &info) == 0 || info.dli_fname == nullptr)
    return "unknown (dladdr failed)";
  const std::filesystem::path lib = std::filesystem::canonical(info.dli_fname);
  std::ifstream in(lib.parent_path().parent_path() / "version.py");
  // Lines like `__version__ = '2.11.0+cu130'` and `cuda: Optional[str] = '13.0'`.
  const auto quoted = [](const std::string& line) {
    const auto a = line.find('\''), b = line.find('\'', a + 1);
    return a == std::string::npos || b == std::string::npos ? std::string()
                                                            : line.substr(a + 1, b - a - 1);
  };
  std::string version = "unknown";
  std::string cuda = "no CUDA";
  std::string text;
  while (std::getline(in, text)) {
    if (text.rfind("__version__", 0) == 0 && !quoted(text).empty()) version = quoted(text);
    if (text.rfind("cuda", 0) == 0 && !quoted(text).empty())
      cuda = "built for CUDA " + quoted(text);
  }
  return fmt::format("{}, {} ({})", version, cuda, lib.parent_path().string());
}

std::string cuda_versions() {
#ifdef KD_HAVE_CUDA
  int runtime = 0;
  int driver = 0;
  const bool have_runtime = cudaRuntimeGetVersion(&runtime) == cudaSuccess;
  const bool have_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  const auto fmt_cuda = [](int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); };
  return fmt::format("runtime {}, driver {}", have_runtime ? fmt_cuda(runtime) : "none",
                     have_driver ? fmt_cuda(driver) : "none");
#else
  return "none (built without CUDA)";
#endif
}

} // namespace

int cuda_device_count() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

std::string cuda_pci_bus_id([[maybe_unused]] int device) {
#ifdef KD_HAVE_CUDA
  if (device < cuda_device_count()) {
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, sizeof(id), device) == cudaSuccess) return id;
  }
#endif
  return {};
}

VersionLines student_versions() {
  VersionLines lines;
  lines.emplace_back("LibTorch", torch_runtime_version());
  lines.emplace_back("CUDA", cuda_versions());
  const int gpus = cuda_device_count();
  std::string gpu_line = std::to_string(gpus);
#ifdef KD_HAVE_CUDA
  for (int i = 0; i < gpus; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess)
      gpu_line += fmt::format("{} [{}: {}, {:.0f} GiB]", i == 0 ? "" : ",", i, prop.name,
                              static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  }
#endif
  lines.emplace_back("GPUs", gpu_line);
  return lines;
}

} // namespace kdflow::student
