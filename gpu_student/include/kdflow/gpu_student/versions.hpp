// LibTorch and CUDA as loaded at run time. No torch headers here: the app includes this freely.
#pragma once

#include "kdflow/core/versions.hpp"

#include <string>

namespace kdflow::student {

// LibTorch (its version file beside the loaded library, whether it has CUDA), the CUDA runtime and
// driver (or "none"), and the GPUs visible to this process.
VersionLines student_versions();

// Number of CUDA devices usable by LibTorch (0 without a GPU or driver).
int cuda_device_count();

// PCI bus id ("0000:17:00.0") of CUDA device `device`, or empty without one.
std::string cuda_pci_bus_id(int device);

} // namespace kdflow::student
