// Image folders (`root/<class>/*.jpg|*.jpeg|*.png`, class index by sorted folder name) and the
// decoder the loader cores run on them: libjpeg-turbo (with its DCT scaling, so a large JPEG is
// decoded near the size it is wanted at) and libpng, then crop and resize to C x H x W uint8 with
// torchvision's own rules and PIL's own resampling (an image that needs no DCT scaling comes out
// as torchvision's transforms make it, each value within one level).
#pragma once

#include "kdflow/core/image_adapter.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kdflow {

// What an image becomes: its shorter side resized to `resize` (aspect kept, the longer side
// truncated as torchvision's Resize(int) does), then a `size` x `size` crop (torchvision's
// Resize(256) + CenterCrop/RandomCrop(224) is resize 256, size 224). With `random_resized` set, a
// training crop is torchvision's RandomResizedCrop(size, scale, ratio) instead.
struct ResizedCropRange {
  float scale_lo = 0.08f, scale_hi = 1.f;           // the crop's share of the image's area
  float ratio_lo = 3.f / 4.f, ratio_hi = 4.f / 3.f; // its width / height
};

struct ImageGeometry {
  int size = 224;
  int resize = 256;
  bool random_resized = false;
  ResizedCropRange range;
  // A JPEG is decoded at 1/2, 1/4 or 1/8 scale in the DCT domain where the crop keeps at least
  // its output size (far less to decode and resample; values then differ slightly from a full
  // decode's). False: always the full decode, pixel for pixel torchvision's.
  bool dct_scaling = true;
  // A JPEG's inverse DCT, upsampling and colour conversion run only on the rows and columns the
  // crop reads (with an iMCU of context: the values are the full decode's, bit for bit). False:
  // on the whole image (the tests' and benchmarks' reference).
  bool region_decode = true;
};

// Where the crop sits: with `random` false, in the resized image, as fractions of the free room
// (0.5 = centred); with `random` true and the geometry's `random_resized`, a RandomResizedCrop box
// whose uniform draws come from `key` (the same key, the same box, on any thread).
struct CropPosition {
  float y = 0.5f;
  float x = 0.5f;
  bool random = false;
  std::uint64_t key = 0;
};

// A crop box in an image's pixels: rows [top, top + height), columns [left, left + width).
struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
  bool operator==(const CropBox&) const = default;
};

// torchvision's RandomResizedCrop.get_params on an h x w image, step for step (ten tries of an
// area share and a log-uniform aspect ratio, the box rounded as Python rounds, its corner drawn as
// torch.randint draws it, then the centre-crop fallback), with the k-th uniform in [0, 1) taken
// from `key` alone. `draws`, when given, receives the uniforms used in order (for the check
// against torchvision: scripts/check_augment.py).
CropBox random_resized_crop_box(int h, int w, const ResizedCropRange& range, std::uint64_t key,
                                std::vector<double>* draws = nullptr);

// The resampling PIL's Image.resize(BILINEAR) does, as torchvision's transforms call it: a
// triangle filter widened by the downscale factor (antialiased), coefficients in PIL's fixed point,
// the horizontal pass first into 8-bit rows, then the vertical one. `src` is interleaved RGB with
// `stride` pixels a row; the region [x0, x0 + w) x [y0, y0 + h) is resampled as if it were the
// whole image (taps never read outside it; x0 and y0 may be negative where `src` holds only the
// part of the region the window reads) to out_h x out_w, of which the window of `size` rows and
// columns from (oy, ox) is written planar (3 x size x size) to `out`. A crop or a resize along one
// axis is exactly PIL's; along both, within one level (Pillow 13 orders its two passes by a rule of
// its own for some shapes, and the 8-bit rounding between them differs).
struct ResampleScratch {
  ResampleTaps taps;
  std::vector<int> xbounds, ybounds;
  std::vector<std::int32_t> xk, yk;
  std::vector<std::uint8_t> rows;
  std::vector<std::int32_t> acc; // one output row's sums
};
void resample_bilinear_aa(const std::uint8_t* src, int stride, int x0, int y0, int w, int h,
                          int out_h, int out_w, int oy, int ox, int size, std::uint8_t* out,
                          ResampleScratch& scratch);

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
  // 3 x size x size uint8 (planar, RGB) to `out`; returns the file's size and the box of its
  // pixels that was resized (the RandomResizedCrop box, or the whole image). InputError naming the
  // file if it cannot be read or decoded (libjpeg-turbo's or libpng's reason included).
  struct Decoded {
    int height = 0, width = 0;
    CropBox box;
  };
  Decoded decode(const std::string& path, const ImageGeometry& geometry, CropPosition crop,
                 std::uint8_t* out);

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace kdflow
