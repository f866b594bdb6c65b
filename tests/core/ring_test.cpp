// Slot ring: layout, the state machine one step at a time, drain and shutdown, failures that carry
// their stage's name, and a multi-producer stress test with random delays and payload checksums in
// every stage (10 million hand-offs by default; KDFLOW_RING_HANDOFFS changes it: ctest sets 2
// million outside the TSan build, tests/CMakeLists.txt).
#include "kdflow/core/error.hpp"
#include "kdflow/core/slot_decisions.hpp"
#include "kdflow/core/slot_ring.hpp"
#include "kdflow/core/teacher_cache.hpp"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <optional>
#include <random>
#include <thread>
#include <vector>

namespace kdflow {
namespace {

using namespace std::chrono_literals;

SlotLayout test_layout(std::int64_t batch = 4, std::int64_t values = 16) {
  return SlotLayout({{"inputs", DType::u8, {batch, values}},
                     {"labels", DType::i64, {batch}},
                     {"logits", DType::f32, {batch, 10}}});
}

SlotRing make_ring(std::uint32_t slots, SlotLayout layout = test_layout(),
                   std::uint32_t teachers = 1) {
  const std::size_t bytes = std::size_t{slots} * layout.slot_bytes();
  return SlotRing(std::move(layout), slots, allocate_locked(bytes), teachers);
}

TEST(SlotLayout, RegionsAreAlignedAndDisjoint) {
  const SlotLayout layout({{"inputs", DType::f32, {3, 1, 5, 7}},
                           {"labels", DType::i64, {3}},
                           {"logits", DType::f32, {3, 10}}},
                          128);
  std::size_t end = sizeof(SlotHeader);
  for (const auto& r : layout.regions()) {
    EXPECT_EQ(r.offset % 128, 0u) << r.spec.name;
    EXPECT_GE(r.offset, end) << r.spec.name;
    end = r.offset + r.bytes;
  }
  EXPECT_EQ(layout.region("inputs").bytes, 3u * 5 * 7 * 4);
  EXPECT_EQ(layout.region("labels").bytes, 24u);
  EXPECT_LE(end, layout.slot_bytes());
  EXPECT_EQ(layout.slot_bytes() % SlotLayout::kSlotAlignment, 0u);
  EXPECT_THROW(SlotLayout({{"a", DType::u8, {1}}, {"a", DType::u8, {1}}}), InputError);
  EXPECT_THROW(SlotLayout({{"a", DType::u8, {0}}}), InputError);
  EXPECT_THROW(SlotLayout({{"a", DType::u8, {1}}}, 48), InputError);
  EXPECT_THROW((void)layout.index_of("features"), std::out_of_range);
}

TEST(HostMemory, LockedSlabIsUsableAndReportsItsKind) {
  HostMemory m = allocate_locked(10000);
  ASSERT_NE(m.data(), nullptr);
  EXPECT_EQ(m.size() % 4096, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(m.data()) % 4096, 0u);
  EXPECT_NE(m.kind(), MemoryKind::cuda_pinned);
  std::memset(m.data(), 0xab, m.size());
  bool placed = false;
  HostMemory n = allocate_locked(
      4096, [&](void* p, std::size_t bytes) { placed = p != nullptr && bytes == 4096; });
  EXPECT_TRUE(placed);
  HostMemory moved = std::move(n);
  EXPECT_EQ(n.data(), nullptr);
  EXPECT_NE(moved.data(), nullptr);
}

TEST(SlotRing, StatesAdvanceInOrderAndSlotsComeBack) {
  SlotRing ring = make_ring(2);
  const auto inputs = ring.layout().index_of("inputs");
  for (std::uint64_t batch = 0; batch < 6; ++batch) {
    auto s = ring.acquire_free(batch);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->index(), batch % 2);
    EXPECT_EQ(s->header().batch, batch);
    s->region<std::uint8_t>(inputs)[0] = static_cast<std::uint8_t>(batch);
    ring.publish(*s, SlotState::filling, SlotState::filled);
    auto t = ring.acquire_filled(batch);
    ASSERT_TRUE(t);
    EXPECT_EQ(t->data(), s->data());
    ring.publish(*t, SlotState::teaching, SlotState::ready);
    EXPECT_EQ(ring.stats().occupancy[static_cast<int>(SlotState::ready)], 1u);
    auto r = ring.acquire_ready(batch);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->region<std::uint8_t>(inputs)[0], batch);
    ring.release(*r);
  }
  const RingStats st = ring.stats();
  EXPECT_EQ(st.occupancy[static_cast<int>(SlotState::free)], 2u);
  for (const auto& stage : st.stages) EXPECT_EQ(stage.acquisitions, 6u);
  EXPECT_EQ(st.stages[0].waits, 0u);
}

