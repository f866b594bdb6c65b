// Sampler (Feistel permutation keyed by seed and epoch), augmentation and loader workers.
#include "kdflow/core/loader.hpp"

#include "kdflow/core/digest.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/fault_hooks.hpp"
#include "kdflow/core/image_adapter.hpp"
#include "kdflow/core/trace.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include <fmt/format.h>

namespace kdflow {
namespace {

// One h x w plane, shifted by (dy, dx) (zeros where the shift uncovers nothing) and mirrored if
// `flip`, through `convert`. Row by row over the valid columns only, so that the inner loops have
// no branches and vectorize: this loop is the loader's cost after decoding.
template <typename Out, typename Convert>
void shift_plane(const std::uint8_t* src, Out* dst, int h, int w, int dy, int dx, bool flip,
                 Convert convert) {
  const Out zero = convert(0);
  // Output column x reads source column (flip ? w - 1 - x : x) + dx, valid within [0, w).
  const int lo = flip ? std::max(0, dx) : std::max(0, -dx);
  const int hi = flip ? std::min(w, w + dx) : std::min(w, w - dx);
  for (int y = 0; y < h; ++y) {
    Out* out = dst + static_cast<std::ptrdiff_t>(y) * w;
    const int sy = y + dy;
    if (sy < 0 || sy >= h || lo >= hi) {
      std::fill_n(out, w, zero);
      continue;
    }
    const std::uint8_t* row = src + static_cast<std::ptrdiff_t>(sy) * w;
    std::fill_n(out, lo, zero);
    if (flip) {
      const std::uint8_t* mirrored = row + (w - 1 + dx);
      for (int x = lo; x < hi; ++x) out[x] = convert(mirrored[-x]);
    } else {
      const std::uint8_t* shifted = row + dx;
      for (int x = lo; x < hi; ++x) out[x] = convert(shifted[x]);
    }
    std::fill_n(out + hi, w - hi, zero);
  }
}

// Half the bits of the smallest power of two holding [0, size) (at least 2 bits in all).
int half_bits(std::size_t size) {
  const int bits =
      std::max(2, static_cast<int>(std::bit_width(std::max<std::size_t>(size - 1, 1))));
  return (bits + 1) / 2;
}

// A 4-round Feistel network on 2 * half_bits bits, cycle-walked into [0, size): a bijection keyed
// by `key`, evaluated per position without storing the permutation.
std::uint32_t feistel(std::uint64_t key, std::uint32_t k, std::size_t size, int half_bits) {
  const std::uint32_t mask = (1u << half_bits) - 1;
  std::uint32_t x = k;
  do {
    std::uint32_t l = x >> half_bits, r = x & mask;
    for (std::uint64_t round = 0; round < 4; ++round) {
      const std::uint32_t f =
          static_cast<std::uint32_t>(splitmix64(key ^ (round << 32) ^ r)) & mask;
      const std::uint32_t nl = r;
      r = l ^ f;
      l = nl;
    }
    x = (l << half_bits) | r;
  } while (x >= size);
  return x;
}

} // namespace

float channel_scale(const AugmentConfig& a, std::size_t c) { return pixel_scale(a.std[c]); }
float channel_shift(const AugmentConfig& a, std::size_t c) {
  return pixel_shift(a.mean[c], a.std[c]);
}

Sampler::Sampler(std::size_t dataset_size, SamplerConfig config)
    : size_(dataset_size), config_(config) {
  if (config.batch_size == 0) throw InputError("data.batch_size must be at least 1");
  if (config.world < 1 || config.rank < 0 || config.rank >= config.world)
    throw InputError(
        fmt::format("rank {} of world {} is not a valid shard", config.rank, config.world));
  per_rank_ = size_ / static_cast<std::size_t>(config.world); // every rank the same count
  batches_ = config.drop_last ? per_rank_ / config.batch_size
                              : (per_rank_ + config.batch_size - 1) / config.batch_size;
  if (batches_ == 0)
    throw InputError(fmt::format("data.batch_size = {} is larger than this shard's {} samples",
                                 config.batch_size, per_rank_));
  half_bits_ = half_bits(size_);
  shard_half_bits_ = half_bits(per_rank_);
}

std::uint32_t Sampler::permute(std::uint64_t epoch, std::uint32_t k) const {
  if (!config_.shuffle) return k;
  return feistel(splitmix64(config_.seed * 0x100000001b3ull ^ splitmix64(epoch + 1)), k, size_,
                 half_bits_);
}

void Sampler::batch_indices(std::uint64_t epoch, std::size_t b,
                            std::vector<std::uint32_t>& out) const {
  const std::size_t first = b * config_.batch_size;
  const std::size_t n = std::min(config_.batch_size, per_rank_ - first);
  const bool fixed = config_.fixed_shards && config_.world > 1 && config_.shuffle;
  // Fixed shards: the epoch's order within the shard, then the shard's samples in the epoch-0
  // permutation (the same set every epoch).
  const std::uint64_t shard_key =
      splitmix64(config_.seed * 0x100000001b3ull ^ splitmix64(epoch + 1) ^ 0x5eed5a4dull);
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t k = fixed ? feistel(shard_key, static_cast<std::uint32_t>(first + i),
                                          per_rank_, shard_half_bits_)
                                : first + i;
    const std::size_t position =
        k * static_cast<std::size_t>(config_.world) + static_cast<std::size_t>(config_.rank);
    out[i] = permute(fixed ? 0 : epoch, static_cast<std::uint32_t>(position));
  }
}

