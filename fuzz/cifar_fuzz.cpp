// Fuzz target: the CIFAR binary reader (CIFAR-10's test batch; an odd first byte reads it as
// CIFAR-100's two-label records).
#include "fuzz_files.hpp"

#include "kdflow/core/dataset.hpp"
#include "kdflow/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool hundred = (data[0] & 1) != 0;
  kdflow::fuzz::write(hundred ? "test.bin" : "test_batch.bin", data + 1, size - 1);
  try {
    const auto d = kdflow::Dataset::load(hundred ? "cifar100" : "cifar10", kdflow::fuzz::folder(),
                                         kdflow::Split::test, kdflow::ImageGeometry{});
    if (d.size() > 0) (void)d.label(d.size() - 1);
  } catch (const kdflow::InputError&) {
  }
  return 0;
}