TEST(SlotRing, NoTeacherPathGoesStraightToReady) {
  SlotRing ring = make_ring(2);
  auto s = ring.acquire_free(0);
  ring.publish(*s, SlotState::filling, SlotState::ready);
  auto r = ring.acquire_ready(0);
  ASSERT_TRUE(r);
  ring.release(*r);
}

TEST(SlotRing, BoundedAProducerAheadWaitsForTheRelease) {
  SlotRing ring = make_ring(2);
  for (std::uint64_t b = 0; b < 2; ++b) {
    auto s = ring.acquire_free(b);
    ring.publish(*s, SlotState::filling, SlotState::ready);
  }
  // Batch 2 needs slot 0, which batch 0 holds until the student releases it.
  auto third = std::async(std::launch::async, [&] { return ring.acquire_free(2).has_value(); });
  EXPECT_EQ(third.wait_for(50ms), std::future_status::timeout);
  auto r = ring.acquire_ready(0);
  ring.release(*r);
  ASSERT_EQ(third.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(third.get());
  EXPECT_GE(ring.stats().stages[0].waits, 1u);
}

TEST(SlotRing, CloseDrainsReadyBatchesThenStops) {
  SlotRing ring = make_ring(4);
  for (std::uint64_t b = 0; b < 3; ++b) {
    auto s = ring.acquire_free(b);
    ring.publish(*s, SlotState::filling, b < 2 ? SlotState::ready : SlotState::filled);
  }
  ring.close();
  EXPECT_FALSE(ring.acquire_free(3)); // producers stop at once
  EXPECT_FALSE(ring.acquire_filled(2));
  for (std::uint64_t b = 0; b < 2; ++b) {
    auto r = ring.acquire_ready(b); // the student drains what was finished
    ASSERT_TRUE(r) << b;
    ring.release(*r);
  }
  EXPECT_FALSE(ring.acquire_ready(2)); // batch 2 never became ready
}

TEST(SlotRing, CloseWakesEveryBlockedThread) {
  SlotRing ring = make_ring(2);
  for (std::uint64_t b = 0; b < 2; ++b) {
    auto s = ring.acquire_free(b);
    ring.publish(*s, SlotState::filling, SlotState::filled);
  }
  std::vector<std::future<bool>> blocked;
  blocked.push_back(
      std::async(std::launch::async, [&] { return ring.acquire_free(2).has_value(); }));
  blocked.push_back(
      std::async(std::launch::async, [&] { return ring.acquire_free(3).has_value(); }));
  blocked.push_back(
      std::async(std::launch::async, [&] { return ring.acquire_filled(5).has_value(); }));
  blocked.push_back(
      std::async(std::launch::async, [&] { return ring.acquire_ready(0).has_value(); }));
  for (auto& f : blocked) EXPECT_EQ(f.wait_for(30ms), std::future_status::timeout);
  ring.close();
  for (auto& f : blocked) {
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
    EXPECT_FALSE(f.get());
  }
  ring.close(); // idempotent
}

TEST(SlotRing, AProducerExceptionReachesTheStudentWithItsStage) {
  SlotRing ring = make_ring(2);
  std::thread teacher([&] {
    try {
      auto s = ring.acquire_filled(0);
      if (s) throw std::runtime_error("node 'conv3': NaN in output");
    } catch (...) {
      ring.fail("teacher", std::current_exception());
    }
  });
  auto s = ring.acquire_free(0);
  ring.publish(*s, SlotState::filling, SlotState::filled);
  try {
    (void)ring.acquire_ready(0);
    FAIL() << "no StageError";
  } catch (const StageError& e) {
    EXPECT_EQ(e.stage(), "teacher");
    EXPECT_NE(std::string(e.what()).find("conv3"), std::string::npos) << e.what();
    try {
      std::rethrow_if_nested(e);
      FAIL() << "no nested exception";
    } catch (const std::runtime_error& inner) {
      EXPECT_NE(std::string(inner.what()).find("NaN"), std::string::npos);
    }
  }
  teacher.join();
  EXPECT_FALSE(ring.acquire_free(1)); // failing closes the ring
  ring.fail("loader", nullptr);       // the first failure wins
  EXPECT_THROW(ring.rethrow_if_failed(), StageError);
  try {
    ring.rethrow_if_failed();
  } catch (const StageError& e) {
    EXPECT_EQ(e.stage(), "teacher");
  }
}

// --- stress ------------------------------------------------------------------------------------

std::uint64_t mix(std::uint64_t x) { // splitmix64: payload bytes that depend on the batch number
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Occasionally stalls: a few pauses, a yield, or (rarely) a real sleep, so that every stage is
// sometimes the slow one and threads park and wake in every state.
class Jitter {
public:
  explicit Jitter(std::uint64_t seed) : rng_(seed) {}
  void operator()() {
    const std::uint32_t r = rng_() & 1023;
    if (r < 8)
      std::this_thread::yield();
    else if (r == 8)
      std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 50));
    else if (r < 64)
      for (std::uint32_t i = 0; i < (r & 31); ++i)
        std::atomic_signal_fence(std::memory_order_seq_cst);
  }

private:
  std::minstd_rand rng_;
};

