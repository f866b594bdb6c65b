// Sampler, augmentation and loader workers: permutations cover every sample once per epoch,
// shards are disjoint, crops and flips move pixels where they should, and batches are
// byte-identical with 1 and with 2 loader threads (same seed) on the real Fashion-MNIST.
#include "image_files.hpp"

#include "kdflow/core/loader.hpp"

#include <gtest/gtest.h>

#include <oneapi/tbb/global_control.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>

namespace kdflow {
namespace {

TEST(Sampler, EachEpochIsAPermutationAndEpochsDiffer) {
  for (const std::size_t n : {1u, 7u, 1000u, 60000u}) {
    SamplerConfig c;
    c.batch_size = 1;
    c.seed = 3;
    const Sampler s(n, c);
    std::vector<std::uint32_t> e0, e1;
    for (std::uint32_t k = 0; k < n; ++k) {
      e0.push_back(s.permute(0, k));
      e1.push_back(s.permute(1, k));
    }
    EXPECT_EQ(std::set<std::uint32_t>(e0.begin(), e0.end()).size(), n);
    EXPECT_EQ(*std::max_element(e0.begin(), e0.end()), n - 1);
    if (n > 10) {
      EXPECT_NE(e0, e1);
    }
  }
}

TEST(Sampler, ShardsAreDisjointAndBatchesCountRight) {
  SamplerConfig c;
  c.batch_size = 32;
  c.world = 3;
  std::set<std::uint32_t> seen;
  for (int r = 0; r < 3; ++r) {
    c.rank = r;
    const Sampler s(1000, c);
    EXPECT_EQ(s.batches_per_epoch(), 333u / 32u); // drop_last
    std::vector<std::uint32_t> idx;
    for (std::size_t b = 0; b < s.batches_per_epoch(); ++b) {
      s.batch_indices(0, b, idx);
      for (auto i : idx) EXPECT_TRUE(seen.insert(i).second) << i;
    }
  }
  c.rank = 0;
  c.world = 1;
  c.drop_last = false;
  const Sampler keep(1000, c);
  EXPECT_EQ(keep.batches_per_epoch(), 32u);
  std::vector<std::uint32_t> idx;
  keep.batch_indices(0, 31, idx);
  EXPECT_EQ(idx.size(), 1000u - 31u * 32u);
}

// kd.cache under several ranks: each rank keeps the same samples every epoch, in a fresh order;
// the shards stay disjoint and together cover every rank's share; one process is unchanged.
TEST(Sampler, FixedShardsKeepEachRanksSamplesAcrossEpochs) {
  SamplerConfig c;
  c.batch_size = 16;
  c.world = 3;
  c.fixed_shards = true;
  const auto epoch_of = [&](const Sampler& s, std::uint64_t epoch) {
    std::vector<std::uint32_t> all, idx;
    for (std::size_t b = 0; b < s.batches_per_epoch(); ++b) {
      s.batch_indices(epoch, b, idx);
      all.insert(all.end(), idx.begin(), idx.end());
    }
    return all;
  };
  const auto set_of = [](const std::vector<std::uint32_t>& v) {
    return std::set<std::uint32_t>(v.begin(), v.end());
  };
  std::set<std::uint32_t> every;
  for (int r = 0; r < 3; ++r) {
    c.rank = r;
    // Every sample of the shard each epoch (drop_last = false): the same set, a fresh order.
    c.drop_last = false;
    const Sampler whole(1000, c);
    const auto first = epoch_of(whole, 0), second = epoch_of(whole, 1);
    EXPECT_EQ(first.size(), 333u);
    EXPECT_NE(first, second) << "a fresh order each epoch";
    const auto shard = set_of(first);
    EXPECT_EQ(shard, set_of(second)) << "the same samples";
    EXPECT_EQ(shard, set_of(epoch_of(whole, 7)));
    for (const auto i : shard) {
      EXPECT_LT(i, 1000u);
      EXPECT_TRUE(every.insert(i).second) << "sample " << i << " in two shards";
    }
    // drop_last: each epoch leaves out the shard's last few in its order, never another's.
    c.drop_last = true;
    const Sampler dropping(1000, c);
    for (const std::uint64_t e : {0, 1, 5}) {
      const auto taken = set_of(epoch_of(dropping, e));
      EXPECT_EQ(taken.size(), 320u);
      EXPECT_TRUE(std::includes(shard.begin(), shard.end(), taken.begin(), taken.end()))
          << "epoch " << e;
    }
  }
  // Without fixed shards a rank's samples change between epochs; with one rank the flag is moot.
  c.rank = 0;
  c.fixed_shards = false;
  const Sampler dealt(1000, c);
  EXPECT_NE(set_of(epoch_of(dealt, 0)), set_of(epoch_of(dealt, 1)));
  c.world = 1;
  const Sampler one(1000, c);
  c.fixed_shards = true;
  const Sampler one_fixed(1000, c);
  EXPECT_EQ(epoch_of(one, 3), epoch_of(one_fixed, 3));
}

TEST(Augment, CropShiftsAndFlipMirrors) {
  // One 1x4x4 image with pixel value = 10*y + x; uint8 output keeps values as stored.
  std::vector<std::uint8_t> px(16);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x)
      px[static_cast<std::size_t>(y * 4 + x)] = static_cast<std::uint8_t>(10 * y + x + 1);
  const Dataset d(px, {3}, 1, 4, 4, 10, "synthetic");
  SamplerConfig sc;
  sc.batch_size = 1;
  const Sampler s(1, sc);
  const SlotLayout layout = loader_layout(d, 1, false);
  SlotRing ring(layout, 2, allocate_locked(2 * layout.slot_bytes()));
  const LoaderRegions regions{0, 1, 2};
  LoaderScratch scratch;
  AugmentConfig aug;
  aug.normalize = false;
  aug.pad_crop = 2;
  aug.hflip = true;
  // Every crop (dy, dx in [-2, 2]) and flip, by the plain definition: output (y, x) is source
  // (y + dy, (flip ? 3 - x : x) + dx), zero outside.
  std::map<std::string, std::string> transforms; // pixels as bytes -> which transform
  for (int dy = -2; dy <= 2; ++dy)
    for (int dx = -2; dx <= 2; ++dx)
      for (const bool flip : {false, true}) {
        std::vector<std::uint8_t> t(16);
        for (int y = 0; y < 4; ++y)
          for (int x = 0; x < 4; ++x) {
            const int sy = y + dy, sx = (flip ? 3 - x : x) + dx;
            t[static_cast<std::size_t>(y * 4 + x)] =
                sy < 0 || sy > 3 || sx < 0 || sx > 3 ? 0
                                                     : px[static_cast<std::size_t>(sy * 4 + sx)];
          }
        transforms[std::string(t.begin(), t.end())] =
            fmt::format("dy {} dx {}{}", dy, dx, flip ? " flipped" : "");
      }
  std::set<std::string> seen;
  for (std::uint64_t b = 0; b < 200; ++b) { // 200 epochs of one sample
    auto slot = ring.acquire_free(b);
    fill_batch(d, s, aug, b, *slot, regions, scratch);
    const auto out = slot->region<std::uint8_t>(0);
    EXPECT_EQ(slot->region<std::int64_t>(1)[0], 3);
    const auto found = transforms.find(std::string(out.begin(), out.end()));
    ASSERT_NE(found, transforms.end()) << "epoch " << b << ": not a crop and flip of the image";
    seen.insert(found->second);
    ring.publish(*slot, SlotState::filling, SlotState::ready);
    ring.release(*ring.acquire_ready(b));
  }
  // Random crops and flips: most of the 50 combinations occur (a fixed or broken draw would not).
  EXPECT_GE(seen.size(), 35u);
  EXPECT_TRUE(std::any_of(seen.begin(), seen.end(),
                          [](const std::string& t) { return t.ends_with("flipped"); }));
  // Evaluation mode: identity, and normalization maps 255 to (1 - mean) / std.
  aug.augment = false;
  aug.normalize = true;
  aug.mean = {0.5f};
  aug.std = {0.25f};
  const SlotLayout fl = loader_layout(d, 1, true);
  SlotRing fring(fl, 2, allocate_locked(2 * fl.slot_bytes()));
  auto slot = fring.acquire_free(0);
  fill_batch(d, s, aug, 0, *slot, regions, scratch);
  EXPECT_FLOAT_EQ(slot->region<float>(0)[5], (12.f / 255.f - 0.5f) / 0.25f); // pixel (1, 1) = 12
}

TEST(Augment, Uint8SlotsNormalizedLaterEqualFloat32Slots) {
  // data.slot_dtype = uint8 hands pixels on and normalize_images (the teacher's side) normalizes
  // them: the same bits as a float32 slot, and (x / 255 - mean) / std by the definition.
  std::mt19937 rng(5);
  std::vector<std::uint8_t> px(6 * 3 * 5 * 7);
  for (auto& v : px) v = static_cast<std::uint8_t>(rng() & 0xff);
  const Dataset d(px, {0, 1, 2, 3, 4, 5}, 3, 5, 7, 10, "synthetic");
  SamplerConfig sc;
  sc.batch_size = 4;
  const Sampler s(d.size(), sc);
  AugmentConfig aug;
  aug.pad_crop = 2;
  aug.hflip = true;
  aug.jitter = {0.3f, 0.3f, 0.3f, 0.05f}; // jittered as uint8, then normalized or not
  aug.mean = {0.4f, 0.5f, 0.6f};
  aug.std = {0.2f, 0.25f, 0.3f};
  LoaderScratch scratch;
  for (std::uint64_t b = 0; b < 6; ++b) {
    aug.normalize = true;
    const SlotLayout fl = loader_layout(d, 4, true);
    SlotRing floats(fl, 2, allocate_locked(2 * fl.slot_bytes()));
    auto f = floats.acquire_free(0);
    fill_batch(d, s, aug, b, *f, {0, 1, 2}, scratch);
    aug.normalize = false;
    const SlotLayout bl = loader_layout(d, 4, false);
    SlotRing bytes(bl, 2, allocate_locked(2 * bl.slot_bytes()));
    auto u = bytes.acquire_free(0);
    fill_batch(d, s, aug, b, *u, {0, 1, 2}, scratch);
    std::vector<float> later(f->region<float>(0).size());
    normalize_images(u->region<std::uint8_t>(0).data(), later.data(), 4, 3, 5 * 7, aug);
    const auto direct = f->region<float>(0);
    const auto pixels = u->region<std::uint8_t>(0);
    for (std::size_t k = 0; k < later.size(); ++k) {
      ASSERT_EQ(later[k], direct[k]) << "batch " << b << " value " << k;
      const std::size_t ch = (k / 35) % 3;
      ASSERT_NEAR(later[k], (pixels[k] / 255.f - aug.mean[ch]) / aug.std[ch], 1e-5);
    }
  }
}

TEST(Augment, DataSampleIsWhatTheLoaderWrites) {
  // augmented_sample (what `kdflow data sample` writes, checked against torchvision by
  // scripts/check_augment.py) is byte for byte the loader's uint8 slot, RandomResizedCrop, flip,
  // pad shift and colour jitter included; the draws follow (seed, epoch, index).
  const auto root = std::filesystem::temp_directory_path() /
                    ("kdflow_loader_sample_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  test::write_image_folder(root, 2, 5, 40, 52);
  ImageGeometry g{24, 32};
  g.random_resized = true;
  const Dataset d = Dataset::load("folder", root.string(), Split::train, g);
  SamplerConfig sc;
  sc.batch_size = 4;
  sc.seed = 11;
  const Sampler s(d.size(), sc);
  AugmentConfig aug;
  aug.normalize = false;
  aug.hflip = true;
  aug.pad_crop = 1;
  aug.jitter = {0.4f, 0.4f, 0.4f, 0.1f};
  const SlotLayout layout = loader_layout(d, 4, false);
  LoaderScratch scratch;
  SampleScratch alone;
  std::vector<std::uint8_t> one(d.sample_bytes());
  std::set<std::string> crops;
  for (std::uint64_t b = 0; b < 5; ++b) {
    SlotRing ring(layout, 2, allocate_locked(2 * layout.slot_bytes()));
    auto slot = ring.acquire_free(0);
    fill_batch(d, s, aug, b, *slot, {0, 1, 2}, scratch);
    const auto pixels = slot->region<std::uint8_t>(0);
    const auto ids = slot->region<std::int64_t>(2);
    const std::uint64_t epoch = b / s.batches_per_epoch();
    for (std::size_t i = 0; i < slot->header().samples; ++i) {
      const auto index = static_cast<std::uint32_t>(ids[i]);
      const SampleDraw draw = draw_sample(aug, sc.seed, epoch, index);
      const auto decoded = augmented_sample(d, index, draw, alone, one.data());
      EXPECT_TRUE(std::equal(one.begin(), one.end(), pixels.begin() + i * one.size()))
          << "batch " << b << " sample " << index;
      EXPECT_EQ(decoded.box,
                random_resized_crop_box(decoded.height, decoded.width, g.range, draw.crop.key));
      crops.insert(std::string(one.begin(), one.end()));
    }
  }
  EXPECT_GT(crops.size(), 15u) << "the crops differ from sample to sample and epoch to epoch";
  std::filesystem::remove_all(root);
}

// The jitter's draw is a function of its key; each factor within its range, the order a permutation
// that varies, an adjustment that is off never applied; a grey image keeps its saturation and hue
// (torchvision's tensor functions leave them), and factors of 1 and 0 leave an image as it was.
TEST(ColorJitter, DrawsAreKeyedAndWithinRangeAndGreyImagesKeepSaturationAndHue) {
  const JitterRanges r{0.4f, 0.2f, 0.6f, 0.1f};
  std::set<std::array<int, 4>> orders;
  for (std::uint64_t key = 0; key < 200; ++key) {
    const JitterDraw d = draw_jitter(r, key);
    const JitterDraw again = draw_jitter(r, key);
    EXPECT_EQ(d.order, again.order);
    EXPECT_EQ(d.brightness, again.brightness);
    EXPECT_EQ(d.hue, again.hue);
    EXPECT_TRUE(d.on);
    auto sorted = d.order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::array<int, 4>{0, 1, 2, 3}));
    orders.insert(d.order);
    EXPECT_GE(d.brightness, 0.6f);
    EXPECT_LE(d.brightness, 1.4f);
    EXPECT_GE(d.contrast, 0.8f);
    EXPECT_LE(d.contrast, 1.2f);
    EXPECT_GE(d.saturation, 0.4f);
    EXPECT_LE(d.saturation, 1.6f);
    EXPECT_GE(d.hue, -0.1f);
    EXPECT_LE(d.hue, 0.1f);
  }
  EXPECT_GT(orders.size(), 12u);
  EXPECT_FALSE(draw_jitter(JitterRanges{}, 7).on);
  const JitterDraw only_hue = draw_jitter(JitterRanges{0, 0, 0, 0.2f}, 7);
  EXPECT_EQ(only_hue.applies, (std::array<bool, 4>{false, false, false, true}));

