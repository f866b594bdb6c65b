// Image folders on JPEG and PNG files the test writes: listing (classes by sorted folder name),
// decoding against the pixels that were written (exact for PNG, close for JPEG), crops, resizing
// (box reduction exact, bilinear exact on linear ramps, DCT-scaled JPEG close), the Dataset built
// on them, and every bad input: each an InputError of one line naming the file or folder.
#include "../test_scratch.hpp"
#include "image_files.hpp"
#include "input_error.hpp"

#include "kdflow/core/dataset.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/image_folder.hpp"

#include <gtest/gtest.h>
#include <turbojpeg.h>
#include <zlib.h>

#include <sys/stat.h>

#include <filesystem>
#include <functional>

namespace kdflow {
namespace {

namespace fs = std::filesystem;
using test::Pixels;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::path(kdflow_test::process_scratch("kdflow_images_")) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

using test::error_of;

// Decodes `path` with `g` at `crop`: 3 x size x size planar.
std::vector<std::uint8_t> decode(const fs::path& path, ImageGeometry g, CropPosition crop = {}) {
  ImageDecoder decoder;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(3 * g.size * g.size));
  decoder.decode(path.string(), g, crop, out.data());
  return out;
}

std::uint8_t planar(const std::vector<std::uint8_t>& out, int size, int c, int y, int x) {
  return out[(static_cast<std::size_t>(c) * size + y) * size + x];
}

TEST(ImageDecoder, PngCropsAreExactAtEveryPosition) {
  const fs::path dir = fresh_dir("png_crop");
  const Pixels p = test::random_pixels(30, 40, 3, 7); // shorter side 30 = resize: no resampling
  test::write_png(dir / "a.png", p);
  const ImageGeometry g{24, 30};
  for (const CropPosition crop :
       {CropPosition{0, 0}, CropPosition{}, CropPosition{1, 1}, CropPosition{0.25f, 0.75f}}) {
    const auto out = decode(dir / "a.png", g, crop);
    const int oy = static_cast<int>(std::nearbyint(crop.y * (30 - 24)));
    const int ox = static_cast<int>(std::nearbyint(crop.x * (40 - 24)));
    int wrong = 0;
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 24; ++y)
        for (int x = 0; x < 24; ++x) wrong += planar(out, 24, c, y, x) != p.at(oy + y, ox + x, c);
    EXPECT_EQ(wrong, 0) << "crop at " << crop.y << ", " << crop.x;
  }
}

TEST(ImageDecoder, GreyAndAlphaPngBecomeRgb) {
  const fs::path dir = fresh_dir("png_kinds");
  const Pixels grey = test::random_pixels(16, 16, 1, 3);
  test::write_png(dir / "grey.png", grey);
  const auto g = decode(dir / "grey.png", {16, 16});
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x) ASSERT_EQ(planar(g, 16, c, y, x), grey.at(y, x, 0));
  // Opaque pixels keep their colour; a transparent one is composited on black.
  Pixels rgba = test::random_pixels(8, 8, 4, 5);
  for (int k = 0; k < 64; ++k) rgba.data[static_cast<std::size_t>(k) * 4 + 3] = 255;
  rgba.data[3] = 0;
  test::write_png(dir / "rgba.png", rgba);
  const auto a = decode(dir / "rgba.png", {8, 8});
  EXPECT_EQ(planar(a, 8, 0, 0, 0), 0);
  EXPECT_EQ(planar(a, 8, 2, 7, 7), rgba.at(7, 7, 2));
}

// An independent reading of PIL's antialiased bilinear resize in double precision (no fixed
// point, no 8-bit rows between the passes): the decoder must be within one level of it.
std::vector<double> triangle_weights(int in, int out, int o, int& first) {
  const double scale = static_cast<double>(in) / out, fs = std::max(scale, 1.0);
  const double centre = (o + 0.5) * scale;
  first = std::max(static_cast<int>(centre - fs + 0.5), 0);
  const int last = std::min(static_cast<int>(centre + fs + 0.5), in);
  std::vector<double> w;
  double total = 0;
  for (int j = first; j < last; ++j) {
    const double t = std::abs((j - centre + 0.5) / fs);
    w.push_back(t < 1 ? 1 - t : 0);
    total += w.back();
  }
  for (auto& v : w) v /= total;
  return w;
}