std::uint64_t handoff_target() {
  if (const char* env = std::getenv("KDFLOW_RING_HANDOFFS")) return std::strtoull(env, nullptr, 10);
  return 10'000'000;
}

// A stress test's loader: takes loader tickets below `batches`, fills each batch's `values` input
// bytes from its number (and its `ids` region, when given) after a jitter, hands it to the teacher.
void stress_loader(SlotRing& ring, std::uint64_t batches, std::size_t in_idx, std::int64_t values,
                   std::uint64_t seed, std::optional<std::size_t> id_idx) {
  Jitter jitter(seed);
  for (;;) {
    const std::uint64_t b = ring.take_ticket(RingStage::loader);
    if (b >= batches) return;
    auto s = ring.acquire_free(b);
    if (!s) return;
    jitter();
    auto in = s->region<std::uint8_t>(in_idx);
    for (std::int64_t i = 0; i < values; ++i) in[i] = static_cast<std::uint8_t>(mix(b * 64 + i));
    if (id_idx) s->region<std::int64_t>(*id_idx)[0] = static_cast<std::int64_t>(b);
    ring.publish(*s, SlotState::filling, SlotState::filled);
  }
}

// Several teachers' replicas in a stress test, `replicas` threads per teacher: each takes its
// teacher's tickets below `batches`, claims or joins the batch, and after a jitter runs
// `teach(slot, teacher)`; the last to finish a batch runs `last(slot)` and hands it on.
template <typename Teach, typename Last>
void start_teachers(std::vector<std::thread>& threads, SlotRing& ring, std::uint64_t batches,
                    std::uint32_t teachers, int replicas, std::uint64_t seed, Teach teach,
                    Last last) {
  for (std::uint32_t t = 0; t < teachers; ++t)
    for (int r = 0; r < replicas; ++r)
      threads.emplace_back([&ring, batches, seed, t, r, teach, last] {
        Jitter jitter(seed + 100 + 10 * t + static_cast<std::uint64_t>(r));
        for (;;) {
          const std::uint64_t b = ring.take_ticket(RingStage::teacher, t);
          if (b >= batches) return;
          auto s = ring.acquire_filled(b, t);
          if (!s) return;
          jitter();
          teach(*s, t);
          if (!ring.finish_teaching(*s)) continue;
          last(*s);
          ring.publish(*s, SlotState::teaching, SlotState::ready);
        }
      });
}

