// TensorBoard's event files: CRC-32C against its published check values, and a file's records in
// TFRecord framing, each length and event checked by its masked CRC (TensorBoard's own reader reads
// whole runs in Train.TensorBoardEvents* and Dist.TensorBoardEvents*).
#include "tensorboard.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace kdflow::app {
namespace {

std::span<const std::byte> bytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

std::uint64_t le(const std::string& s, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
  return v;
}

TEST(TensorBoard, Crc32cIsCastagnolisAndRecordsAreFramedAsTFRecords) {
  EXPECT_EQ(crc32c(bytes("123456789")), 0xE3069283U);           // the CRC catalogue's check value
  EXPECT_EQ(crc32c(bytes(std::string(32, '\0'))), 0x8A9136AAU); // RFC 3720, B.4
  EXPECT_EQ(crc32c(bytes(std::string(32, '\xff'))), 0x62A8AB43U);
  const std::uint32_t c = crc32c(bytes("123456789"));
  EXPECT_EQ(masked_crc32c(bytes("123456789")), ((c >> 15) | (c << 17)) + 0xa282ead8U);

  // A fresh folder (mkdtemp; POSIX calls to clear it: libtorch exports a
  // std::filesystem::remove_all of its own, which crashes here).
  std::string name =
      (std::filesystem::temp_directory_path() / "kdflow_tensorboard.XXXXXX").string();
  ASSERT_NE(::mkdtemp(name.data()), nullptr);
  const std::filesystem::path folder = name;
  std::filesystem::path first, second;
  {
    EventWriter w(folder);
    first = w.path();
    w.scalar("train/loss", 5, 0.25);
    w.text("config", 0, "[train]\nlr = 0.1\n");
    w.flush();
    EventWriter again(folder); // a second start: a file of its own
    second = again.path();
  }
  EXPECT_NE(first, second);
  // TensorBoard reads the files in name order, and each start's START event purges the steps
  // after it from the files read before: every new file sorts after those already there, even
  // one from a later second (another writer's clock) or a pid of more digits in the same second.
  EXPECT_LT(first.filename().string(), second.filename().string());
  const std::filesystem::path later =
      folder /
      ("events.out.tfevents." + std::to_string(std::time(nullptr) + 1000) + ".elsewhere.100000.0");
  std::ofstream(later) << "x";
  std::filesystem::path third;
  {
    EventWriter w(folder);
    third = w.path();
  }
  EXPECT_GT(third.filename().string(), later.filename().string());
  ::unlink(later.c_str());
  ::unlink(third.c_str());
  EXPECT_EQ(first.filename().string().rfind("events.out.tfevents.", 0), 0u) << first;
  std::ifstream in(first, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t at = 0;
  int records = 0;
  while (at < file.size()) {
    ASSERT_LE(at + 12, file.size());
    const std::string length = file.substr(at, 8);
    ASSERT_EQ(le(file, at + 8, 4), masked_crc32c(bytes(length))) << "record " << records;
    const std::uint64_t n = le(file, at, 8);
    ASSERT_LE(at + 16 + n, file.size());
    const std::string event = file.substr(at + 12, n);
    ASSERT_EQ(le(file, at + 12 + n, 4), masked_crc32c(bytes(event))) << "record " << records;
    if (records == 0) {
      EXPECT_NE(event.find("brain.Event:2"), std::string::npos);
    } else if (records == 1) {
      EXPECT_NE(event.find("train/loss"), std::string::npos);
    }
    at += 16 + n;
    ++records;
  }
  EXPECT_EQ(records, 3) << "the version, the scalar, the text";
  ::unlink(first.c_str());
  ::unlink(second.c_str());
  ::rmdir(folder.c_str());
}

} // namespace
} // namespace kdflow::app
