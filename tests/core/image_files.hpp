// Writing small JPEG and PNG files for the image-folder tests: libjpeg-turbo's encoder and libpng's
// simplified writer, from interleaved pixels the test chose.
#pragma once

#include <gtest/gtest.h>
#include <png.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace kdflow::test {

// Interleaved 8-bit pixels, `channels` per pixel (1 grey, 3 RGB, 4 RGBA).
struct Pixels {
  int height = 0, width = 0, channels = 3;
  std::vector<std::uint8_t> data;
  [[nodiscard]] std::uint8_t at(int y, int x, int c) const {
    return data[(static_cast<std::size_t>(y) * width + x) * channels + c];
  }
};

inline Pixels random_pixels(int height, int width, int channels, std::uint32_t seed) {
  Pixels p{height, width, channels,
           std::vector<std::uint8_t>(static_cast<std::size_t>(height) * width * channels)};
  std::mt19937 rng(seed);
  for (auto& v : p.data) v = static_cast<std::uint8_t>(rng() & 0xff);
  return p;
}

// Smooth content (what JPEG keeps well): low-frequency waves, different per channel.
inline Pixels smooth_pixels(int height, int width, std::uint32_t seed) {
  Pixels p{height, width, 3,
           std::vector<std::uint8_t>(static_cast<std::size_t>(height) * width * 3)};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> phase(0, 6.28);
  const double a = phase(rng), b = phase(rng);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) {
        const double v =
            128 + 90 * std::sin(a + c + 3.0 * y / height) * std::cos(b - c + 2.0 * x / width);
        p.data[(static_cast<std::size_t>(y) * width + x) * 3 + c] =
            static_cast<std::uint8_t>(std::lround(v));
      }
  return p;
}

inline void write_png(const std::filesystem::path& path, const Pixels& p) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(p.width);
  image.height = static_cast<png_uint_32>(p.height);
  image.format = p.channels == 1   ? PNG_FORMAT_GRAY
                 : p.channels == 4 ? PNG_FORMAT_RGBA
                                   : PNG_FORMAT_RGB;
  ASSERT_NE(png_image_write_to_file(&image, path.c_str(), 0, p.data.data(), 0, nullptr), 0)
      << image.message;
}

// JPEG bytes of `p`: 4:4:4 (grey for one channel) unless `subsampling` (TJSAMP_*) says
// otherwise; `flags` are TurboJPEG's (TJFLAG_PROGRESSIVE, for one).
inline std::vector<std::uint8_t> jpeg_bytes(const Pixels& p, int quality, int subsampling = -1,
                                            int flags = 0) {
  tjhandle h = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int format = p.channels == 1 ? TJPF_GRAY : TJPF_RGB;
  if (subsampling < 0) subsampling = p.channels == 1 ? TJSAMP_GRAY : TJSAMP_444;
  EXPECT_EQ(tjCompress2(h, p.data.data(), p.width, 0, p.height, format, &out, &size, subsampling,
                        quality, flags),
            0)
      << tjGetErrorStr2(h);
  std::vector<std::uint8_t> bytes(out, out + size);
  tjFree(out);
  tjDestroy(h);
  return bytes;
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

inline void write_jpeg(const std::filesystem::path& path, const Pixels& p, int quality = 95) {
  write_bytes(path, jpeg_bytes(p, quality));
}

// A small image folder: `root/train` and `root/val`, `classes` class folders (named so that their
// sorted order is the reverse of their creation order), `per_class` images each, JPEG and PNG
// alternating, height x width.
inline void write_image_folder(const std::filesystem::path& root, int classes, int per_class,
                               int height, int width) {
  for (const char* split : {"train", "val"})
    for (int c = 0; c < classes; ++c) {
      const auto dir = root / split / ("class_" + std::string(1, static_cast<char>('z' - c)));
      std::filesystem::create_directories(dir);
      for (int i = 0; i < per_class; ++i) {
        const Pixels p = smooth_pixels(height, width, static_cast<std::uint32_t>(c * 1000 + i));
        if (i % 2 == 0)
          write_jpeg(dir / ("img" + std::to_string(i) + ".jpg"), p);
        else
          write_png(dir / ("img" + std::to_string(i) + ".png"), p);
      }
    }
}

} // namespace kdflow::test
