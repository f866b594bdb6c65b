// The teacher-output cache (kd.cache): what it returns for a sample is what was stored, every
// logit exactly, or under top-K the K largest exactly and the rest's probability mass at the
// temperature within 1e-6; concurrent writers and readers see whole entries, each sample once.
// kd.cache = disk's file: what is read back is what was kept, bit for bit; a file of another key,
// other sizes or damaged is refused naming it; a save beside running writers holds whole entries.
#include "kdflow/core/teacher_cache.hpp"

#include "input_error.hpp"

#include "kdflow/core/atomic_file.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
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
// What the cache serves for sample `id`'s logits under top-`k` (stored alone, one thread): the
// reference a concurrent reader's whole entry is compared with.
std::vector<std::vector<float>> served(std::size_t samples, std::size_t classes, std::size_t k) {
  TeacherOutputCache alone(samples, classes, k, 2.0);
  std::vector<std::vector<float>> rows(samples, std::vector<float>(classes));
  for (std::uint64_t id = 0; id < samples; ++id) {
    alone.store(id, logits_for(id, classes));
    alone.load(id, rows[id]);
  }
  return rows;
}

TEST(TeacherOutputCache, ConcurrentWritersAndReadersSeeWholeEntries) {
  constexpr std::size_t kSamples = 4000, kClasses = 16;
  for (const std::size_t k : {0, 4}) {
    const auto expected = served(kSamples, kClasses, k);
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
            if (out != expected[id]) ++bad; // every value of the entry, not a torn one
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

// keep(): the first row offered for a sample is kept, and every row offered for it becomes what
// the cache serves (load()): an earlier one's, or under top-K its own as kept. Writers offering
// other rows for the same samples at once (batches that met the cache before either was kept) all
// end with the one kept row, whichever won.
TEST(TeacherOutputCache, KeepMakesEveryRowOfASampleTheKeptOne) {
  TeacherOutputCache all(2, 3, 0, 1.0);
  std::vector<float> first{1.f, 2.f, 3.f}, second{4.f, 5.f, 6.f};
  all.keep(0, first);
  EXPECT_EQ(first, (std::vector<float>{1.f, 2.f, 3.f}));
  all.keep(0, second);
  EXPECT_EQ(second, first) << "a kept sample's row is the kept one";
  EXPECT_EQ(all.stored(), 1u);
  EXPECT_THROW(all.keep(2, first), std::out_of_range);

  TeacherOutputCache top(1, 5, 2, 2.0);
  std::vector<float> row = logits_for(0, 5), served(5);
  top.keep(0, row);
  top.load(0, served);
  EXPECT_EQ(row, served) << "under top-K the row is what is kept of it";

  // Each row carries two feature values naming its writer: the kept features are the kept
  // logits' writer's (a row is kept whole).
  constexpr std::size_t kSamples = 2000, kClasses = 8, kWriters = 4;
  for (const std::size_t k : {0, 3}) {
    TeacherOutputCache cache(kSamples, kClasses, k, 2.0, 2);
    std::vector<std::vector<float>> rows(kWriters * kSamples), features(kWriters * kSamples);
    std::vector<std::thread> threads;
    for (std::size_t w = 0; w < kWriters; ++w)
      threads.emplace_back([&, w] {
        for (std::size_t n = 0; n < kSamples; ++n) {
          const std::size_t id = (n + w * 37) % kSamples;
          std::vector<float> mine = logits_for(id, kClasses);
          mine[0] += static_cast<float>(w); // each writer's own row for the sample
          std::vector<float> mine_f{static_cast<float>(id), static_cast<float>(w)};
          cache.keep(id, mine, mine_f);
          rows[w * kSamples + id] = std::move(mine);
          features[w * kSamples + id] = std::move(mine_f);
        }
      });
    for (auto& t : threads) t.join();
    std::size_t differ = 0, torn = 0;
    for (std::size_t id = 0; id < kSamples; ++id) {
      std::vector<float> kept(kClasses), kept_f(2);
      cache.load(id, kept, kept_f);
      for (std::size_t w = 0; w < kWriters; ++w) {
        differ += rows[w * kSamples + id] != kept;
        differ += features[w * kSamples + id] != kept_f;
      }
      // The writer the features name offered the kept logits (under top-K: what is kept of them).
      std::vector<float> offered = logits_for(id, kClasses), as_kept(kClasses);
      offered[0] += kept_f[1];
      TeacherOutputCache one(1, kClasses, k, 2.0);
      one.store(0, offered);
      one.load(0, as_kept);
      torn += kept_f[0] != static_cast<float>(id) || as_kept != kept;
    }
    EXPECT_EQ(differ, 0u) << "top_k " << k;
    EXPECT_EQ(torn, 0u) << "top_k " << k;
    EXPECT_EQ(cache.stored(), kSamples);
  }
}

// A file of its own in the temporary folder, removed at the end.
struct TempFile {
  std::filesystem::path path;
  explicit TempFile(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("kdflow_cache_test_" + std::to_string(::getpid()) + "_" + name)) {
    std::filesystem::remove(path);
  }
  ~TempFile() { std::filesystem::remove(path); }
};

const std::string kKey = "kdflow teacher outputs\nteacher=0123-45\ndata=abcd 100x1x28x28\n";

TEST(TeacherOutputCache, TheFileHoldsWhatWasKeptBitForBit) {
  for (const std::size_t k : {0, 3}) {
    SCOPED_TRACE("top_k " + std::to_string(k));
    TempFile file("roundtrip");
    TeacherOutputCache cache(100, 10, k, 2.0);
    for (std::uint64_t id = 0; id < 100; id += 3) cache.store(id, logits_for(id, 10));
    cache.save(file.path, kKey);

    TeacherOutputCache back(100, 10, k, 2.0);
    back.store(0, logits_for(0, 10)); // kept already: the file's entry is not counted again
    EXPECT_EQ(back.load(file.path, kKey), cache.stored() - 1);
    EXPECT_EQ(back.stored(), cache.stored());
    std::vector<float> a(10), b(10);
    for (std::uint64_t id = 0; id < 100; ++id) {
      ASSERT_EQ(back.has(id), cache.has(id)) << "sample " << id;
      if (!cache.has(id)) continue;
      cache.load(id, a);
      back.load(id, b);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * 10), 0) << "sample " << id;
    }
  }
}