TEST(ImageDecoder, DownscalesAreAntialiasedAsPilResizes) {
  // 64 x 96 to shorter side 16 (a factor of 4: every output pixel reads 8 or 9 source pixels a
  // side, not the 2 plain bilinear sampling reads), then 16 x 16 from the left edge.
  const fs::path dir = fresh_dir("png_aa");
  const Pixels p = test::random_pixels(64, 96, 3, 11);
  test::write_png(dir / "a.png", p);
  const auto out = decode(dir / "a.png", {16, 16}, {0, 0});
  int worst = 0;
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x) {
        int fy = 0, fx = 0;
        const auto wy = triangle_weights(64, 16, y, fy), wx = triangle_weights(96, 24, x, fx);
        ASSERT_GE(wy.size(), 6u); // 8 inside, fewer at the edges
        double v = 0;
        for (std::size_t i = 0; i < wy.size(); ++i)
          for (std::size_t j = 0; j < wx.size(); ++j)
            v += wy[i] * wx[j] * p.at(fy + static_cast<int>(i), fx + static_cast<int>(j), c);
        worst =
            std::max(worst, static_cast<int>(std::lround(std::abs(planar(out, 16, c, y, x) - v))));
      }
  EXPECT_LE(worst, 1);
}

TEST(ImageDecoder, RandomResizedCropBoxesFollowTheirRange) {
  const ResizedCropRange range; // torchvision's defaults: scale 0.08-1, ratio 3/4-4/3
  int fallbacks = 0;
  for (std::uint64_t key = 0; key < 2000; ++key) {
    const int h = 200 + static_cast<int>(key % 7) * 40, w = 300 - static_cast<int>(key % 5) * 30;
    std::vector<double> draws;
    const CropBox b = random_resized_crop_box(h, w, range, key, &draws);
    ASSERT_EQ(b, random_resized_crop_box(h, w, range, key)) << "the same key, the same box";
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_GT(b.height, 0);
    ASSERT_GT(b.width, 0);
    ASSERT_LE(b.top + b.height, h);
    ASSERT_LE(b.left + b.width, w);
    for (const double u : draws) ASSERT_TRUE(u >= 0 && u < 1);
    if (draws.size() == 40) { // ten tries missed: the centred fallback
      ++fallbacks;
      continue;
    }
    ASSERT_EQ(draws.size() % 2, 0u);
    const double share = static_cast<double>(b.height) * b.width / (static_cast<double>(h) * w);
    // Rounding the sides to pixels moves the share and the ratio a little past the range.
    EXPECT_GT(share, 0.07);
    EXPECT_LT(share, 1.02);
    const double ratio = static_cast<double>(b.width) / b.height;
    EXPECT_GT(ratio, 0.74);
    EXPECT_LT(ratio, 1.35);
  }
  EXPECT_LT(fallbacks, 20);
  // A strip far outside the ratio range never fits: the fallback is the centred 3:4 or 4:3 box.
  const CropBox wide = random_resized_crop_box(10, 1000, range, 1);
  EXPECT_EQ(wide, (CropBox{0, 493, 10, 13}));
  const CropBox tall = random_resized_crop_box(1000, 10, range, 1);
  EXPECT_EQ(tall, (CropBox{493, 0, 13, 10}));
}

