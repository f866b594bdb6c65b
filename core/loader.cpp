// Sampler (Feistel permutation keyed by seed and epoch), augmentation and loader workers.
#include "kdflow/core/loader.hpp"

#include "kdflow/core/digest.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/fault_hooks.hpp"
#include "kdflow/core/image_adapter.hpp"
#include "kdflow/core/trace.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numbers>
#include <type_traits>

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

// Uniform, normal, gamma and beta draws from one key (splitmix64 over a counter): a batch's mix
// depends on its key alone.
class KeyedDraws {
public:
  explicit KeyedDraws(std::uint64_t key) : key_(key) {}
  // [0, 1), 53 bits
  double uniform() {
    return static_cast<double>(splitmix64(key_ + 0x9e3779b97f4a7c15ull * ++count_) >> 11) *
           0x1.0p-53;
  }
  double normal() { // Box-Muller
    const double u = 1.0 - uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * uniform());
  }
  double gamma(double a) { // Marsaglia and Tsang; a < 1 through Gamma(a + 1) * U^(1/a)
    if (a < 1.0) return gamma(a + 1.0) * std::pow(1.0 - uniform(), 1.0 / a);
    const double d = a - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      const double x = normal();
      double v = 1.0 + c * x;
      if (v <= 0) continue;
      v = v * v * v;
      const double u = 1.0 - uniform();
      if (u < 1.0 - 0.0331 * x * x * x * x ||
          std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v)))
        return d * v;
    }
  }
  double beta(double a) {
    const double x = gamma(a), y = gamma(a);
    return x + y > 0 ? x / (x + y) : 0.5;
  }

private:
  std::uint64_t key_;
  std::uint64_t count_ = 0;
};

// Mixes the batch's n samples of `elems` values each in place as `m` says (BatchMix), sample i
// with sample i - 1 and sample 0 with the last one's copy in `last`; float values as torchvision
// computes them (roll * (1 - lam) + x * lam), uint8 ones the same, rounded to the nearest level.
template <typename T>
void mix_samples(T* x, std::size_t n, int channels, int h, int w, const BatchMix& m,
                 std::vector<std::byte>& last) {
  const std::size_t plane = static_cast<std::size_t>(h) * static_cast<std::size_t>(w);
  const std::size_t elems = plane * static_cast<std::size_t>(channels);
  last.resize(elems * sizeof(T));
  std::memcpy(last.data(), x + (n - 1) * elems, elems * sizeof(T));
  const auto* saved = reinterpret_cast<const T*>(last.data());
  const float own = static_cast<float>(m.lam), other = static_cast<float>(1.0 - m.lam);
  for (std::size_t i = n; i-- > 0;) {
    T* self = x + i * elems;
    const T* partner = i > 0 ? x + (i - 1) * elems : saved;
    if (m.kind == BatchMix::Kind::mixup) {
      for (std::size_t k = 0; k < elems; ++k) {
        const float v = static_cast<float>(partner[k]) * other + static_cast<float>(self[k]) * own;
        if constexpr (std::is_same_v<T, float>)
          self[k] = v;
        else
          self[k] = static_cast<T>(std::clamp(v, 0.f, 255.f) + 0.5f);
      }
      continue;
    }
    for (int c = 0; c < channels; ++c)
      for (int y = m.y1; y < m.y2; ++y) {
        const std::size_t row = static_cast<std::size_t>(c) * plane +
                                static_cast<std::size_t>(y) * static_cast<std::size_t>(w);
        std::copy(partner + row + m.x1, partner + row + m.x2, self + row + m.x1);
      }
  }
}

} // namespace

const char* mix_kind_name(BatchMix::Kind kind) {
  switch (kind) {
  case BatchMix::Kind::mixup: return "mixup";
  case BatchMix::Kind::cutmix: return "cutmix";
  case BatchMix::Kind::none: break;
  }
  return "none";
}

BatchMix draw_batch_mix(const AugmentConfig& a, std::uint64_t seed, std::uint64_t epoch,
                        std::uint64_t batch, int rank, int height, int width) {
  BatchMix m;
  if (!a.mixes()) return m;
  KeyedDraws r(
      splitmix64(seed ^ 0x6d69786d6978ull) ^
      splitmix64(epoch * 0x9e3779b97f4a7c15ull ^ batch ^ (static_cast<std::uint64_t>(rank) << 40)));
  const bool cut = a.cutmix_alpha > 0 && (a.mixup_alpha <= 0 || r.uniform() < 0.5);
  m.lam = r.beta(cut ? a.cutmix_alpha : a.mixup_alpha);
  if (!cut) {
    m.kind = BatchMix::Kind::mixup;
    m.target_lam = m.lam;
    return m;
  }
  // torchvision's _CutMix: r_x = randint(W), r_y = randint(H), half sides int(r * W), int(r * H)
  // with r = sqrt(1 - lam) / 2, clamped to the image.
  m.kind = BatchMix::Kind::cutmix;
  m.centre_x = std::min(width - 1, static_cast<int>(r.uniform() * width));
  m.centre_y = std::min(height - 1, static_cast<int>(r.uniform() * height));
  const double half = 0.5 * std::sqrt(1.0 - m.lam);
  const int half_w = static_cast<int>(half * width), half_h = static_cast<int>(half * height);
  m.x1 = std::max(m.centre_x - half_w, 0);
  m.y1 = std::max(m.centre_y - half_h, 0);
  m.x2 = std::min(m.centre_x + half_w, width);
  m.y2 = std::min(m.centre_y + half_h, height);
  m.target_lam = 1.0 - static_cast<double>((m.x2 - m.x1) * (m.y2 - m.y1)) /
                           (static_cast<double>(width) * height);
  return m;
}