// The teachers' features ride with the logits: kept whole (top-K applies to the logits alone),
// made the kept ones by keep() as the logits are, and read back from the file bit for bit; a
// sample's features of another size are refused before anything is kept.
TEST(TeacherOutputCache, FeaturesAreKeptWholeBesideTheLogits) {
  constexpr std::size_t kFeatures = 5;
  const auto features_for = [](std::uint64_t id) {
    std::vector<float> f(kFeatures);
    for (std::size_t j = 0; j < kFeatures; ++j) f[j] = static_cast<float>(id) * 0.5f - float(j);
    return f;
  };
  for (const std::size_t k : {0, 3}) {
    SCOPED_TRACE("top_k " + std::to_string(k));
    TeacherOutputCache cache(20, 10, k, 2.0, kFeatures);
    EXPECT_EQ(cache.features(), kFeatures);
    for (std::uint64_t id = 0; id < 20; id += 2)
      EXPECT_TRUE(cache.store(id, logits_for(id, 10), features_for(id)));
    EXPECT_THROW(cache.store(1, logits_for(1, 10), std::vector<float>(kFeatures - 1)),
                 std::invalid_argument);
    EXPECT_THROW(cache.store(1, logits_for(1, 10)), std::invalid_argument) << "none given";
    EXPECT_FALSE(cache.has(1)) << "a refused store keeps nothing";
    // keep(): a kept sample's features become the kept ones.
    std::vector<float> logits = logits_for(4, 10), other(kFeatures, 9.f);
    cache.keep(4, logits, other);
    EXPECT_EQ(other, features_for(4));
    std::vector<float> fresh = features_for(5);
    logits = logits_for(5, 10);
    cache.keep(5, logits, fresh);
    EXPECT_EQ(fresh, features_for(5)) << "a new sample keeps its own";

    EXPECT_THROW(cache.load(0, logits, std::span<float>(other).first(kFeatures - 1)),
                 std::invalid_argument)
        << "room for fewer features than are kept";
    // A feature may be any float the teacher computed: kept and read back from the file.
    std::vector<float> infinite = features_for(19);
    infinite[0] = -INFINITY;
    cache.store(19, logits_for(19, 10), infinite);

    TempFile file("features");
    cache.save(file.path, kKey);
    TeacherOutputCache back(20, 10, k, 2.0, kFeatures);
    EXPECT_EQ(back.load(file.path, kKey), cache.stored());
    std::vector<float> a(10), b(10), fa(kFeatures), fb(kFeatures);
    for (std::uint64_t id = 0; id < 20; ++id) {
      ASSERT_EQ(back.has(id), cache.has(id)) << "sample " << id;
      if (!cache.has(id)) continue;
      cache.load(id, a, fa);
      back.load(id, b, fb);
      EXPECT_EQ(a, b) << "sample " << id;
      EXPECT_EQ(fa, id == 19 ? infinite : features_for(id)) << "sample " << id;
      EXPECT_EQ(fb, fa) << "sample " << id;
      back.load(id, b); // the logits alone
      EXPECT_EQ(a, b) << "sample " << id;
    }
    // A file of a cache without features has other sizes: refused naming the file.
    TeacherOutputCache plain(20, 10, k, 2.0);
    const std::string e = test::error_of([&] { (void)plain.load(file.path, kKey); });
    EXPECT_NE(e.find(file.path.string()), std::string::npos) << e;
  }
}

