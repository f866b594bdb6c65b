// Fuzz target: a NumPy .npy file (`kdflow teacher infer --input`): header, shape, dtype, data.
#include "fuzz_files.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/cpu_teacher/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kdflow::fuzz::write("array.npy", data, size);
  try {
    const auto array = kdflow::teacher::read_npy(path);
  } catch (const kdflow::InputError&) {
  }
  return 0;
}