LoaderRegions loader_regions(const SlotLayout& layout) {
  LoaderRegions r{layout.index_of("inputs"), layout.index_of("labels"), layout.index_of("ids")};
  for (std::size_t k = 0; k < layout.regions().size(); ++k) {
    if (layout.regions()[k].spec.name == "mix_labels") r.mix_labels = k;
    if (layout.regions()[k].spec.name == "mix_lam") r.mix_lam = k;
  }
  return r;
}

std::vector<RegionSpec> mix_regions(std::size_t batch_size) {
  const auto b = static_cast<std::int64_t>(batch_size);
  return {{"mix_labels", DType::i64, {b}}, {"mix_lam", DType::f32, {b}}};
}

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

namespace {

// A sample's planes `src` shifted, mirrored and colour-jittered per `draw`, as uint8, into `out`.
void augment_u8(const std::uint8_t* src, std::uint8_t* out, int c, int h, int w,
                const SampleDraw& draw) {
  const std::size_t plane = static_cast<std::size_t>(h) * w;
  for (int ch = 0; ch < c; ++ch) {
    const auto k = static_cast<std::size_t>(ch);
    shift_plane(src + k * plane, out + k * plane, h, w, draw.dy, draw.dx, draw.flip,
                [](std::uint8_t v) { return v; });
  }
  color_jitter(out, c, h, w, draw.jitter);
}

} // namespace

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
  if (aug.jitters()) d.jitter = draw_jitter(aug.jitter, splitmix64(q ^ 0x6a6974746572ull));
  return d;
}

ImageDecoder::Decoded augmented_sample(const Dataset& d, std::uint32_t index,
                                       const SampleDraw& draw, SampleScratch& scratch,
                                       std::uint8_t* out) {
  ImageDecoder::Decoded decoded;
  augment_u8(d.sample(index, scratch, draw.crop, &decoded).data(), out, d.channels(), d.height(),
             d.width(), draw);
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
    // The sample's planes into the slot, shifted and mirrored, normalized or not.
    const auto write = [&](const std::uint8_t* from, int sy, int sx, bool mirror) {
      for (int ch = 0; ch < c; ++ch) {
        const auto k = static_cast<std::size_t>(ch);
        const std::uint8_t* plane_in = from + k * plane;
        const std::size_t base = (i * static_cast<std::size_t>(c) + k) * plane;
        if (as_float) {
          const float scale = channel_scale(aug, k), shift = channel_shift(aug, k);
          shift_plane(plane_in, out_f + base, h, w, sy, sx, mirror,
                      [=](std::uint8_t v) { return static_cast<float>(v) * scale + shift; });
        } else {
          shift_plane(plane_in, out_u + base, h, w, sy, sx, mirror,
                      [](std::uint8_t v) { return v; });
        }
      }
    };
    if (!draw.jitter.on) {
      write(src, dy, dx, flip);
      continue;
    }
    // Jittered: shifted, mirrored and jittered as uint8 first, then written as it is.
    scratch.jittered.resize(static_cast<std::size_t>(c) * plane);
    augment_u8(src, scratch.jittered.data(), c, h, w, draw);
    write(scratch.jittered.data(), 0, 0, false);
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
  if (aug.mixes()) {
    if (!regions.mix_labels || !regions.mix_lam)
      throw std::logic_error("fill_batch: mixed batches need the slot's mix regions");
    auto partner = slot.region<std::int64_t>(*regions.mix_labels);
    auto share = slot.region<float>(*regions.mix_lam);
    std::fill(partner.begin(), partner.end(), std::int64_t{-1});
    std::fill(share.begin(), share.end(), 1.f);
    const std::size_t n = indices.size();
    const BatchMix m =
        draw_batch_mix(aug, sampler.config().seed, epoch, b, sampler.config().rank, h, w);
    if (n > 0 && m.kind != BatchMix::Kind::none) {
      if (as_float)
        mix_samples(out_f, n, c, h, w, m, scratch.mix_last);
      else
        mix_samples(out_u, n, c, h, w, m, scratch.mix_last);
      for (std::size_t i = 0; i < n; ++i) {
        partner[i] = labels[(i + n - 1) % n];
        share[i] = static_cast<float>(m.target_lam);
      }
    }
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
