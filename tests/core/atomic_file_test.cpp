// Atomic and checked files: round trips, every kind of damage recognised, and a writer killed with
// SIGKILL at random moments never leaves the target unreadable.
#include "../test_scratch.hpp"

#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/error.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

namespace kdflow {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = kdflow_test::process_scratch("kdflow_atomic_");
  fs::create_directories(dir);
  fs::remove(dir / name);
  return dir / name;
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

TEST(AtomicFile, CheckedRoundTrip) {
  const fs::path p = scratch("round.ckpt");
  const auto data = pattern(100000, 1);
  write_checked_file(p, data);
  EXPECT_EQ(read_checked_file(p, "checkpoint"), data);
  write_checked_file(p, pattern(10, 2)); // replaces
  EXPECT_EQ(read_checked_file(p, "checkpoint"), pattern(10, 2));
  for (const auto& e : fs::directory_iterator(p.parent_path()))
    EXPECT_FALSE(is_atomic_temporary(e.path())) << e.path(); // no temporary left behind
}

TEST(AtomicFile, DamageIsAnInputErrorNamingTheFile) {
  const fs::path p = scratch("damaged.ckpt");
  const auto data = pattern(4096, 3);
  auto expect_rejected = [&](const std::string& why) {
    try {
      (void)read_checked_file(p, "checkpoint");
      ADD_FAILURE() << why << ": accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    }
  };
  write_checked_file(p, data);
  fs::resize_file(p, fs::file_size(p) - 1);
  expect_rejected("truncated");
  write_checked_file(p, data);
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x01');
    f.seekp(101);
    f.put('\x02');
  }
  expect_rejected("bit flips");
  write_file_atomic(p, std::string_view("plain text, not a checked file"));
  expect_rejected("foreign");
  fs::remove(p);
  expect_rejected("missing");
}

TEST(AtomicFile, SigkillDuringWritesNeverLeavesATornFile) {
  const fs::path p = scratch("killed.ckpt");
  write_checked_file(p, pattern(1 << 20, 0));
  std::mt19937 rng(1234);
  for (int round = 0; round < 20; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // Rewrite the file forever with alternating contents (1 MiB each).
      for (unsigned i = 1;; ++i) write_checked_file(p, pattern(1 << 20, i % 2));
    }
    std::this_thread::sleep_for(
        std::chrono::microseconds(std::uniform_int_distribution(0, 50000)(rng)));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    const auto got = read_checked_file(p, "checkpoint"); // throws if torn
    EXPECT_TRUE(got == pattern(1 << 20, 0) || got == pattern(1 << 20, 1));
  }
  // Killed writers leave temporaries: recognisable, so readers skip them.
  for (const auto& e : fs::directory_iterator(p.parent_path())) {
    if (e.path() != p && e.path().filename().string().starts_with(p.filename().string())) {
      EXPECT_TRUE(is_atomic_temporary(e.path())) << e.path();
    }
  }
}

} // namespace
} // namespace kdflow