TEST(SlotRingStress, EveryBatchArrivesOnceInOrderIntact) {
  constexpr int kLoaders = 2;
  constexpr int kTeachers = 2;
  constexpr std::int64_t kValues = 24;
  // Three hand-offs per batch: loader -> teacher -> student -> (release) loader.
  const std::uint64_t batches = (handoff_target() + 2) / 3;
  SlotRing ring = make_ring(4, SlotLayout({{"inputs", DType::u8, {1, kValues}},
                                           {"ids", DType::i64, {1}},
                                           {"logits", DType::i64, {1}}}));
  const auto in_idx = ring.layout().index_of("inputs");
  const auto id_idx = ring.layout().index_of("ids");
  const auto out_idx = ring.layout().index_of("logits");
  const std::uint64_t seed = std::random_device{}();

  std::vector<std::thread> threads;
  for (int l = 0; l < kLoaders; ++l)
    threads.emplace_back(
        [&, l] { stress_loader(ring, batches, in_idx, kValues, seed + l, id_idx); });
  for (int t = 0; t < kTeachers; ++t)
    threads.emplace_back([&, t] {
      Jitter jitter(seed + 100 + t);
      for (;;) {
        const std::uint64_t b = ring.take_ticket(RingStage::teacher);
        if (b >= batches) return;
        auto s = ring.acquire_filled(b);
        if (!s) return;
        jitter();
        std::uint64_t sum = 0;
        for (const auto v : s->region<std::uint8_t>(in_idx)) sum = sum * 31 + v;
        s->region<std::uint64_t>(out_idx)[0] = sum;
        ring.publish(*s, SlotState::teaching, SlotState::ready);
      }
    });

  std::uint64_t received = 0, bad_payload = 0, bad_order = 0;
  Jitter jitter(seed + 200);
  for (std::uint64_t b = 0; b < batches; ++b) {
    auto s = ring.acquire_ready(b);
    ASSERT_TRUE(s) << "batch " << b << " never arrived";
    jitter();
    if (s->header().batch != b ||
        s->region<std::int64_t>(id_idx)[0] != static_cast<std::int64_t>(b))
      ++bad_order;
    std::uint64_t sum = 0;
    auto in = s->region<std::uint8_t>(in_idx);
    for (std::int64_t i = 0; i < kValues; ++i) {
      if (in[i] != static_cast<std::uint8_t>(mix(b * 64 + i))) ++bad_payload;
      sum = sum * 31 + in[i];
    }
    if (s->region<std::uint64_t>(out_idx)[0] != sum) ++bad_payload;
    ++received;
    ring.release(*s);
  }
  ring.close();
  for (auto& t : threads) t.join();

  EXPECT_EQ(received, batches);
  EXPECT_EQ(bad_order, 0u);
  EXPECT_EQ(bad_payload, 0u);
  const RingStats st = ring.stats();
  EXPECT_EQ(st.stages[0].acquisitions, batches);
  EXPECT_EQ(st.stages[1].acquisitions, batches);
  EXPECT_EQ(st.stages[2].acquisitions, batches);
  EXPECT_EQ(st.occupancy[static_cast<int>(SlotState::free)], 4u);
  std::printf("stress: %llu batches, %llu hand-offs; waits loader %llu teacher %llu student %llu\n",
              static_cast<unsigned long long>(batches),
              static_cast<unsigned long long>(3 * batches),
              static_cast<unsigned long long>(st.stages[0].waits),
              static_cast<unsigned long long>(st.stages[1].waits),
              static_cast<unsigned long long>(st.stages[2].waits));
}

// Several teachers: each (two replicas apiece) works on every batch beside the other, into its
// own region; the last to finish a batch reads both regions into a third (as the pipeline mixes
// them) and hands it on. Every batch reaches the student once, in order, with both teachers'
// values and their mix, and each teacher claimed every batch exactly once.
TEST(SlotRingStress, TwoTeachersEachReachTheirRegionsInOrder) {
  constexpr int kLoaders = 2;
  constexpr std::uint32_t kTeachers = 2;
  constexpr int kReplicas = 2; // per teacher
  constexpr std::int64_t kValues = 24;
  // Four hand-offs per batch: loader -> teachers -> student -> (release) loader.
  const std::uint64_t batches = (handoff_target() + 3) / 4;
  SlotRing ring = make_ring(4,
                            SlotLayout({{"inputs", DType::u8, {1, kValues}},
                                        {"out0", DType::i64, {1}},
                                        {"out1", DType::i64, {1}},
                                        {"mix", DType::i64, {1}}}),
                            kTeachers);
  const auto in_idx = ring.layout().index_of("inputs");
  const std::array<std::size_t, kTeachers> out_idx = {ring.layout().index_of("out0"),
                                                      ring.layout().index_of("out1")};
  const auto mix_idx = ring.layout().index_of("mix");
  const std::uint64_t seed = std::random_device{}();
  const auto value = [](std::span<const std::uint8_t> in, std::uint32_t teacher) {
    std::uint64_t sum = teacher + 1;
    for (const auto v : in) sum = sum * 31 + v;
    return sum;
  };
  std::array<std::atomic<std::uint64_t>, kTeachers> taught{};
  std::atomic<std::uint64_t> mixes{0};

  std::vector<std::thread> threads;
  for (int l = 0; l < kLoaders; ++l)
    threads.emplace_back(
        [&, l] { stress_loader(ring, batches, in_idx, kValues, seed + l, std::nullopt); });
  start_teachers(
      threads, ring, batches, kTeachers, kReplicas, seed,
      [&](const Slot& s, std::uint32_t t) {
        s.region<std::uint64_t>(out_idx[t])[0] = value(s.region<std::uint8_t>(in_idx), t);
        taught[t].fetch_add(1, std::memory_order_relaxed);
      },
      [&](const Slot& s) {
        s.region<std::uint64_t>(mix_idx)[0] =
            s.region<std::uint64_t>(out_idx[0])[0] ^ s.region<std::uint64_t>(out_idx[1])[0];
        mixes.fetch_add(1, std::memory_order_relaxed);
      });

  std::uint64_t received = 0, bad = 0;
  Jitter jitter(seed + 200);
  for (std::uint64_t b = 0; b < batches; ++b) {
    auto s = ring.acquire_ready(b);
    ASSERT_TRUE(s) << "batch " << b << " never arrived";
    jitter();
    const auto in = s->region<std::uint8_t>(in_idx);
    if (s->header().batch != b || in[0] != static_cast<std::uint8_t>(mix(b * 64))) ++bad;
    const std::uint64_t v0 = value(in, 0), v1 = value(in, 1);
    if (s->region<std::uint64_t>(out_idx[0])[0] != v0 ||
        s->region<std::uint64_t>(out_idx[1])[0] != v1 ||
        s->region<std::uint64_t>(mix_idx)[0] != (v0 ^ v1))
      ++bad;
    ++received;
    ring.release(*s);
  }
  ring.close();
  for (auto& t : threads) t.join();

  EXPECT_EQ(received, batches);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(taught[0].load(), batches);
  EXPECT_EQ(taught[1].load(), batches);
  EXPECT_EQ(mixes.load(), batches); // one last teacher per batch
  const RingStats st = ring.stats();
  EXPECT_EQ(st.stages[1].acquisitions, kTeachers * batches);
  EXPECT_EQ(st.occupancy[static_cast<int>(SlotState::free)], 4u);
  std::printf("two teachers: %llu batches; teacher waits %llu\n",
              static_cast<unsigned long long>(batches),
              static_cast<unsigned long long>(st.stages[1].waits));
}

