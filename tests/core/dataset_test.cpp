// Dataset readers on the real Fashion-MNIST (Debian's dataset-fashion-mnist) and on CIFAR and IDX
// files the test writes, including every bad-input case: each an InputError naming the file.
#include "input_error.hpp"
#include "kdflow/core/dataset.hpp"
#include "kdflow/core/error.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <numeric>

namespace kdflow {
namespace {

namespace fs = std::filesystem;
const std::string kFashion = "/usr/share/datasets/fashion-mnist";

using test::error_of;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kdflow_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::vector<std::uint8_t>& bytes) {
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::uint8_t> be32(std::vector<std::uint32_t> words) {
  std::vector<std::uint8_t> out;
  for (auto w : words)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(w >> s));
  return out;
}

TEST(FashionMnist, RealFilesHaveTheKnownCountsAndFirstRecord) {
  const Dataset train = Dataset::load("fashion-mnist", kFashion, Split::train);
  const Dataset test = Dataset::load("fashion-mnist", kFashion, Split::test);
  EXPECT_EQ(train.size(), 60000u);
  EXPECT_EQ(test.size(), 10000u);
  EXPECT_EQ(train.channels(), 1);
  EXPECT_EQ(train.height(), 28);
  EXPECT_EQ(train.width(), 28);
  EXPECT_EQ(train.classes(), 10);
  std::array<int, 10> histogram{};
  for (std::size_t i = 0; i < train.size(); ++i)
    ++histogram[static_cast<std::size_t>(train.label(i))];
  for (const int n : histogram) EXPECT_EQ(n, 6000);
  // The first training record: an ankle boot (9), 351 zero pixels, pixel sum 76247.
  EXPECT_EQ(train.label(0), 9);
  const auto img = train.image(0);
  EXPECT_EQ(std::count(img.begin(), img.end(), 0), 351);
  EXPECT_EQ(std::accumulate(img.begin(), img.end(), 0L), 76247L);
  EXPECT_EQ(test.label(0), 9);
}

TEST(Idx, BadFilesAreNamed) {
  const fs::path d = fresh_dir("idx");
  const auto images = [&](std::uint32_t magic, std::uint32_t n, std::size_t pixels) {
    auto b = be32({magic, n, 2, 2});
    b.resize(b.size() + pixels, 7);
    write(d / "train-images-idx3-ubyte", b);
  };
  const auto labels = [&](std::uint32_t n, std::vector<std::uint8_t> values) {
    auto b = be32({0x801, n});
    b.insert(b.end(), values.begin(), values.end());
    write(d / "train-labels-idx1-ubyte", b);
  };
  images(0x803, 3, 12);
  labels(3, {1, 2, 3});
  EXPECT_EQ(Dataset::load("mnist", d.string(), Split::train).size(),
            3u); // raw (not .gz) files work
  images(0x802, 3, 12);
  EXPECT_NE(error_of([&] {
              Dataset::load("mnist", d.string(), Split::train);
            }).find("not an IDX image file"),
            std::string::npos);
  images(0x803, 3, 11);
  EXPECT_NE(error_of([&] { Dataset::load("mnist", d.string(), Split::train); }).find("truncated"),
            std::string::npos);
  // Headers whose n x h x w wraps in 64 bits (4 x 2^31 x 2^31 = 2^64: "no pixels"), or has a zero
  // side, are refused before any sample is read.
  for (const auto& [h, w] :
       {std::pair<std::uint32_t, std::uint32_t>{0x80000000u, 0x80000000u}, {0, 5}, {70000, 1}}) {
    write(d / "train-images-idx3-ubyte", be32({0x803, 4, h, w}));
    labels(4, {1, 2, 3, 4});
    const std::string e = error_of([&] { Dataset::load("mnist", d.string(), Split::train); });
    EXPECT_NE(e.find("train-images-idx3-ubyte: images of"), std::string::npos) << e;
  }
  images(0x803, 3, 12);
  labels(3, {1, 12, 3});
  const std::string bad_label = error_of([&] { Dataset::load("mnist", d.string(), Split::train); });
  EXPECT_NE(bad_label.find("record 1 has label 12"), std::string::npos) << bad_label;
  EXPECT_NE(bad_label.find("train-labels-idx1-ubyte"), std::string::npos);
  labels(2, {1, 2});
  EXPECT_NE(error_of([&] {
              Dataset::load("mnist", d.string(), Split::train);
            }).find("2 labels for 3 images"),
            std::string::npos);
  // A corrupt .gz next to nothing else.
  const fs::path g = fresh_dir("idx_gz");
  write(g / "train-images-idx3-ubyte.gz", {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3, 4});
  write(g / "train-labels-idx1-ubyte", be32({0x801, 0}));
  EXPECT_NE(error_of([&] {
              Dataset::load("mnist", g.string(), Split::train);
            }).find("train-images-idx3-ubyte.gz"),
            std::string::npos);
  // Where kdflow looked.
  EXPECT_NE(error_of([&] {
              Dataset::load("mnist", fresh_dir("empty").string(), Split::test);
            }).find("t10k-images-idx3-ubyte.gz"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Dataset::load("mnist", "/no/such/folder", Split::test);
            }).find("/no/such/folder"),
            std::string::npos);
}

