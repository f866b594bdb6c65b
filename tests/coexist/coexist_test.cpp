// The PyPI LibTorch carries its own oneDNN (statically linked, hidden symbols); the teacher uses
// the PyPI oneDNN 3.x with the TBB runtime. This proves both work in one process: each convolution
// runs on its own library, one after the other and concurrently, and each matches the plain
// reference.
#include "conv_impls.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

namespace kdflow::coexist {
namespace {

std::vector<float> random_vector(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// max|a - ref| / max|ref|: the normalized error used across kdflow's cross-checks.
double normalized_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - ref[i]));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  return diff / scale;
}

constexpr double kTolerance = 1e-4;

class Coexist : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Coexist, BothOneDnnCopiesMatchTheReference) {
  const ConvCase cc = GetParam();
  std::mt19937 rng(std::random_device{}()); // fresh data every run
  const auto src = random_vector(size_t(cc.n) * cc.c * cc.h * cc.w, rng);
  const auto wei = random_vector(size_t(cc.k) * cc.c * cc.r * cc.r, rng);
  const auto ref = reference_conv(cc, src, wei);

  ASSERT_TRUE(torch_has_mkldnn()) << "LibTorch was built without its oneDNN";
  EXPECT_EQ(onednn_identity().substr(0, 2), "3.");
  EXPECT_NE(onednn_identity().find("TBB"), std::string::npos) << onednn_identity();

  EXPECT_LE(normalized_error(torch_mkldnn_conv(cc, src, wei), ref), kTolerance);
  EXPECT_LE(normalized_error(onednn_conv(cc, src, wei), ref), kTolerance);

  // Both at once, from two threads, several times: shared state (caches, thread pools, JIT code
  // buffers) of either library must not be disturbed by the other's.
  std::vector<float> from_torch, from_teacher;
  double torch_err = 0, teacher_err = 0;
  std::thread a([&] {
    for (int i = 0; i < 5; ++i)
      torch_err = std::max(torch_err, normalized_error(torch_mkldnn_conv(cc, src, wei), ref));
  });
  std::thread b([&] {
    for (int i = 0; i < 5; ++i)
      teacher_err = std::max(teacher_err, normalized_error(onednn_conv(cc, src, wei), ref));
  });
  a.join();
  b.join();
  EXPECT_LE(torch_err, kTolerance);
  EXPECT_LE(teacher_err, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Coexist,
                         ::testing::Values(ConvCase{2, 3, 32, 32, 16, 3, 1, 1},
                                           ConvCase{4, 16, 28, 28, 32, 3, 2, 1},
                                           ConvCase{1, 8, 15, 17, 8, 5, 1, 2}));

} // namespace
} // namespace kdflow::coexist