TEST(ImageDecoder, BilinearResizeIsExactOnLinearRamps) {
  // A linear ramp stays linear under bilinear sampling: the value at an output pixel is the ramp at
  // the source coordinate of its centre, (i + 0.5) * scale - 0.5 (pixel centres aligned).
  const fs::path dir = fresh_dir("png_ramp");
  const int h = 40, w = 50;
  Pixels p{h, w, 3, std::vector<std::uint8_t>(static_cast<std::size_t>(h) * w * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      p.data[(static_cast<std::size_t>(y) * w + x) * 3 + 0] = static_cast<std::uint8_t>(4 * x);
      p.data[(static_cast<std::size_t>(y) * w + x) * 3 + 1] = static_cast<std::uint8_t>(5 * y);
      p.data[(static_cast<std::size_t>(y) * w + x) * 3 + 2] = 77;
    }
  test::write_png(dir / "ramp.png", p);
  const ImageGeometry g{24, 32}; // 40 x 50 -> 32 x 40, crop 24 x 24 centred at (4, 8)
  const auto out = decode(dir / "ramp.png", g);
  const double scale = 40.0 / 32.0;
  for (int y = 0; y < 24; ++y)
    for (int x = 0; x < 24; ++x) {
      const double sx = std::clamp((8 + x + 0.5) * scale - 0.5, 0.0, w - 1.0);
      const double sy = std::clamp((4 + y + 0.5) * scale - 0.5, 0.0, h - 1.0);
      EXPECT_NEAR(planar(out, 24, 0, y, x), 4 * sx, 0.51) << y << " " << x;
      EXPECT_NEAR(planar(out, 24, 1, y, x), 5 * sy, 0.51) << y << " " << x;
      EXPECT_EQ(planar(out, 24, 2, y, x), 77);
    }
}

TEST(ImageDecoder, JpegDecodesCloseToWhatWasWritten) {
  const fs::path dir = fresh_dir("jpeg");
  const Pixels p = test::smooth_pixels(48, 64, 21);
  test::write_jpeg(dir / "a.jpg", p, 98);
  const auto out = decode(dir / "a.jpg", {40, 48}); // crop only: centred at (4, 12)
  double total = 0;
  int worst = 0;
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 40; ++y)
      for (int x = 0; x < 40; ++x) {
        const int d = std::abs(planar(out, 40, c, y, x) - p.at(4 + y, 12 + x, c));
        total += d;
        worst = std::max(worst, d);
      }
  EXPECT_LT(total / (3 * 40 * 40), 1.0);
  EXPECT_LE(worst, 4);
  // Grey JPEG: three equal channels.
  const Pixels grey = test::random_pixels(16, 16, 1, 2);
  test::write_jpeg(dir / "grey.jpg", grey, 90);
  const auto g = decode(dir / "grey.jpg", {16, 16});
  for (int k = 0; k < 256; ++k)
    ASSERT_EQ(g[static_cast<std::size_t>(k)], g[256 + static_cast<std::size_t>(k)]);
}

TEST(ImageDecoder, LargeJpegUsesDctScalingAndStaysClose) {
  // 384 x 512 to shorter side 64: decoded at 1/4 (96 x 128), then resized; compare with the
  // smooth content the image was made from, sampled at the output pixels' centres.
  const fs::path dir = fresh_dir("jpeg_big");
  const Pixels p = test::smooth_pixels(384, 512, 4);
  test::write_jpeg(dir / "big.jpg", p, 95);
  const auto out = decode(dir / "big.jpg", {64, 64});
  const double scale = 384.0 / 64.0; // resized 64 x 85, crop 64 x 64 centred at (0, 10)
  const int ox = static_cast<int>(std::nearbyint(0.5 * (85 - 64))); // CenterCrop's round()
  double total = 0;
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 64; ++y)
      for (int x = 0; x < 64; ++x) {
        const int sy = std::clamp(static_cast<int>((y + 0.5) * scale), 0, 383);
        const int sx = std::clamp(static_cast<int>((ox + x + 0.5) * scale), 0, 511);
        total += std::abs(planar(out, 64, c, y, x) - p.at(sy, sx, c));
      }
  EXPECT_LT(total / (3 * 64 * 64), 3.0);
}