  std::mt19937 rng(3);
  std::vector<std::uint8_t> grey(5 * 6);
  for (auto& v : grey) v = static_cast<std::uint8_t>(rng() & 0xff);
  auto image = grey;
  color_jitter(image.data(), 1, 5, 6, draw_jitter(JitterRanges{0, 0, 0.9f, 0.4f}, 1));
  EXPECT_EQ(image, grey);
  std::vector<std::uint8_t> rgb(3 * 5 * 6);
  for (auto& v : rgb) v = static_cast<std::uint8_t>(rng() & 0xff);
  JitterDraw identity = draw_jitter(JitterRanges{0.1f, 0.1f, 0.1f, 0}, 2);
  identity.brightness = identity.contrast = identity.saturation = 1.f;
  image = rgb;
  color_jitter(image.data(), 3, 5, 6, identity);
  EXPECT_EQ(image, rgb);
  JitterDraw darker = identity;
  darker.brightness = 0.5f;
  image = rgb;
  color_jitter(image.data(), 3, 5, 6, darker);
  for (std::size_t k = 0; k < rgb.size(); ++k)
    EXPECT_EQ(image[k], static_cast<std::uint8_t>(0.5f * static_cast<float>(rgb[k]))) << k;
}

// Runs `workers` loader threads over `batches` batches and returns a checksum per batch.
std::vector<std::uint64_t> load_with(int workers, const Dataset& d, std::uint64_t batches,
                                     std::size_t batch_size = 64) {
  oneapi::tbb::global_control parallelism(oneapi::tbb::global_control::max_allowed_parallelism,
                                          static_cast<std::size_t>(workers) + 1);
  SamplerConfig sc;
  sc.batch_size = batch_size;
  sc.seed = 1234;
  const Sampler s(d.size(), sc);
  AugmentConfig aug;
  aug.pad_crop = 2;
  aug.hflip = true;
  aug.mean.assign(static_cast<std::size_t>(d.channels()), 0.286f);
  aug.std.assign(static_cast<std::size_t>(d.channels()), 0.353f);
  const SlotLayout layout = loader_layout(d, batch_size, true);
  SlotRing ring(layout, 4, allocate_locked(4 * layout.slot_bytes()));
  oneapi::tbb::task_arena arena(workers, 0);
  StageTotals totals;
  auto loaders = start_loaders(arena, workers, ring, d, s, aug, {0, 1, 2}, 0, batches,
                               SlotState::ready, &totals);
  std::vector<std::uint64_t> sums;
  for (std::uint64_t b = 0; b < batches; ++b) {
    auto slot = ring.acquire_ready(b);
    std::uint64_t h = 1469598103934665603ull;
    const auto* bytes = reinterpret_cast<const unsigned char*>(slot->data());
    for (std::size_t k = sizeof(SlotHeader); k < layout.slot_bytes(); ++k)
      h = (h ^ bytes[k]) * 1099511628211ull;
    sums.push_back(h ^ slot->header().samples);
    ring.release(*slot);
  }
  ring.close();
  loaders->wait();
  EXPECT_EQ(totals.batches.load(), batches);
  return sums;
}

