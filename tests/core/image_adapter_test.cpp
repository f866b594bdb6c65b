// The teacher's input adapter: the loader's normalization bit for bit at the same size, the
// decoder's resize (box average, bilinear taps) at other sizes, float32 and uint8 slots alike.
#include "image_files.hpp"

#include "kdflow/core/image_adapter.hpp"
#include "kdflow/core/image_folder.hpp"
#include "kdflow/core/loader.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <vector>

namespace kdflow {
namespace {

namespace fs = std::filesystem;

std::vector<std::uint8_t> planar_of(const test::Pixels& p) {
  std::vector<std::uint8_t> out(p.data.size());
  const std::size_t plane = static_cast<std::size_t>(p.height) * p.width;
  for (int c = 0; c < p.channels; ++c)
    for (int y = 0; y < p.height; ++y)
      for (int x = 0; x < p.width; ++x)
        out[static_cast<std::size_t>(c) * plane + static_cast<std::size_t>(y) * p.width + x] =
            p.at(y, x, c);
  return out;
}

const Normalization kPlain{{0.f, 0.f, 0.f}, {1.f, 1.f, 1.f}}; // x / 255
const Normalization kImageNet{{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};

TEST(ImageAdapter, SameSizeIsTheLoadersNormalizationBitForBit) {
  const test::Pixels p = test::random_pixels(9, 7, 3, 5);
  std::vector<std::uint8_t> images = planar_of(p);
  images.insert(images.end(), images.rbegin(), images.rend()); // a second, different sample
  const ImageSpec spec{3, 9, 7};
  const ImageAdapter adapter(spec, kImageNet, spec, kImageNet);
  EXPECT_TRUE(adapter.passes_floats());
  EXPECT_FALSE(adapter.resizes());

  AugmentConfig augment;
  augment.mean = kImageNet.mean;
  augment.std = kImageNet.std;
  std::vector<float> loader(images.size()), adapted(images.size()), scratch;
  normalize_images(images.data(), loader.data(), 2, 3, 63, augment);
  adapter.run(images.data(), 2, adapted.data(), scratch);
  EXPECT_EQ(adapted, loader) << "uint8 slots reach the teacher as float32 slots hold them";
  std::vector<float> copied(images.size());
  adapter.run(loader.data(), 2, copied.data(), scratch);
  EXPECT_EQ(copied, loader);
}

// The decoder's output for a square image resized to size x size whole (resize = size: no crop
// left), against the adapter's for the same pixels: the same taps, the decoder in PIL's fixed point
// rounding to 8 bits after each pass, the adapter in float32.
void expect_decoder_resize(int from, int to) {
  SCOPED_TRACE(std::to_string(from) + " -> " + std::to_string(to));
  const fs::path dir = fs::temp_directory_path() / ("kdflow_adapter_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const test::Pixels p = test::random_pixels(from, from, 3, static_cast<std::uint32_t>(from * to));
  test::write_png(dir / "a.png", p);
  ImageDecoder decoder;
  std::vector<std::uint8_t> decoded(static_cast<std::size_t>(3 * to * to));
  decoder.decode((dir / "a.png").string(), {to, to}, {}, decoded.data());
  fs::remove_all(dir);

  const ImageAdapter adapter({3, from, from}, kPlain, {3, to, to}, kPlain);
  const std::vector<std::uint8_t> images = planar_of(p);
  std::vector<float> out(decoded.size()), scratch;
  adapter.run(images.data(), 1, out.data(), scratch);
  double worst = 0;
  for (std::size_t i = 0; i < out.size(); ++i)
    worst = std::max(worst, std::fabs(out[i] * 255.0 - decoded[i]));
  EXPECT_LE(worst, 1.001); // two roundings to 8 bits of at most half a level each
}

TEST(ImageAdapter, ResizesWithTheDecodersArithmetic) {
  expect_decoder_resize(28, 64); // up
  expect_decoder_resize(36, 20); // down by less than two
  expect_decoder_resize(70, 16); // down by four: every output reads ~9 inputs a side
  expect_decoder_resize(48, 16); // down by exactly three
}

TEST(ImageAdapter, FloatSlotsRenormalizeAndOneChannelRepeats) {
  const test::Pixels p = test::random_pixels(12, 10, 1, 9);
  const std::vector<std::uint8_t> images = planar_of(p);
  const Normalization grey{{0.286f}, {0.353f}};
  for (const ImageSpec to : {ImageSpec{3, 12, 10}, ImageSpec{3, 30, 25}, ImageSpec{3, 5, 4}}) {
    SCOPED_TRACE(std::to_string(to.height) + "x" + std::to_string(to.width));
    const ImageAdapter adapter({1, 12, 10}, grey, to, kImageNet);
    EXPECT_FALSE(adapter.passes_floats());
    std::vector<float> from_bytes(to.numel()), from_floats(to.numel()), scratch;
    adapter.run(images.data(), 1, from_bytes.data(), scratch);
    // The same image as a float32 slot normalized with the data's mean and std.
    AugmentConfig augment;
    augment.mean = grey.mean;
    augment.std = grey.std;
    std::vector<float> slot(images.size());
    normalize_images(images.data(), slot.data(), 1, 1, images.size(), augment);
    adapter.run(slot.data(), 1, from_floats.data(), scratch);
    for (std::size_t i = 0; i < to.numel(); ++i)
      ASSERT_NEAR(from_floats[i], from_bytes[i], 1e-5) << i;
    // Every output channel is the one resampled plane under that channel's normalization.
    const std::size_t plane = static_cast<std::size_t>(to.height) * to.width;
    for (std::size_t c = 1; c < 3; ++c)
      for (std::size_t i = 0; i < plane; ++i) {
        const float pixel = (from_bytes[i] - pixel_shift(kImageNet.mean[0], kImageNet.std[0])) /
                            pixel_scale(kImageNet.std[0]);
        ASSERT_NEAR(from_bytes[c * plane + i],
                    pixel * pixel_scale(kImageNet.std[c]) +
                        pixel_shift(kImageNet.mean[c], kImageNet.std[c]),
                    1e-4);
      }
    if (to.height == 12) { // same size: the pixels themselves
      for (std::size_t i = 0; i < plane; ++i)
        ASSERT_FLOAT_EQ(from_bytes[i], images[i] * pixel_scale(kImageNet.std[0]) +
                                           pixel_shift(kImageNet.mean[0], kImageNet.std[0]));
    }
  }
}

TEST(ImageAdapter, RefusesChannelsThatNeitherMatchNorRepeat) {
  const Normalization two{{0.f, 0.f}, {1.f, 1.f}};
  EXPECT_THROW(ImageAdapter({2, 8, 8}, two, {3, 8, 8}, kPlain), std::invalid_argument);
  EXPECT_THROW(ImageAdapter({3, 8, 8}, kPlain, {3, 8, 8}, two), std::invalid_argument);
  EXPECT_THROW(ImageAdapter({3, 0, 8}, kPlain, {3, 8, 8}, kPlain), std::invalid_argument);
}

} // namespace
} // namespace kdflow
