// Paths to read, resolved before reading: every kind of wrong path is one InputError naming the
// path and the reason, and a file that must stay in its folder stays there after its links.
#include "../test_scratch.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

namespace kdflow {
namespace {

namespace fs = std::filesystem;

fs::path fresh(const std::string& name) {
  const fs::path dir = fs::path(kdflow_test::process_scratch("kdflow_input_file_")) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "<accepted>";
}

void expect_refused(const std::function<void()>& f, const fs::path& path,
                    const std::string& reason) {
  const std::string e = refusal(f);
  EXPECT_NE(e.find(path.string()), std::string::npos) << e;
  EXPECT_NE(e.find(reason), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(InputFile, EveryWrongKindOfPathIsOneLineNamingIt) {
  const fs::path dir = fresh("kinds");
  std::ofstream(dir / "file") << "twelve bytes";
  fs::create_directory(dir / "folder");
  fs::create_symlink(dir / "loop_b", dir / "loop_a");
  fs::create_symlink(dir / "loop_a", dir / "loop_b");
  fs::create_symlink(dir / "gone", dir / "dangling");
  fs::create_symlink(dir / "file", dir / "link");

  EXPECT_EQ(check_input_file(dir / "file", "x"), 12u);
  EXPECT_EQ(check_input_file(dir / "link", "x"), 12u); // a link to a file is the file
  EXPECT_EQ(read_input_file(dir / "link", "x"), "twelve bytes");
  expect_refused([&] { check_input_file(dir / "folder", "teacher.model"); }, dir / "folder",
                 "a folder, not a file");
  expect_refused([&] { check_input_file(dir / "loop_a", "teacher.model"); }, dir / "loop_a",
                 "a loop of symbolic links");
  expect_refused([&] { check_input_file(dir / "dangling", "x"); }, dir / "dangling",
                 "a symbolic link to nothing");
  expect_refused([&] { check_input_file(dir / "none", "x"); }, dir / "none", "no such file");
  expect_refused([&] { check_input_file(dir / "file" / "under", "x"); }, dir / "file" / "under",
                 "not a folder");
  expect_refused([&] { check_input_file("/dev/zero", "x"); }, "/dev/zero", "a device");
  expect_refused([&] { check_input_file(dir / "file", "x", 11); }, dir / "file", "12 bytes");
  expect_refused([&] { check_input_folder(dir / "file", "data.path"); }, dir / "file",
                 "not a folder");
  expect_refused([&] { check_input_folder(dir / "loop_a", "data.path"); }, dir / "loop_a",
                 "a loop of symbolic links");
  check_input_folder(dir / "folder", "data.path");
  // What names it comes first.
  EXPECT_EQ(
      refusal([&] { check_input_file(dir / "folder", "teacher.model"); }).rfind("teacher.model", 0),
      0u);
}

TEST(InputFile, ConfinedFilesStayInTheirFolderAfterEveryLink) {
  const fs::path root = fresh("confined"), model = root / "model", outside = root / "outside";
  fs::create_directories(model / "sub");
  fs::create_directories(outside);
  std::ofstream(model / "weights.bin") << "w";
  std::ofstream(model / "sub" / "more.bin") << "m";
  std::ofstream(outside / "secret.bin") << "s";
  fs::create_symlink(outside / "secret.bin", model / "to_file.bin");
  fs::create_symlink(outside, model / "to_folder");
  fs::create_symlink("sub/more.bin", model / "inner.bin"); // a link that stays inside
  fs::create_symlink("/etc/passwd", model / "passwd");

  EXPECT_EQ(confined_file(model, "weights.bin", "w"), fs::canonical(model / "weights.bin"));
  EXPECT_EQ(confined_file(model, "sub/more.bin", "w"), fs::canonical(model / "sub/more.bin"));
  EXPECT_EQ(confined_file(model, "inner.bin", "w"), fs::canonical(model / "sub/more.bin"));
  for (const char* out : {"to_file.bin", "to_folder/secret.bin", "passwd"})
    expect_refused([&] { (void)confined_file(model, out, "m.onnx: tensor 'w': external data"); },
                   model / out, "leads out of the model's folder");
  for (const char* bad : {"../outside/secret.bin", "/etc/passwd", ""})
    expect_refused([&] { (void)confined_file(model, bad, "x"); }, model / bad,
                   "not a file inside the model's folder");
  expect_refused([&] { (void)confined_file(model, ".", "x"); }, model / ".",
                 "a folder, not a file");
}

TEST(InputFile, OutputPathsThroughLoopsOrFilesAreRefused) {
  const fs::path dir = fresh("outputs");
  std::ofstream(dir / "file") << "f";
  fs::create_symlink(dir / "loop_b", dir / "loop_a");
  fs::create_symlink(dir / "loop_a", dir / "loop_b");
  fs::create_symlink(dir / "gone", dir / "dangling");
  check_output_path(dir / "new" / "run", "--out"); // folders made later
  expect_refused([&] { check_output_path(dir / "dangling" / "run", "--out"); },
                 dir / "dangling" / "run", "is a symbolic link to nothing");
  expect_refused([&] { check_input_folder(dir / "none", "data.path"); }, dir / "none",
                 "no such folder");
  expect_refused([&] { check_output_path(dir / "loop_a", "--out"); }, dir / "loop_a",
                 "a loop of symbolic links");
  expect_refused([&] { check_output_path(dir / "loop_a" / "run", "--out"); },
                 dir / "loop_a" / "run", "a loop of symbolic links");
  expect_refused([&] { check_output_path(dir / "file" / "run", "--out"); }, dir / "file" / "run",
                 "is not a folder");
}

} // namespace
} // namespace kdflow
