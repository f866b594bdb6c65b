// Fuzz target: the IDX reader (MNIST, Fashion-MNIST). Input: a 4-byte little-endian length L, the
// label file's L bytes, then the image file; an odd first length byte stores both gzipped-named
// (read through zlib, as the Debian package's .gz files are).
#include "fuzz_files.hpp"

#include "kdflow/core/dataset.hpp"
#include "kdflow/core/error.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  std::uint32_t labels = 0;
  std::memcpy(&labels, data, 4);
  const bool gz = (labels & 1) != 0;
  labels = std::min<std::uint32_t>(labels >> 1, static_cast<std::uint32_t>(size - 4));
  const std::string suffix = gz ? ".gz" : "";
  // One pair of files at a time: remove the other naming's.
  for (const char* stale : {"t10k-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                            "t10k-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"})
    std::remove((kdflow::fuzz::folder() + "/" + stale).c_str());
  kdflow::fuzz::write("t10k-labels-idx1-ubyte" + suffix, data + 4, labels);
  kdflow::fuzz::write("t10k-images-idx3-ubyte" + suffix, data + 4 + labels, size - 4 - labels);
  try {
    const auto d = kdflow::Dataset::load("fashion-mnist", kdflow::fuzz::folder(),
                                         kdflow::Split::test, kdflow::ImageGeometry{});
    if (d.size() > 0) (void)d.label(d.size() - 1);
  } catch (const kdflow::InputError&) {
  }
  return 0;
}