SlotLayout loader_layout(const Dataset& d, std::size_t batch_size, bool float_inputs,
                         std::vector<RegionSpec> extra) {
  const auto b = static_cast<std::int64_t>(batch_size);
  std::vector<RegionSpec> regions = {
      {"inputs", float_inputs ? DType::f32 : DType::u8, {b, d.channels(), d.height(), d.width()}},
      {"labels", DType::i64, {b}},
      {"ids", DType::i64, {b}},
  };
  for (auto& r : extra) regions.push_back(std::move(r));
  return SlotLayout(std::move(regions));
}

SampleDraw draw_sample(const AugmentConfig& aug, std::uint64_t seed, std::uint64_t epoch,
                       std::uint32_t index) {
  SampleDraw d;
  if (!aug.augment) return d;
  const std::uint64_t r = splitmix64(seed ^ splitmix64(epoch * 0x9e3779b97f4a7c15ull ^ index));
  if (const int p = aug.pad_crop; p > 0) {
    d.dy = static_cast<int>(r % static_cast<std::uint64_t>(2 * p + 1)) - p;
    d.dx = static_cast<int>((r >> 16) % static_cast<std::uint64_t>(2 * p + 1)) - p;
  }
  d.flip = aug.hflip && ((r >> 40) & 1) != 0;
  const std::uint64_t q = splitmix64(r);
  d.crop.y = static_cast<float>(q & 0xffff) / 65535.f;
  d.crop.x = static_cast<float>((q >> 16) & 0xffff) / 65535.f;
  d.crop.random = true; // a RandomResizedCrop where the geometry asks for one, its draws from key
  d.crop.key = splitmix64(q ^ 0x7272637265736eull);
  return d;
}

ImageDecoder::Decoded augmented_sample(const Dataset& d, std::uint32_t index,
                                       const SampleDraw& draw, SampleScratch& scratch,
                                       std::uint8_t* out) {
  ImageDecoder::Decoded decoded;
  const std::uint8_t* src = d.sample(index, scratch, draw.crop, &decoded).data();
  const int h = d.height(), w = d.width();
  const std::size_t plane = static_cast<std::size_t>(h) * w;
  for (int ch = 0; ch < d.channels(); ++ch) {
    const auto k = static_cast<std::size_t>(ch);
    shift_plane(src + k * plane, out + k * plane, h, w, draw.dy, draw.dx, draw.flip,
                [](std::uint8_t v) { return v; });
  }
  return decoded;
}

void fill_batch(const Dataset& d, const Sampler& sampler, const AugmentConfig& aug,
                std::uint64_t global_batch, const Slot& slot, const LoaderRegions& regions,
                LoaderScratch& scratch) {
  auto& indices = scratch.indices;
  const std::size_t per_epoch = sampler.batches_per_epoch();
  const std::uint64_t epoch = global_batch / per_epoch;
  const std::size_t b = global_batch % per_epoch;
  sampler.batch_indices(epoch, b, indices);
  const int c = d.channels(), h = d.height(), w = d.width();
  const std::size_t plane = static_cast<std::size_t>(h) * w;
  const bool as_float = aug.normalize;
  auto labels = slot.region<std::int64_t>(regions.labels);
  auto ids = slot.region<std::int64_t>(regions.ids);
  float* out_f = as_float ? slot.region<float>(regions.inputs).data() : nullptr;
  std::uint8_t* out_u = as_float ? nullptr : slot.region<std::uint8_t>(regions.inputs).data();
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const std::uint32_t index = indices[i];
    labels[i] = d.label(index);
    ids[i] = index;
    // Per-sample randomness from (seed, epoch, index) alone: independent of threads and timing.
    const SampleDraw draw = draw_sample(aug, sampler.config().seed, epoch, index);
    const int dy = draw.dy, dx = draw.dx;
    const bool flip = draw.flip;
    const std::uint8_t* src = d.sample(index, scratch.sample, draw.crop).data();
    for (int ch = 0; ch < c; ++ch) {
      const auto k = static_cast<std::size_t>(ch);
      const std::uint8_t* plane_in = src + k * plane;
      const std::size_t base = (i * static_cast<std::size_t>(c) + k) * plane;
      if (as_float) {
        const float scale = channel_scale(aug, k), shift = channel_shift(aug, k);
        shift_plane(plane_in, out_f + base, h, w, dy, dx, flip,
                    [=](std::uint8_t v) { return static_cast<float>(v) * scale + shift; });
      } else {
        shift_plane(plane_in, out_u + base, h, w, dy, dx, flip, [](std::uint8_t v) { return v; });
      }
    }
  }
  // A short last batch: the rest of the slot holds zeros and label -1, and the header says so.
  const std::size_t cap = labels.size();
  for (std::size_t i = indices.size(); i < cap; ++i) {
    labels[i] = -1;
    ids[i] = -1;
  }
  if (indices.size() < cap) {
    const std::size_t from = indices.size() * static_cast<std::size_t>(c) * plane;
    const std::size_t count = (cap - indices.size()) * static_cast<std::size_t>(c) * plane;
    if (as_float)
      std::fill_n(out_f + from, count, 0.f);
    else
      std::fill_n(out_u + from, count, std::uint8_t{0});
  }
  slot.header().samples = static_cast<std::uint32_t>(indices.size());
  slot.header().epoch = static_cast<std::uint32_t>(epoch);
}