TEST(Loader, BatchesAreByteIdenticalWithOneAndTwoThreads) {
  const Dataset d =
      Dataset::load("fashion-mnist", "/usr/share/datasets/fashion-mnist", Split::test);
  const std::uint64_t batches =
      Sampler(d.size(), SamplerConfig{64}).batches_per_epoch() + 20; // into epoch 2
  const auto one = load_with(1, d, batches);
  const auto two = load_with(2, d, batches);
  EXPECT_EQ(one, two);
  EXPECT_EQ(std::set<std::uint64_t>(one.begin(), one.end()).size(), one.size()); // batches differ
}

TEST(Loader, ImageFolderBatchesAreByteIdenticalWithOneAndTwoThreads) {
  // Decoded on the loader threads, random crops of the resized images: still a function of (seed,
  // epoch, sample) alone.
  const auto root = std::filesystem::temp_directory_path() /
                    ("kdflow_loader_folder_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  test::write_image_folder(root, 3, 8, 40, 52);
  const Dataset d = Dataset::load("folder", root.string(), Split::train, {24, 32});
  const std::uint64_t batches = Sampler(d.size(), SamplerConfig{4}).batches_per_epoch() * 2 + 3;
  const auto one = load_with(1, d, batches, 4);
  const auto two = load_with(2, d, batches, 4);
  EXPECT_EQ(one, two);
  EXPECT_EQ(std::set<std::uint64_t>(one.begin(), one.end()).size(), one.size());
  std::filesystem::remove_all(root);
}

// One batch of `d` written by fill_batch into a float32 (or uint8) slot with `aug`: the slot's
// inputs, labels and, when mixed, its mix regions.
struct FilledBatch {
  std::vector<float> inputs;
  std::vector<std::int64_t> labels, mix_labels;
  std::vector<float> mix_lam;
  std::uint32_t samples = 0;
};
FilledBatch fill_one(const Dataset& d, const Sampler& s, const AugmentConfig& aug,
                     std::uint64_t batch) {
  const std::size_t b = s.config().batch_size;
  const SlotLayout layout =
      loader_layout(d, b, aug.normalize, aug.mixes() ? mix_regions(b) : std::vector<RegionSpec>{});
  std::vector<float> memory(layout.slot_bytes() / sizeof(float) + 1);
  const Slot slot(0, 0, reinterpret_cast<std::byte*>(memory.data()), &layout);
  const LoaderRegions regions = loader_regions(layout);
  LoaderScratch scratch;
  fill_batch(d, s, aug, batch, slot, regions, scratch);
  FilledBatch out;
  out.samples = slot.header().samples;
  if (aug.normalize) {
    const auto in = slot.region<float>(regions.inputs);
    out.inputs.assign(in.begin(), in.end());
  } else {
    const auto in = slot.region<std::uint8_t>(regions.inputs);
    out.inputs.assign(in.begin(), in.end());
  }
  const auto labels = slot.region<std::int64_t>(regions.labels);
  out.labels.assign(labels.begin(), labels.end());
  if (regions.mix_labels) {
    const auto p = slot.region<std::int64_t>(*regions.mix_labels);
    const auto l = slot.region<float>(*regions.mix_lam);
    out.mix_labels.assign(p.begin(), p.end());
    out.mix_lam.assign(l.begin(), l.end());
  }
  return out;
}

TEST(Mix, BatchesAreMixedWithTheirRollAsTorchvisionDefinesIt) {
  // Each sample of a mixed batch is, from the same batch unmixed: mixup lam * x[i] + (1 - lam) *
  // x[i - 1] (x[-1] the last valid sample), cutmix x[i] with the box from x[i - 1]; the partner's
  // label and the share of the sample's own are in the slot; a short last batch mixes its valid
  // samples only. Float32 and uint8 slots (rounded to the nearest level).
  const Dataset d =
      Dataset::load("fashion-mnist", "/usr/share/datasets/fashion-mnist", Split::test);
  SamplerConfig sc;
  sc.batch_size = 7;
  sc.seed = 5;
  sc.drop_last = false;
  const Sampler s(d.size(), sc);
  const std::size_t elems = d.sample_bytes();
  std::map<BatchMix::Kind, int> kinds;
  for (const bool as_float : {true, false}) {
    AugmentConfig plain;
    plain.normalize = as_float;
    plain.hflip = true;
    plain.mean = {0.286f};
    plain.std = {0.353f};
    AugmentConfig mixed = plain;
    mixed.mixup_alpha = 0.8;
    mixed.cutmix_alpha = 1.0;
    const std::uint64_t last = s.batches_per_epoch() - 1; // 10000 = 1428 * 7 + 4: short
    for (const std::uint64_t b :
         {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{3}, std::uint64_t{4},
          std::uint64_t{5}, last, last + 1, last + 2}) {
      const FilledBatch a = fill_one(d, s, plain, b), m = fill_one(d, s, mixed, b);
      const std::uint64_t epoch = b / s.batches_per_epoch();
      const BatchMix mix =
          draw_batch_mix(mixed, sc.seed, epoch, b % s.batches_per_epoch(), 0, 28, 28);
      ASSERT_NE(mix.kind, BatchMix::Kind::none);
      ++kinds[mix.kind];
      ASSERT_EQ(a.samples, m.samples);
      ASSERT_EQ(a.labels, m.labels);
      const std::size_t n = m.samples;
      EXPECT_EQ(n, b == last ? 4u : 7u);
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t j = (i + n - 1) % n;
        EXPECT_EQ(m.mix_labels[i], a.labels[j]);
        EXPECT_FLOAT_EQ(m.mix_lam[i], static_cast<float>(mix.target_lam));
        for (std::size_t k = 0; k < elems; ++k) {
          const float own = a.inputs[i * elems + k], other = a.inputs[j * elems + k];
          float want = own;
          if (mix.kind == BatchMix::Kind::mixup) {
            want = other * static_cast<float>(1.0 - mix.lam) + own * static_cast<float>(mix.lam);
          } else {
            const int y = static_cast<int>(k % 784 / 28), x = static_cast<int>(k % 28);
            if (y >= mix.y1 && y < mix.y2 && x >= mix.x1 && x < mix.x2) want = other;
          }
          const float got = m.inputs[i * elems + k];
          ASSERT_NEAR(got, want, as_float ? 1e-5f : 0.5f)
              << "batch " << b << " sample " << i << " value " << k;
        }
      }
      for (std::size_t i = n; i < sc.batch_size; ++i) {
        EXPECT_EQ(m.mix_labels[i], -1);
        EXPECT_EQ(m.mix_lam[i], 1.f);
      }
    }
  }
  EXPECT_GT(kinds[BatchMix::Kind::mixup], 0);
  EXPECT_GT(kinds[BatchMix::Kind::cutmix], 0);
}