// Two teachers with the cache, as kd.cache keeps their mix: batch b carries sample b / 2, so every
// second batch finds its sample kept, or still being taught in the batch before, as the first
// batches of a run's second epoch do. The first teacher to reach a batch decides for both whether
// the cache holds it (SlotDecisions): both skip their forward pass or both run it, and the last
// to finish reads the kept mix, or mixes and keeps it (TeacherOutputCache::keep). A teacher's
// logits for a sample differ by the batch that carries it (as a real teacher's do by rounding,
// among other samples), yet both batches of a sample reach the student with its one kept mix;
// each teacher ran exactly the batches decided uncached, and each decision was taken once. (The
// protocol as CpuPipeline::run_teacher and mix() follow it; their wiring, with oneTBB's graphs
// around it, is checked by the pipeline's two-teacher cache test.)
TEST(SlotRingStress, TwoTeachersWithTheCacheDecideEachBatchOnce) {
  constexpr int kLoaders = 2;
  constexpr std::uint32_t kTeachers = 2;
  constexpr int kReplicas = 2; // per teacher
  constexpr std::int64_t kValues = 8;
  constexpr std::uint32_t kSlots = 4;
  const std::uint64_t batches = (handoff_target() + 3) / 4;
  SlotRing ring = make_ring(kSlots,
                            SlotLayout({{"inputs", DType::u8, {1, kValues}},
                                        {"ids", DType::i64, {1}},
                                        {"out0", DType::f32, {1, 2}},
                                        {"out1", DType::f32, {1, 2}},
                                        {"mix", DType::f32, {1, 2}}}),
                            kTeachers);
  const auto in_idx = ring.layout().index_of("inputs");
  const auto id_idx = ring.layout().index_of("ids");
  const std::array<std::size_t, kTeachers> out_idx = {ring.layout().index_of("out0"),
                                                      ring.layout().index_of("out1")};
  const auto mix_idx = ring.layout().index_of("mix");
  TeacherOutputCache cache(batches / 2 + 1, 2, 0, 1.0);
  SlotDecisions decisions(kSlots);
  const auto logit = [](std::uint64_t sample, std::uint64_t batch, std::uint32_t teacher) {
    return static_cast<float>(sample % 4096) + 0.25f * static_cast<float>(teacher) +
           0.5f * static_cast<float>(batch & 1);
  };
  const std::uint64_t seed = std::random_device{}();
  std::array<std::atomic<std::uint64_t>, kTeachers> taught{};
  std::atomic<std::uint64_t> hits{0}, misses{0}, lost{0};

  std::vector<std::thread> threads;
  for (int l = 0; l < kLoaders; ++l)
    threads.emplace_back(
        [&, l] { stress_loader(ring, batches, in_idx, kValues, seed + l, id_idx); });
  const auto sample_of = [&](const Slot& s) {
    return static_cast<std::uint64_t>(s.region<std::int64_t>(id_idx)[0]) / 2;
  };
  start_teachers(
      threads, ring, batches, kTeachers, kReplicas, seed,
      [&](const Slot& s, std::uint32_t t) {
        const std::uint64_t sample = sample_of(s);
        if (decisions.ask(s.index(), [&] { return cache.has(sample); })) return;
        const auto out = s.region<float>(out_idx[t]);
        out[0] = logit(sample, s.batch(), t);
        out[1] = -out[0];
        taught[t].fetch_add(1, std::memory_order_relaxed);
      },
      [&](const Slot& s) {
        const std::uint64_t sample = sample_of(s);
        const auto mix = s.region<float>(mix_idx);
        if (decisions.take(s.index())) {
          if (cache.has(sample))
            cache.load(sample, mix);
          else
            lost.fetch_add(1, std::memory_order_relaxed);
          hits.fetch_add(1, std::memory_order_relaxed);
          return;
        }
        for (std::size_t c = 0; c < 2; ++c)
          mix[c] = s.region<float>(out_idx[0])[c] + s.region<float>(out_idx[1])[c];
        cache.keep(sample, mix);
        misses.fetch_add(1, std::memory_order_relaxed);
      });

  std::uint64_t received = 0, bad = 0, differ = 0;
  std::array<float, 2> first{}; // the mix the sample's first batch carried
  Jitter jitter(seed + 200);
  for (std::uint64_t b = 0; b < batches; ++b) {
    auto s = ring.acquire_ready(b);
    ASSERT_TRUE(s) << "batch " << b << " never arrived";
    jitter();
    if (s->header().batch != b ||
        s->region<std::int64_t>(id_idx)[0] != static_cast<std::int64_t>(b))
      ++bad;
    const auto mix = s->region<float>(mix_idx);
    const std::uint64_t sample = b / 2;
    // Taught in this batch or the other of the sample's pair, by both teachers.
    const float even = logit(sample, 0, 0) + logit(sample, 0, 1),
                odd = logit(sample, 1, 0) + logit(sample, 1, 1);
    if ((mix[0] != even && mix[0] != odd) || mix[1] != -mix[0]) ++bad;
    if (b % 2 == 0)
      first = {mix[0], mix[1]};
    else if (mix[0] != first[0] || mix[1] != first[1])
      ++differ;
    ++received;
    ring.release(*s);
  }
  ring.close();
  for (auto& t : threads) t.join();

  EXPECT_EQ(received, batches);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(differ, 0u) << "a sample's two batches carried other mixes";
  EXPECT_EQ(lost.load(), 0u) << "a batch decided cached lost its sample";
  EXPECT_EQ(hits.load() + misses.load(), batches) << "one decision taken per batch";
  EXPECT_EQ(taught[0].load(), misses.load()) << "teacher 0 ran other batches than decided";
  EXPECT_EQ(taught[1].load(), misses.load()) << "teacher 1 ran other batches than decided";
  EXPECT_GE(misses.load(), batches / 2) << "a sample's first batch found it kept";
  std::printf("two teachers with the cache: %llu batches, %llu read from the cache\n",
              static_cast<unsigned long long>(batches),
              static_cast<unsigned long long>(hits.load()));
}

TEST(SlotRing, OneTeacherOfSeveralAloneHandsEachBatchOn) {
  SlotRing ring = make_ring(2, test_layout(), 2);
  ring.set_teachers(1); // a benchmark's teacher alone
  EXPECT_THROW(ring.set_teachers(3), std::invalid_argument);
  for (std::uint64_t b = 0; b < 4; ++b) {
    auto s = ring.acquire_free(b);
    ASSERT_TRUE(s);
    ring.publish(*s, SlotState::filling, SlotState::filled);
    s = ring.acquire_filled(b, 0);
    ASSERT_TRUE(s);
    EXPECT_TRUE(ring.finish_teaching(*s));
    ring.publish(*s, SlotState::teaching, SlotState::ready);
    s = ring.acquire_ready(b);
    ASSERT_TRUE(s);
    ring.release(*s);
  }
}

} // namespace
} // namespace kdflow
