// Image folders (`root/<class>/*.jpg|*.jpeg|*.png`, class index by sorted folder name) and the
// decoder the loader cores run on them: libjpeg-turbo (with its DCT scaling, so a large JPEG is
// decoded near the size it is wanted at) and libpng, then resize and crop to C x H x W uint8.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kdflow {

// What an image becomes: its shorter side resized to `resize` (aspect kept), then a `size` x
// `size` crop (torchvision's Resize(256) + CenterCrop/RandomCrop(224) is resize 256, size 224).
struct ImageGeometry {
  int size = 224;
  int resize = 256;
};

// Where the crop sits in the resized image: fractions of the free room, 0.5 = centred.
struct CropPosition {
  float y = 0.5f;
  float x = 0.5f;
};

struct ImageFolder {
  std::string root;
  std::vector<std::string> classes; // sorted folder names; a label is an index into this
  std::vector<std::string> files;   // sorted by class, then by name
  std::vector<std::uint16_t> labels;
  std::size_t ignored = 0; // files whose extension is not .jpg, .jpeg or .png
};

// Lists `root`; every listed file's first bytes are checked to be a JPEG or PNG. InputError naming
// the folder or file: no class folders, an empty class folder, a file that is not an image, more
// classes than labels can hold.
ImageFolder list_image_folder(const std::string& root);

// One thread's decoder: its libjpeg-turbo handle and buffers, reused from image to image (no
// allocation once they have grown to the largest image). Not thread-safe; one per loader body.
class ImageDecoder {
public:
  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(ImageDecoder&&) noexcept;
  ImageDecoder& operator=(ImageDecoder&&) noexcept;
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // Reads and decodes `path` to RGB, resizes and crops it per `geometry` at `crop`, and writes
  // 3 x size x size uint8 (planar, RGB) to `out`. InputError naming the file if it cannot be read
  // or decoded (libjpeg-turbo's or libpng's reason included).
  void decode(const std::string& path, const ImageGeometry& geometry, CropPosition crop,
              std::uint8_t* out);

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace kdflow