std::vector<std::uint8_t> cifar_records(int n, int label_bytes, int first_label) {
  std::vector<std::uint8_t> b;
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < label_bytes; ++k) b.push_back(static_cast<std::uint8_t>(first_label + r));
    for (int p = 0; p < 3072; ++p) b.push_back(static_cast<std::uint8_t>((r * 31 + p) & 0xff));
  }
  return b;
}

TEST(DatasetFiles, AGzipBombOrAnOversizeFileIsRefusedBeforeItFillsMemory) {
  const fs::path d = fresh_dir("bomb");
  const std::size_t limit = 1 << 20;
  // 3 MiB of zeros inflate from a few KB.
  const std::string gz = (d / "train-images-idx3-ubyte.gz").string();
  gzFile f = gzopen(gz.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  const std::vector<char> zeros(3 << 20, 0);
  ASSERT_EQ(gzwrite(f, zeros.data(), static_cast<unsigned>(zeros.size())),
            static_cast<int>(zeros.size()));
  gzclose(f);
  ASSERT_LT(fs::file_size(gz), limit / 16);
  const std::string bomb = error_of([&] { read_file_maybe_gz(gz, limit); });
  EXPECT_NE(bomb.find(gz), std::string::npos) << bomb;
  EXPECT_NE(bomb.find("more than 1048576 bytes"), std::string::npos) << bomb;
  const fs::path plain = d / "big";
  write(plain, std::vector<std::uint8_t>(limit + 1, 1));
  EXPECT_NE(error_of([&] { read_file_maybe_gz(plain.string(), limit); }).find("big"),
            std::string::npos);
  write(plain, std::vector<std::uint8_t>(limit, 1)); // at the limit: read
  EXPECT_EQ(read_file_maybe_gz(plain.string(), limit).size(), limit);
}

TEST(Cifar, ReadsRecordsAndRejectsBadOnes) {
  const fs::path d = fresh_dir("cifar10");
  for (int k = 1; k <= 5; ++k)
    write(d / ("data_batch_" + std::to_string(k) + ".bin"), cifar_records(2, 1, k));
  write(d / "test_batch.bin", cifar_records(3, 1, 0));
  const Dataset train = Dataset::load("cifar10", d.string(), Split::train);
  EXPECT_EQ(train.size(), 10u);
  EXPECT_EQ(train.channels(), 3);
  EXPECT_EQ(train.label(0), 1);
  EXPECT_EQ(train.label(9), 6);
  EXPECT_EQ(train.image(1)[5], static_cast<std::uint8_t>((31 + 5) & 0xff));
  EXPECT_EQ(Dataset::load("cifar10", d.string(), Split::test).size(), 3u);
  auto truncated = cifar_records(2, 1, 0);
  truncated.pop_back();
  write(d / "test_batch.bin", truncated);
  EXPECT_NE(
      error_of([&] { Dataset::load("cifar10", d.string(), Split::test); }).find("test_batch.bin"),
      std::string::npos);
  write(d / "test_batch.bin", cifar_records(2, 1, 9)); // labels 9, 10
  EXPECT_NE(error_of([&] {
              Dataset::load("cifar10", d.string(), Split::test);
            }).find("record 1 has label 10"),
            std::string::npos);
  fs::remove(d / "data_batch_3.bin");
  EXPECT_NE(error_of([&] {
              Dataset::load("cifar10", d.string(), Split::train);
            }).find("data_batch_3.bin"),
            std::string::npos);

  const fs::path h = fresh_dir("cifar100");
  write(h / "train.bin", cifar_records(4, 2, 96));
  EXPECT_EQ(Dataset::load("cifar100", h.string(), Split::train).label(3), 99);
  write(h / "train.bin", cifar_records(5, 2, 96));
  EXPECT_NE(
      error_of([&] { Dataset::load("cifar100", h.string(), Split::train); }).find("label 100"),
      std::string::npos);
}

// The registry is the one list of formats: Dataset::load knows exactly its names, each with a
// normalization for every channel it reads, and refuses any other name, listing them.
TEST(DatasetRegistry, LoadKnowsExactlyTheRegisteredFormats) {
  const std::vector<std::string> names = dataset_names();
  ASSERT_FALSE(names.empty());
  for (const auto& name : names) {
    const DatasetFormat& f = dataset_format(name);
    EXPECT_EQ(f.name, name);
    EXPECT_FALSE(f.normalization.mean.empty()) << name;
    EXPECT_EQ(f.normalization.mean.size(), f.normalization.std.size()) << name;
    for (const float s : f.normalization.std) EXPECT_GT(s, 0.f) << name;
  }
  const std::string error =
      test::error_of([] { (void)Dataset::load("svhn", "/nonexistent", Split::train); });
  EXPECT_NE(error.find("data.dataset = 'svhn'"), std::string::npos) << error;
  for (const auto& name : names) EXPECT_NE(error.find(name), std::string::npos) << error;
}

} // namespace
} // namespace kdflow
