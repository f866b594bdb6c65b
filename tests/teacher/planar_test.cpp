// kdflow's quantizing reorder of a network's image input (plain NCHW f32, 1-4 channels) into
// channels-last u8 and s8 (cpu_teacher/ops/planar.cpp) against oneDNN's reorder, byte for byte.
#include "ops/planar.hpp"

#include <gtest/gtest.h>
#include <oneapi/tbb/task_arena.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace kdflow::teacher {
namespace {

using tag = memory::format_tag;

// The bytes oneDNN's quantizing reorder writes (the value divided by `scale`).
std::vector<std::byte> onednn_reorder(const std::vector<float>& x, const memory::desc& from,
                                      const memory::desc& to, float scale) {
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  std::vector<std::byte> y(to.get_size());
  dnnl::primitive_attr attr;
  attr.set_scales_mask(DNNL_ARG_DST, 0);
  const dnnl::reorder r(dnnl::reorder::primitive_desc(eng, from, eng, to, attr));
  const memory src(from, eng, const_cast<float*>(x.data()));
  const memory dst(to, eng, y.data());
  const memory s({{1}, dt::f32, tag::a}, eng, &scale);
  r.execute(stream,
            {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}, {DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, s}});
  stream.wait();
  return y;
}

TEST(TeacherPlanar, ImageInputTurnedChannelsLastAsOnednnsReorder) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 3.f);
  int ran = 0;
  // 91 pixels: a 16-pixel group's tail; 4160: two tasks of 4096 pixels and a tail.
  for (const memory::dims& spatial : {memory::dims{7, 13}, memory::dims{64, 65}})
    for (memory::dim c = 1; c <= 4; ++c)
      for (const dt type : {dt::u8, dt::s8})
        for (const float scale : {1.f, 0.0371f, 0.25f}) {
          const memory::dims dims = {3, c, spatial[0], spatial[1]};
          const memory::desc from(dims, dt::f32, tag::abcd), to(dims, type, tag::acdb);
          SCOPED_TRACE(testing::Message()
                       << "C " << c << ", " << spatial[0] << "x" << spatial[1] << ", type "
                       << static_cast<int>(type) << ", scale " << scale);
          std::vector<float> x(from.get_size() / sizeof(float));
          for (std::size_t i = 0; i < x.size(); ++i) {
            switch (i % 7) {
            case 0: x[i] = (static_cast<float>(i % 301) - 150.f + 0.5f) * scale; break; // ties
            case 1: x[i] = (i % 2 ? 1e12f : -1e12f); break;             // beyond int32 once scaled
            case 2: x[i] = 300.f * scale * (i % 3 ? 1.f : -1.f); break; // saturating
            default: x[i] = normal(rng) * 40.f * scale;
            }
          }
          const auto k = planar_to_channels_last(from, to, scale);
          if (!k) continue; // no AVX-512 with AVX512_VBMI here: oneDNN's reorder runs
          ++ran;
          std::vector<std::byte> got(to.get_size(), std::byte{0x5a});
          std::byte* ptrs[2] = {reinterpret_cast<std::byte*>(x.data()), got.data()};
          oneapi::tbb::task_arena(2).execute([&] { k->kernel(ptrs); });
          const auto want = onednn_reorder(x, from, to, scale);
          ASSERT_EQ(got.size(), want.size());
          std::size_t differ = 0, first = got.size();
          for (std::size_t i = 0; i < got.size(); ++i)
            if (got[i] != want[i]) {
              ++differ;
              first = std::min(first, i);
            }
          EXPECT_EQ(differ, 0u) << "first at byte " << first;
        }
  if (ran == 0) GTEST_SKIP() << "no AVX-512 with AVX512_VBMI here: the kernel is never used";
  EXPECT_EQ(ran, 2 * 4 * 2 * 3); // every case
}

TEST(TeacherPlanar, OtherLayoutsTypesAndChannelCountsAreLeftToOnednn) {
  const memory::dims d4 = {2, 4, 5, 5}, d5 = {2, 5, 5, 5};
  const auto none = [](const memory::desc& from, const memory::desc& to) {
    return !planar_to_channels_last(from, to, 0.5f);
  };
  EXPECT_TRUE(none(memory::desc(d5, dt::f32, tag::abcd), memory::desc(d5, dt::u8, tag::acdb)));
  EXPECT_TRUE(none(memory::desc(d4, dt::f32, tag::acdb), memory::desc(d4, dt::u8, tag::abcd)));
  EXPECT_TRUE(none(memory::desc(d4, dt::bf16, tag::abcd), memory::desc(d4, dt::u8, tag::acdb)));
  EXPECT_TRUE(none(memory::desc(d4, dt::f32, tag::abcd), memory::desc(d4, dt::s8, tag::aBcd16b)));
  EXPECT_TRUE(
      none(memory::desc(d4, dt::f32, tag::abcd), memory::desc({2, 4, 5, 6}, dt::s8, tag::acdb)));
  EXPECT_TRUE(none(memory::desc(d4, dt::f32, tag::abcd), memory::desc(d4, dt::f32, tag::acdb)));
  EXPECT_TRUE(none(memory::desc(d4, dt::f32, tag::abcd), memory::desc(d4, dt::bf16, tag::acdb)));
}

} // namespace
} // namespace kdflow::teacher