// The crop's region decoded alone (jpeg_crop_scanline, jpeg_skip_scanlines, an iMCU of context)
// against the whole image decoded: every subsampling, baseline and progressive, with and without
// DCT scaling, RandomResizedCrop boxes and resize + crop windows anywhere: the same bytes.
TEST(ImageDecoder, JpegRegionDecodeIsTheWholeDecodeBitForBit) {
  const fs::path dir = fresh_dir("jpeg_region");
  // Detail everywhere (noise on a gradient), an odd size: partial iMCUs on the right and bottom.
  Pixels p = test::smooth_pixels(301, 397, 5);
  const Pixels noise = test::random_pixels(301, 397, 3, 6);
  for (std::size_t i = 0; i < p.data.size(); ++i)
    p.data[i] = static_cast<std::uint8_t>((p.data[i] * 3 + noise.data[i]) / 4);
  const Pixels grey = test::random_pixels(211, 173, 1, 7);
  struct File {
    std::string name;
    std::vector<std::uint8_t> bytes;
  };
  std::vector<File> files;
  for (const int sub : {TJSAMP_444, TJSAMP_422, TJSAMP_420, TJSAMP_440})
    for (const int flags : {0, TJFLAG_PROGRESSIVE})
      files.push_back({"s" + std::to_string(sub) + "_f" + std::to_string(flags) + ".jpg",
                       test::jpeg_bytes(p, 90, sub, flags)});
  files.push_back({"grey.jpg", test::jpeg_bytes(grey, 90)});
  std::uint64_t seen = 0;
  for (const File& f : files) {
    test::write_bytes(dir / f.name, f.bytes);
    for (const bool dct : {true, false})
      for (const auto& [size, resize, random_resized] :
           {std::tuple{64, 73, true}, std::tuple{112, 128, true}, std::tuple{64, 73, false},
            std::tuple{160, 183, false}}) {
        ImageGeometry g;
        g.size = size;
        g.resize = resize;
        g.random_resized = random_resized;
        g.dct_scaling = dct;
        ImageGeometry whole = g;
        whole.region_decode = false;
        for (int k = 0; k < 12; ++k) {
          CropPosition crop;
          crop.random = true;
          crop.key = 1000 * static_cast<std::uint64_t>(k) + 17;
          crop.y = static_cast<float>(k % 4) / 3.f;
          crop.x = static_cast<float>(k / 4) / 2.f;
          ASSERT_EQ(decode(dir / f.name, g, crop), decode(dir / f.name, whole, crop))
              << f.name << " size " << size << " resize " << resize << " random_resized "
              << random_resized << " dct " << dct << " crop " << k;
          ++seen;
        }
      }
  }
  EXPECT_EQ(seen, 9u * 2 * 4 * 12);
}

TEST(ImageDecoder, HeadersClaimingHugeImagesAreRefusedBeforeDecoding) {
  const fs::path d = fs::temp_directory_path() / "kdflow_huge_headers";
  fs::create_directories(d);
  ImageDecoder decoder;
  std::vector<std::uint8_t> out(3 * 8 * 8);
  // A PNG whose IHDR claims 100000 x 100000 pixels (40 GB of RGB), with a valid CRC.
  std::vector<std::uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  const auto chunk = [&](const char* type, std::vector<std::uint8_t> body) {
    for (int s = 24; s >= 0; s -= 8) png.push_back(static_cast<std::uint8_t>(body.size() >> s));
    std::vector<std::uint8_t> typed(type, type + 4);
    typed.insert(typed.end(), body.begin(), body.end());
    png.insert(png.end(), typed.begin(), typed.end());
    const auto crc =
        static_cast<std::uint32_t>(crc32(0, typed.data(), static_cast<uInt>(typed.size())));
    for (int s = 24; s >= 0; s -= 8) png.push_back(static_cast<std::uint8_t>(crc >> s));
  };
  chunk("IHDR", {0, 1, 0x86, 0xa0, 0, 1, 0x86, 0xa0, 8, 2, 0, 0, 0});
  std::vector<std::uint8_t> idat(64); // libpng reads the header up to the first IDAT
  uLongf idat_size = static_cast<uLongf>(idat.size());
  const std::vector<std::uint8_t> row(16, 0);
  ASSERT_EQ(compress(idat.data(), &idat_size, row.data(), static_cast<uLong>(row.size())), Z_OK);
  idat.resize(idat_size);
  chunk("IDAT", idat);
  chunk("IEND", {});
  test::write_bytes(d / "huge.png", png);
  const std::string png_error = error_of([&] {
    decoder.decode((d / "huge.png").string(), {8, 8}, {}, out.data());
  });
  EXPECT_NE(png_error.find("huge.png"), std::string::npos) << png_error;
  EXPECT_NE(png_error.find("claims 100000x100000 pixels"), std::string::npos) << png_error;
  // A JPEG whose frame header (SOF) is patched to 60000 x 60000.
  auto jpeg = test::jpeg_bytes(test::smooth_pixels(16, 16, 3), 90);
  bool patched = false;
  for (std::size_t i = 0; i + 8 < jpeg.size() && !patched; ++i)
    if (jpeg[i] == 0xff && (jpeg[i + 1] == 0xc0 || jpeg[i + 1] == 0xc2)) {
      jpeg[i + 5] = 0xea; // height 0xea60 = 60000
      jpeg[i + 6] = 0x60;
      jpeg[i + 7] = 0xea; // width
      jpeg[i + 8] = 0x60;
      patched = true;
    }
  ASSERT_TRUE(patched);
  test::write_bytes(d / "huge.jpg", jpeg);
  const std::string jpeg_error = error_of([&] {
    decoder.decode((d / "huge.jpg").string(), {8, 8}, {}, out.data());
  });
  EXPECT_NE(jpeg_error.find("huge.jpg"), std::string::npos) << jpeg_error;
  EXPECT_NE(jpeg_error.find("claims 60000x60000 pixels"), std::string::npos) << jpeg_error;
}

