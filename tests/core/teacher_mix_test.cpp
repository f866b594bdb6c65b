// TeacherMix against its definition computed in long double: the softmax at T of the mix is the
// weighted mean of the teachers' softmaxes at T, on fresh random logits each run.
#include "kdflow/core/teacher_mix.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

namespace kdflow {
namespace {

std::vector<long double> softmax(const float* z, std::size_t n, double t) {
  long double top = -INFINITY, sum = 0;
  for (std::size_t c = 0; c < n; ++c) top = std::max<long double>(top, z[c] / t);
  std::vector<long double> p(n);
  for (std::size_t c = 0; c < n; ++c) sum += p[c] = std::exp(z[c] / t - top);
  for (auto& v : p) v /= sum;
  return p;
}

TEST(TeacherMix, ItsSoftmaxIsTheWeightedMeanOfTheTeachers) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.f, 6.f);
  constexpr std::size_t kRows = 17, kClasses = 10;
  const std::vector<double> weights = {1.0, 2.5, 0.5};
  for (const double t : {1.0, 4.0, 0.5}) {
    std::vector<std::vector<float>> logits(weights.size(), std::vector<float>(kRows * kClasses));
    for (auto& l : logits)
      for (float& v : l) v = normal(rng);
    logits[1][3] = 4000.f; // far beyond exp's range at T: still finite and exact
    std::vector<const float*> in;
    for (const auto& l : logits) in.push_back(l.data());
    std::vector<float> out(kRows * kClasses);
    TeacherMix(weights, t)(in, kRows, kClasses, out.data());
    double sum_w = 0;
    for (const double w : weights) sum_w += w;
    for (std::size_t r = 0; r < kRows; ++r) {
      const auto got = softmax(out.data() + r * kClasses, kClasses, t);
      std::vector<long double> want(kClasses, 0);
      for (std::size_t k = 0; k < weights.size(); ++k) {
        const auto p = softmax(logits[k].data() + r * kClasses, kClasses, t);
        for (std::size_t c = 0; c < kClasses; ++c) want[c] += weights[k] / sum_w * p[c];
      }
      for (std::size_t c = 0; c < kClasses; ++c)
        EXPECT_NEAR(static_cast<double>(got[c]), static_cast<double>(want[c]), 1e-6)
            << "T " << t << " row " << r << " class " << c;
      // The target is a log-distribution at T: exp(out / T) sums to 1.
      long double mass = 0;
      for (std::size_t c = 0; c < kClasses; ++c) mass += std::exp(out[r * kClasses + c] / t);
      EXPECT_NEAR(static_cast<double>(mass), 1.0, 1e-5);
    }
  }
}

TEST(TeacherMix, OneTeacherIsItsOwnDistribution) {
  const std::vector<float> z = {1.f, -2.f, 0.5f, 3.f};
  const float* in[] = {z.data()};
  std::vector<float> out(4);
  TeacherMix({3.0}, 2.0)(in, 1, 4, out.data());
  const auto want = softmax(z.data(), 4, 2.0), got = softmax(out.data(), 4, 2.0);
  for (std::size_t c = 0; c < 4; ++c)
    EXPECT_NEAR(static_cast<double>(got[c]), static_cast<double>(want[c]), 1e-7);
}

TEST(TeacherMix, ANonFiniteTeacherRowStaysNonFiniteAndOthersAreUntouched) {
  std::vector<float> a = {1.f, 2.f, 3.f, 0.f, 1.f, 2.f}, b = {0.f, 0.f, 1.f, 2.f, 2.f, 2.f};
  a[1] = NAN; // row 0
  const float* in[] = {a.data(), b.data()};
  std::vector<float> out(6);
  TeacherMix({1.0, 1.0}, 1.0)(in, 2, 3, out.data());
  for (std::size_t c = 0; c < 3; ++c) {
    EXPECT_FALSE(std::isfinite(out[c])) << c;
    EXPECT_TRUE(std::isfinite(out[3 + c])) << c;
  }
}

TEST(TeacherMix, RefusesWeightsAndTemperaturesThatMeanNothing) {
  EXPECT_THROW(TeacherMix({}, 1.0), std::invalid_argument);
  EXPECT_THROW(TeacherMix({1.0, 0.0}, 1.0), std::invalid_argument);
  EXPECT_THROW(TeacherMix({1.0, -1.0}, 1.0), std::invalid_argument);
  EXPECT_THROW(TeacherMix({1.0}, 0.0), std::invalid_argument);
  const std::vector<float> z(3, 0.f);
  const float* in[] = {z.data()};
  std::vector<float> out(3);
  EXPECT_THROW(TeacherMix({1.0, 1.0}, 1.0)(in, 1, 3, out.data()), std::invalid_argument);
}

} // namespace
} // namespace kdflow