void normalize_images(const std::uint8_t* src, float* dst, std::size_t samples, int channels,
                      std::size_t plane, const AugmentConfig& augment) {
  for (std::size_t i = 0; i < samples * static_cast<std::size_t>(channels); ++i) {
    const std::size_t ch = i % static_cast<std::size_t>(channels);
    const float scale = channel_scale(augment, ch), shift = channel_shift(augment, ch);
    const std::uint8_t* in = src + i * plane;
    float* out = dst + i * plane;
    for (std::size_t k = 0; k < plane; ++k) out[k] = static_cast<float>(in[k]) * scale + shift;
  }
}

std::vector<float> normalized_images(const Dataset& dataset, const AugmentConfig& augment) {
  return normalized_images(dataset, augment, 0, dataset.size());
}

std::vector<float> normalized_images(const Dataset& dataset, const AugmentConfig& augment,
                                     std::size_t first, std::size_t count) {
  if (first > dataset.size() || count > dataset.size() - first)
    throw std::out_of_range("normalized_images: samples past the dataset's end");
  std::vector<float> out(count * dataset.sample_bytes());
  SampleScratch scratch;
  normalize_samples(dataset, augment, first, count, 0, 1, out.data(), scratch);
  return out;
}

void normalize_samples(const Dataset& dataset, const AugmentConfig& augment, std::size_t first,
                       std::size_t count, std::size_t offset, std::size_t stride, float* out,
                       SampleScratch& scratch) {
  const std::size_t plane = static_cast<std::size_t>(dataset.height()) * dataset.width();
  for (std::size_t i = offset; i < count; i += stride)
    normalize_images(dataset.sample(first + i, scratch).data(), out + i * dataset.sample_bytes(), 1,
                     dataset.channels(), plane, augment);
}

std::unique_ptr<StageGraph> start_loaders(oneapi::tbb::task_arena& arena, int workers,
                                          SlotRing& ring, const Dataset& dataset,
                                          const Sampler& sampler, const AugmentConfig& augment,
                                          const LoaderRegions& regions, std::uint64_t first_batch,
                                          std::uint64_t end, SlotState publish_to,
                                          StageTotals* totals) {
  if (augment.normalize && (augment.mean.size() != static_cast<std::size_t>(dataset.channels()) ||
                            augment.std.size() != static_cast<std::size_t>(dataset.channels())))
    throw InputError(fmt::format("normalization needs {} mean and std values", dataset.channels()));
  // Scratch per worker, sized once (a decoder's buffers grow to the largest image): no allocation
  // per batch.
  auto scratch = std::make_shared<std::vector<LoaderScratch>>(static_cast<std::size_t>(workers));
  for (auto& s : *scratch) s.indices.reserve(sampler.config().batch_size);
  auto stage = std::make_unique<StageGraph>(
      "loader", arena, workers, ring, RingStage::loader, end,
      [&ring, &dataset, &sampler, &augment, regions, first_batch, publish_to,
       scratch](std::uint64_t b, int worker) {
        auto slot = ring.acquire_free(b);
        if (!slot) return false;
        fault::at(fault::Site::loader, first_batch + b, ring);
        {
          trace::Span span("load", b);
          fill_batch(dataset, sampler, augment, first_batch + b, *slot, regions,
                     (*scratch)[static_cast<std::size_t>(worker)]);
        }
        ring.publish(*slot, SlotState::filling, publish_to);
        return true;
      },
      totals, first_batch);
  stage->start();
  return stage;
}

} // namespace kdflow