TEST(ImageFolder, ListsClassesBySortedNameAndIgnoresOtherFiles) {
  const fs::path root = fresh_dir("list");
  test::write_image_folder(root, 3, 2, 12, 12);
  test::write_bytes(root / "train" / "class_z" / "notes.txt", {'h', 'i'});
  test::write_bytes(root / "train" / "class_z" / ".hidden.jpg", {'x'});
  test::write_bytes(root / "train" / "README", {'x'});
  const ImageFolder f = list_image_folder((root / "train").string());
  EXPECT_EQ(f.classes, (std::vector<std::string>{"class_x", "class_y", "class_z"}));
  ASSERT_EQ(f.files.size(), 6u);
  EXPECT_EQ(f.labels, (std::vector<std::uint16_t>{0, 0, 1, 1, 2, 2}));
  EXPECT_NE(f.files[0].find("class_x/img0.jpg"), std::string::npos);
  EXPECT_NE(f.files[5].find("class_z/img1.png"), std::string::npos);
  EXPECT_EQ(f.ignored, 2u); // notes.txt and README; hidden files are not counted
}

TEST(ImageFolder, DatasetDecodesBothSplitsOnDemand) {
  const fs::path root = fresh_dir("dataset");
  test::write_image_folder(root, 2, 3, 20, 30);
  const ImageGeometry g{16, 20};
  const Dataset train = Dataset::load("folder", root.string(), Split::train, g);
  const Dataset test = Dataset::load("folder", root.string(), Split::test, g);
  EXPECT_TRUE(train.decodes());
  EXPECT_TRUE(test.decodes()); // an evaluation holds the images it is at, not the split
  EXPECT_EQ(train.size(), 6u);
  EXPECT_EQ(train.classes(), 2);
  EXPECT_EQ(train.channels(), 3);
  EXPECT_EQ(train.height(), 16);
  EXPECT_EQ(train.width(), 16);
  EXPECT_EQ(train.class_names(), test.class_names());
  EXPECT_EQ(train.label(0), 0);
  EXPECT_EQ(train.label(5), 1);
  // Same files in both splits here: both give the centre crops.
  SampleScratch scratch, other;
  for (std::size_t i = 0; i < train.size(); ++i) {
    const auto s = train.sample(i, scratch);
    const auto t = test.sample(i, other);
    EXPECT_TRUE(std::equal(s.begin(), s.end(), t.begin(), t.end())) << i;
  }
  EXPECT_THROW((void)train.image(0), std::logic_error);
  EXPECT_THROW((void)test.image(0), std::logic_error);
}