TEST(Mix, DrawsFollowBetaAndTorchvisionsCutMixBox) {
  // lam ~ Beta(alpha, alpha): mean 1/2 and variance 1 / (4 (2 alpha + 1)) over many batches (the
  // draws are fixed by their keys, so this cannot flake); each kind at even odds with both on;
  // the CutMix box is torchvision's from its corner draws and lam, target_lam its area's
  // complement; draws are the same for the same key and differ between batches, epochs and ranks.
  for (const double alpha : {0.2, 0.8, 1.0, 4.0}) {
    AugmentConfig a;
    a.mixup_alpha = alpha;
    a.cutmix_alpha = alpha;
    const int n = 20000;
    double sum = 0, sq = 0;
    int cut = 0;
    for (int b = 0; b < n; ++b) {
      const BatchMix m = draw_batch_mix(a, 11, 3, static_cast<std::uint64_t>(b), 0, 30, 40);
      ASSERT_GE(m.lam, 0.0);
      ASSERT_LE(m.lam, 1.0);
      sum += m.lam;
      sq += m.lam * m.lam;
      if (m.kind == BatchMix::Kind::cutmix) {
        ++cut;
        const double half = 0.5 * std::sqrt(1.0 - m.lam);
        const int hw = static_cast<int>(half * 40), hh = static_cast<int>(half * 30);
        ASSERT_TRUE(m.centre_x >= 0 && m.centre_x < 40 && m.centre_y >= 0 && m.centre_y < 30);
        EXPECT_EQ(m.x1, std::max(0, m.centre_x - hw));
        EXPECT_EQ(m.x2, std::min(40, m.centre_x + hw));
        EXPECT_EQ(m.y1, std::max(0, m.centre_y - hh));
        EXPECT_EQ(m.y2, std::min(30, m.centre_y + hh));
        EXPECT_DOUBLE_EQ(m.target_lam, 1.0 - (m.x2 - m.x1) * (m.y2 - m.y1) / 1200.0);
      } else {
        EXPECT_EQ(m.target_lam, m.lam);
      }
    }
    const double mean = sum / n, var = sq / n - mean * mean;
    EXPECT_NEAR(mean, 0.5, 0.01) << "alpha " << alpha;
    EXPECT_NEAR(var, 1.0 / (4.0 * (2.0 * alpha + 1.0)), 0.01) << "alpha " << alpha;
    EXPECT_NEAR(static_cast<double>(cut) / n, 0.5, 0.02) << "alpha " << alpha;
  }
  AugmentConfig only_mixup;
  only_mixup.mixup_alpha = 1.0;
  AugmentConfig off;
  for (int b = 0; b < 100; ++b) {
    EXPECT_EQ(draw_batch_mix(only_mixup, 1, 0, static_cast<std::uint64_t>(b), 0, 8, 8).kind,
              BatchMix::Kind::mixup);
    EXPECT_EQ(draw_batch_mix(off, 1, 0, static_cast<std::uint64_t>(b), 0, 8, 8).kind,
              BatchMix::Kind::none);
  }
  AugmentConfig eval = only_mixup;
  eval.augment = false;
  EXPECT_EQ(draw_batch_mix(eval, 1, 0, 0, 0, 8, 8).kind, BatchMix::Kind::none);
  const double base = draw_batch_mix(only_mixup, 1, 2, 3, 0, 8, 8).lam;
  EXPECT_EQ(draw_batch_mix(only_mixup, 1, 2, 3, 0, 8, 8).lam, base);
  EXPECT_NE(draw_batch_mix(only_mixup, 1, 2, 4, 0, 8, 8).lam, base);
  EXPECT_NE(draw_batch_mix(only_mixup, 1, 3, 3, 0, 8, 8).lam, base);
  EXPECT_NE(draw_batch_mix(only_mixup, 1, 2, 3, 1, 8, 8).lam, base);
  EXPECT_NE(draw_batch_mix(only_mixup, 2, 2, 3, 0, 8, 8).lam, base);
}

} // namespace
} // namespace kdflow