// A file's payload, changed by `edit`, written back as a checked file (its checksum right): what
// a file the checksum cannot tell from a good one does.
void rewrite(const std::filesystem::path& path,
             const std::function<void(std::vector<std::byte>&)>& edit) {
  auto payload = read_checked_file(path, "teacher cache");
  edit(payload);
  write_checked_file(path, payload);
}

TEST(TeacherOutputCache, AFileOfAnotherKeySizesOrDamagedIsRefusedNamingIt) {
  TempFile file("refused");
  const std::string name = file.path.string();
  TeacherOutputCache cache(100, 10, 3, 2.0);
  for (std::uint64_t id = 0; id < 100; ++id) cache.store(id, logits_for(id, 10));
  const auto error = [&](TeacherOutputCache&& into, const std::string& key) {
    std::string e = test::error_of([&] { (void)into.load(file.path, key); });
    EXPECT_NE(e.find(name), std::string::npos) << e;
    EXPECT_EQ(into.stored(), 0u) << "nothing kept from a refused file";
    return e;
  };
  const auto fresh = [] { return TeacherOutputCache(100, 10, 3, 2.0); };

  cache.save(file.path, kKey);
  std::string e =
      error(fresh(), "kdflow teacher outputs\nteacher=9999-45\ndata=abcd 100x1x28x28\n");
  EXPECT_NE(e.find("'teacher=0123-45', this run's 'teacher=9999-45'"), std::string::npos) << e;
  e = error(TeacherOutputCache(90, 10, 3, 2.0), kKey);
  EXPECT_NE(e.find("100 samples"), std::string::npos) << e;
  e = error(TeacherOutputCache(100, 10, 4, 2.0), kKey);
  EXPECT_NE(e.find("(3 kept)"), std::string::npos) << e;

  // Damage the checksum sees; then damage it cannot (a rewritten checked file).
  {
    std::fstream f(file.path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  e = error(fresh(), kKey);
  EXPECT_NE(e.find("corrupt"), std::string::npos) << e;
  cache.save(file.path, kKey);
  const std::size_t flags = 8 + 4 + 4 + kKey.size() + 3 * 8;
  rewrite(file.path, [&](auto& p) { p[flags + 5] = std::byte{7}; });
  e = error(fresh(), kKey);
  EXPECT_NE(e.find("sample 5's flag"), std::string::npos) << e;
  cache.save(file.path, kKey);
  rewrite(file.path, [&](auto& p) {
    const float nan = std::nanf("");
    std::memcpy(p.data() + flags + 100 + 4 * 4 * 2, &nan, sizeof(nan)); // sample 2's first value
  });
  e = error(fresh(), kKey);
  EXPECT_NE(e.find("sample 2 holds a logit of nan"), std::string::npos) << e;
  cache.save(file.path, kKey);
  rewrite(file.path, [&](auto& p) {
    const std::uint32_t c = 10;
    std::memcpy(p.data() + flags + 100 + 4 * 4 * 100 + 4 * 3 * 7, &c, sizeof(c)); // sample 7's
  });
  e = error(fresh(), kKey);
  EXPECT_NE(e.find("sample 7 keeps class 10 of 10"), std::string::npos) << e;
  cache.save(file.path, kKey);
  rewrite(file.path, [&](auto& p) { p.pop_back(); });
  e = error(fresh(), kKey);
  EXPECT_NE(e.find("expected"), std::string::npos) << e;
  rewrite(file.path, [&](auto& p) { p[0] = std::byte{'X'}; });
  e = error(fresh(), kKey);
  EXPECT_NE(e.find("not a teacher cache"), std::string::npos) << e;

  // A file far larger than any of this cache's is refused before it is read.
  {
    std::ofstream f(file.path, std::ios::binary | std::ios::trunc);
    f.seekp(64 << 20);
    f.put('x');
  }
  e = error(fresh(), kKey);
  EXPECT_NE(e.find("more than a teacher cache"), std::string::npos) << e;
  std::filesystem::remove(file.path);
  e = error(fresh(), kKey);
  EXPECT_NE(e.find("no such file"), std::string::npos) << e;
}

// Saved again and again while writers keep samples: every file holds whole entries only (each
// kept entry is the sample's logits), and the last save, after the writers, holds every sample.
TEST(TeacherOutputCache, SavesBesideRunningWritersHoldWholeEntries) {
  constexpr std::size_t kSamples = 2000, kClasses = 16;
  for (const std::size_t k : {0, 4}) {
    TempFile file("concurrent");
    const auto expected = served(kSamples, kClasses, k);
    TeacherOutputCache cache(kSamples, kClasses, k, 2.0);
    std::atomic<bool> writing{true}, saving{false};
    // Every file a save wrote beside the writers, read back: each entry it holds is whole.
    std::size_t torn = 0, held = 0;
    const auto check_file = [&](std::size_t expect_all) {
      TeacherOutputCache back(kSamples, kClasses, k, 2.0);
      const std::size_t n = back.load(file.path, kKey);
      if (expect_all) {
        EXPECT_EQ(n, kSamples);
      }
      std::vector<float> a(kClasses);
      for (std::uint64_t id = 0; id < kSamples; ++id) {
        if (!back.has(id)) continue;
        back.load(id, a);
        ++held;
        if (a != expected[id]) ++torn;
      }
    };
    std::vector<std::thread> writers;
    for (int w = 0; w < 3; ++w)
      writers.emplace_back([&, w] {
        while (!saving.load()) std::this_thread::yield(); // the first save runs beside them
        for (std::size_t n = 0; n < kSamples; ++n)
          cache.store((n * 7 + static_cast<std::size_t>(w) * 500) % kSamples,
                      logits_for((n * 7 + static_cast<std::size_t>(w) * 500) % kSamples, kClasses));
      });
    std::size_t saves = 0;
    std::thread saver([&] {
      saving.store(true);
      do {
        cache.save(file.path, kKey);
        ++saves;
        check_file(0);
      } while (writing.load());
    });
    for (auto& t : writers) t.join();
    writing.store(false);
    saver.join();
    EXPECT_GT(saves, 0u);
    cache.save(file.path, kKey);
    check_file(kSamples);
    EXPECT_EQ(torn, 0u) << "of " << held << " entries read back from " << saves + 1 << " saves";
    EXPECT_GE(held, kSamples);
  }
}

} // namespace
} // namespace kdflow
