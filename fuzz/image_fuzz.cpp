// Fuzz target: one image file (JPEG or PNG, by its first bytes as the image folder lists them)
// decoded by the loader's decoder through its resize and crop to 32x32 (from 36), then through a
// RandomResizedCrop to 32x32.
#include "fuzz_files.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/image_folder.hpp"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static kdflow::ImageDecoder decoder; // reused, as a loader body reuses its own
  const bool png = size >= 4 && data[0] == 0x89 && data[1] == 'P';
  const std::string path = kdflow::fuzz::write(png ? "image.png" : "image.jpg", data, size);
  const kdflow::ImageGeometry geometry{32, 36};
  std::vector<std::uint8_t> out(3 * 32 * 32);
  try {
    decoder.decode(path, geometry, {0.25f, 0.75f}, out.data());
    // A RandomResizedCrop box of its own (the region decoded is then the box's).
    kdflow::ImageGeometry rrc = geometry;
    rrc.random_resized = true;
    decoder.decode(path, rrc, {0.5f, 0.5f, true, size}, out.data());
  } catch (const kdflow::InputError&) {
  }
  return 0;
}