TEST(ImageFolder, BadInputsAreOneLineNamingTheFileOrFolder) {
  const fs::path root = fresh_dir("bad");
  EXPECT_NE(error_of([&] {
              Dataset::load("folder", root.string(), Split::train);
            }).find((root / "train").string()),
            std::string::npos); // where kdflow looked
  fs::create_directories(root / "train");
  EXPECT_NE(
      error_of([&] { list_image_folder((root / "train").string()); }).find("no class folders"),
      std::string::npos);
  fs::create_directories(root / "train" / "cat");
  fs::create_directories(root / "train" / "dog");
  test::write_png(root / "train" / "cat" / "a.png", test::random_pixels(8, 8, 3, 1));
  const std::string empty = error_of([&] { list_image_folder((root / "train").string()); });
  EXPECT_NE(empty.find("dog"), std::string::npos);
  EXPECT_NE(empty.find("empty class folder"), std::string::npos);

  test::write_bytes(root / "train" / "dog" / "b.jpg", {'n', 'o', 't', ' ', 'j', 'p', 'g'});
  const std::string not_image = error_of([&] { list_image_folder((root / "train").string()); });
  EXPECT_NE(not_image.find("b.jpg"), std::string::npos);

  // Truncated JPEG and PNG pass the signature check and fail to decode, named.
  const auto jpeg = test::jpeg_bytes(test::smooth_pixels(32, 32, 1), 90);
  test::write_bytes(root / "train" / "dog" / "b.jpg",
                    std::vector<std::uint8_t>(
                        jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(jpeg.size() / 2)));
  const ImageFolder f = list_image_folder((root / "train").string());
  ImageDecoder decoder;
  std::vector<std::uint8_t> out(3 * 8 * 8);
  const std::string truncated = error_of([&] {
    decoder.decode(f.files[1], {8, 8}, {}, out.data());
  });
  EXPECT_NE(truncated.find("b.jpg"), std::string::npos);
  EXPECT_NE(truncated.find("undecodable JPEG"), std::string::npos);
  std::ifstream in(root / "train" / "cat" / "a.png", std::ios::binary);
  std::vector<std::uint8_t> png((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  png.resize(png.size() - 20); // IDAT cut short, IEND gone
  test::write_bytes(root / "train" / "cat" / "a.png", png);
  const std::string bad_png = error_of([&] { decoder.decode(f.files[0], {8, 8}, {}, out.data()); });
  EXPECT_NE(bad_png.find("a.png"), std::string::npos);
  EXPECT_NE(bad_png.find("undecodable PNG"), std::string::npos);
  // A file that vanished after listing.
  fs::remove(root / "train" / "cat" / "a.png");
  EXPECT_NE(error_of([&] {
              decoder.decode(f.files[0], {8, 8}, {}, out.data());
            }).find("a.png"),
            std::string::npos);
  // A FIFO where an image was listed, or listed under an image's name: refused, never a read that
  // blocks for a writer.
  ASSERT_EQ(::mkfifo((root / "train" / "cat" / "a.png").c_str(), 0644), 0);
  const std::string fifo = error_of([&] { decoder.decode(f.files[0], {8, 8}, {}, out.data()); });
  EXPECT_NE(fifo.find("a.png: not a regular file"), std::string::npos) << fifo;
  const std::string listed = error_of([&] { list_image_folder((root / "train").string()); });
  EXPECT_NE(listed.find("a.png: not a regular file"), std::string::npos) << listed;
  fs::remove(root / "train" / "cat" / "a.png");
  // Geometry: resize below the crop.
  EXPECT_NE(error_of([&] {
              Dataset::load("folder", root.string(), Split::train, {32, 16});
            }).find("data.resize"),
            std::string::npos);
  // A test split that is missing names both places looked.
  const std::string no_test =
      error_of([&] { Dataset::load("folder", root.string(), Split::test); });
  EXPECT_NE(no_test.find("val"), std::string::npos);
  EXPECT_NE(no_test.find("test"), std::string::npos);
}

} // namespace
} // namespace kdflow
