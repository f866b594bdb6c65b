// The teacher-output cache (kd.cache): what it returns for a sample is what was stored, every
// logit exactly, or under top-K the K largest exactly and the rest's probability mass at the
// temperature within 1e-6; concurrent writers and readers see whole entries, each sample once.
#include "kdflow/core/teacher_cache.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kdflow {
namespace {

// Logits of a teacher's kind: a few large, the rest spread, some ties.
std::vector<float> logits_for(std::uint64_t id, std::size_t classes) {
  std::mt19937_64 rng(id * 7919 + 13);
  std::normal_distribution<float> noise(0.f, 3.f);
  std::vector<float> out(classes);
  for (auto& v : out) v = noise(rng);
  out[id % classes] += 12.f;
  if (classes > 3) out[2] = out[3]; // a tie
  return out;
}

std::vector<double> softmax(const std::vector<float>& z, double t) {
  double top = -HUGE_VAL;
  for (float v : z) top = std::max(top, v / t);
  std::vector<double> p(z.size());
  double sum = 0;
  for (std::size_t i = 0; i < z.size(); ++i) sum += p[i] = std::exp(z[i] / t - top);
  for (auto& v : p) v /= sum;
  return p;
}

TEST(TeacherOutputCache, KeepsEveryLogitExactly) {
  TeacherOutputCache cache(50, 10, 0, 4.0);
  EXPECT_TRUE(cache.full());
  for (std::uint64_t id = 0; id < 50; ++id) {
    EXPECT_FALSE(cache.has(id));
    cache.store(id, logits_for(id, 10));
  }
  EXPECT_EQ(cache.stored(), 50u);
  std::vector<float> out(10);
  for (std::uint64_t id = 0; id < 50; ++id) {
    ASSERT_TRUE(cache.has(id));
    cache.load(id, out);
    EXPECT_EQ(out, logits_for(id, 10)) << "sample " << id;
  }
}

TEST(TeacherOutputCache, TopKKeepsTheLargestExactlyAndTheRestsMassAtTheTemperature) {
  for (const std::size_t classes : {10, 100, 1000}) {
    for (const std::size_t k : {1, 5, 9}) {
      for (const double t : {1.0, 4.0, 0.5}) {
        TeacherOutputCache cache(20, classes, k, t);
        ASSERT_EQ(cache.kept(), k);
        std::vector<float> out(classes);
        for (std::uint64_t id = 0; id < 20; ++id) {
          const auto z = logits_for(id, classes);
          cache.store(id, z);
          cache.load(id, out);
          // The K largest (ties to the lower class), bit for bit; every other class one value.
          std::vector<std::size_t> order(classes);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(),
                           [&](std::size_t a, std::size_t b) { return z[a] > z[b]; });
          for (std::size_t i = 0; i < k; ++i)
            EXPECT_EQ(out[order[i]], z[order[i]]) << classes << " classes, k " << k;
          for (std::size_t i = k + 1; i < classes; ++i) EXPECT_EQ(out[order[i]], out[order[k]]);
          // At the temperature the rest's mass is the teacher's, shared equally.
          const auto p = softmax(z, t), q = softmax(out, t);
          double rest_p = 0, rest_q = 0;
          for (std::size_t i = k; i < classes; ++i) {
            rest_p += p[order[i]];
            rest_q += q[order[i]];
          }
          EXPECT_NEAR(rest_q, rest_p, 1e-6) << classes << " classes, k " << k << ", T " << t;
          for (std::size_t i = 0; i < k; ++i) EXPECT_NEAR(q[order[i]], p[order[i]], 1e-6);
        }
      }
    }
  }
}

TEST(TeacherOutputCache, ARestWithNoMassLeftStaysFinite) {
  TeacherOutputCache cache(1, 4, 1, 1.0);
  cache.store(0, std::vector<float>{1e4f, 0.f, -1e4f, 0.f});
  std::vector<float> out(4);
  cache.load(0, out);
  EXPECT_EQ(out[0], 1e4f);
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
  EXPECT_LT(softmax(out, 1.0)[1], 1e-30);
}

TEST(TeacherOutputCache, TheFirstStoreWinsAndIdsPastTheSamplesAreRefused) {
  TeacherOutputCache cache(3, 2, 0, 1.0);
  cache.store(1, std::vector<float>{1.f, 2.f});
  cache.store(1, std::vector<float>{5.f, 6.f});
  std::vector<float> out(2);
  cache.load(1, out);
  EXPECT_EQ(out, (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(cache.stored(), 1u);
  EXPECT_FALSE(cache.has(3));
  EXPECT_THROW(cache.store(3, std::vector<float>{0.f, 0.f}), std::out_of_range);
  EXPECT_THROW(TeacherOutputCache(0, 2, 0, 1.0), std::invalid_argument);
  EXPECT_THROW(TeacherOutputCache(2, 2, 0, 0.0), std::invalid_argument);
}

// Replicas store and read at once, each sample offered by several writers: every entry read is
// whole (the checksum of its sample), and every sample is kept once.
TEST(TeacherOutputCache, ConcurrentWritersAndReadersSeeWholeEntries) {
  constexpr std::size_t kSamples = 4000, kClasses = 16;
  for (const std::size_t k : {0, 4}) {
    TeacherOutputCache cache(kSamples, kClasses, k, 2.0);
    std::atomic<std::size_t> bad{0}, seen{0};
    std::vector<std::thread> threads;
    for (int w = 0; w < 4; ++w)
      threads.emplace_back([&, w] {
        std::vector<float> out(kClasses);
        for (std::size_t n = 0; n < kSamples; ++n) {
          const std::uint64_t id = (n * 7 + static_cast<std::size_t>(w) * 1000) % kSamples;
          if (cache.has(id)) {
            cache.load(id, out);
            seen.fetch_add(1);
            const auto z = logits_for(id, kClasses);
            const auto top = std::max_element(z.begin(), z.end()) - z.begin();
            if (out[static_cast<std::size_t>(top)] != z[static_cast<std::size_t>(top)]) ++bad;
          } else {
            cache.store(id, logits_for(id, kClasses));
          }
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(bad.load(), 0u);
    EXPECT_GT(seen.load(), 0u);
    EXPECT_EQ(cache.stored(), kSamples);
  }
}

} // namespace
} // namespace kdflow
