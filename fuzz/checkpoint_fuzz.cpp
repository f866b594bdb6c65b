// Fuzz target: the checkpoint file reader's own layer (header, length, CRC-32). An odd first byte
// makes the rest a payload written with a valid header first, so the read gets past the CRC; the
// payload itself is a LibTorch archive, whose reader is LibTorch's and outside this target.
#include "fuzz_files.hpp"

#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/error.hpp"

#include <cstdlib>
#include <cstring>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::span<const std::byte> rest(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  std::string path;
  const bool wrapped = (data[0] & 1) != 0;
  if (wrapped) {
    path = kdflow::fuzz::folder() + "/wrapped.ckpt";
    kdflow::write_checked_file(path, rest);
  } else {
    path = kdflow::fuzz::write("raw.ckpt", data + 1, size - 1);
  }
  try {
    const auto payload = kdflow::read_checked_file(path, "checkpoint");
    // What was written with a valid header reads back exactly.
    if (wrapped && (payload.size() != rest.size() ||
                    (!rest.empty() && std::memcmp(payload.data(), rest.data(), rest.size()) != 0)))
      std::abort();
  } catch (const kdflow::InputError&) {
    if (wrapped) std::abort();
  }
  return 0;
}
