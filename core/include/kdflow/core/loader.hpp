// The loader stage: which samples make batch b (a seeded permutation per epoch, sharded by rank),
// how each is augmented (random crop with padding, horizontal flip, normalization), and workers
// that write batches straight into ring slots. A batch's bytes depend only on (seed, epoch, sample
// index): never on the number of loader threads or their timing.
#pragma once

#include "kdflow/core/color_jitter.hpp"
#include "kdflow/core/dataset.hpp"
#include "kdflow/core/slot_ring.hpp"
#include "kdflow/core/stage_graph.hpp"

#include <oneapi/tbb/task_arena.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace kdflow {

struct SamplerConfig {
  std::size_t batch_size = 128;
  std::uint64_t seed = 42;
  bool shuffle = true;
  bool drop_last = true;
  int rank = 0; // sharding for multi-process training: this process's share
  int world = 1;
  // Several ranks: each keeps the same samples every epoch (its shard of one fixed permutation),
  // in a fresh order each epoch, so that what it keeps of them (kd.cache) serves its later epochs.
  // false: each epoch's permutation is shared out anew (a global batch is then the same samples
  // as one process's batch of world x batch_size).
  bool fixed_shards = false;
};

class Sampler {
public:
  Sampler(std::size_t dataset_size, SamplerConfig config);
  [[nodiscard]] std::size_t batches_per_epoch() const { return batches_; }
  [[nodiscard]] const SamplerConfig& config() const { return config_; }
  // The dataset indices of batch `b` of `epoch` (fewer than batch_size only for a kept last batch).
  // Allocation-free: `out` is resized within its capacity.
  void batch_indices(std::uint64_t epoch, std::size_t b, std::vector<std::uint32_t>& out) const;
  // Position k of the epoch's permutation of [0, size): a keyed bijection, computed, not stored.
  [[nodiscard]] std::uint32_t permute(std::uint64_t epoch, std::uint32_t k) const;

private:
  std::size_t size_;
  std::size_t per_rank_;
  std::size_t batches_;
  SamplerConfig config_;
  int half_bits_;
  int shard_half_bits_; // fixed_shards: the permutation within a shard of per_rank_
};

struct AugmentConfig {
  int pad_crop = 0;        // random crop back to the image size after padding this many pixels
  bool hflip = false;      // random horizontal flip
  bool normalize = true;   // float32 output: (x / 255 - mean[c]) / std[c]; false: uint8 as stored
                           // (data.slot_dtype = uint8: the consumers normalize)
  std::vector<float> mean; // per channel
  std::vector<float> std;
  bool augment = true; // false: evaluation (no crop, no flip), normalization still applies
  // Batch mixing after the samples are written (training only): each batch is mixed with itself
  // rolled by one sample, as torchvision.transforms.v2.MixUp/CutMix do, with lam ~ Beta(alpha,
  // alpha); 0 turns one off. Both on: each batch draws one of them, either with odds 1/2 (timm's
  // switch probability). The teacher sees the mixed images; the CE target follows the mix.
  double mixup_alpha = 0;
  double cutmix_alpha = 0;
  [[nodiscard]] bool mixes() const { return augment && (mixup_alpha > 0 || cutmix_alpha > 0); }
  // torchvision's ColorJitter on each training sample after its crop and flip (color_jitter.hpp).
  JitterRanges jitter;
  [[nodiscard]] bool jitters() const { return augment && jitter.any(); }
};

// Normalization as one multiply and add per pixel, x * scale + shift = (x / 255 - mean) / std, the
// same wherever it is computed (loader, teacher input, the student's device).
float channel_scale(const AugmentConfig& augment, std::size_t channel);
float channel_shift(const AugmentConfig& augment, std::size_t channel);

// A sample's augmentation, drawn from (seed, epoch, dataset index) alone, so that it does not
// depend on threads or timing: the shift of a padded crop, where a decoded image's crop sits (or
// its RandomResizedCrop box's draws), and whether it is flipped. Evaluation (augment = false):
// none of them, the crop centred.
struct SampleDraw {
  int dy = 0, dx = 0;
  CropPosition crop;
  bool flip = false;
  JitterDraw jitter;
};
SampleDraw draw_sample(const AugmentConfig& augment, std::uint64_t seed, std::uint64_t epoch,
                       std::uint32_t index);

// Sample `index` as the loader writes it for `draw`, as uint8 pixels (C x H x W, before
// normalization) into `out`; returns what the decoder reports for a decoded image (else zeros).
ImageDecoder::Decoded augmented_sample(const Dataset& dataset, std::uint32_t index,
                                       const SampleDraw& draw, SampleScratch& scratch,
                                       std::uint8_t* out);

// One batch's mix (AugmentConfig::mixes), drawn from (seed, epoch, batch of the epoch, rank)
// alone. Sample i becomes lam * sample i + (1 - lam) * sample i - 1 (mixup; sample 0 takes the
// last one), or sample i with the box [y1, y2) x [x1, x2) from sample i - 1 (cutmix), as
// torchvision's v2 transforms compute them from the same draws: `lam` is the Beta draw,
// (centre_y, centre_x) cutmix's torch.randint corner draws, `target_lam` the share of sample i
// left (cutmix: 1 - the box's area share, torchvision's lam_adjusted).
struct BatchMix {
  enum class Kind { none, mixup, cutmix } kind = Kind::none;
  double lam = 1;
  double target_lam = 1;
  int centre_y = 0, centre_x = 0;
  int y1 = 0, y2 = 0, x1 = 0, x2 = 0;
};
BatchMix draw_batch_mix(const AugmentConfig& augment, std::uint64_t seed, std::uint64_t epoch,
                        std::uint64_t batch, int rank, int height, int width);
const char* mix_kind_name(BatchMix::Kind kind);

// Region indices of the slot layout the loader writes; the mix regions (the partner's label and
// the share of the sample's own label, per sample) only where the batches are mixed.
struct LoaderRegions {
  std::size_t inputs, labels, ids;
  std::optional<std::size_t> mix_labels = std::nullopt, mix_lam = std::nullopt;
};
LoaderRegions loader_regions(const SlotLayout& layout);

// The slot layout for `dataset` batches: inputs (f32 or u8), labels and sample ids (i64), then
// `extra`; mix_regions(batch_size) in `extra` where the batches are mixed.
SlotLayout loader_layout(const Dataset& dataset, std::size_t batch_size, bool float_inputs,
                         std::vector<RegionSpec> extra = {});
std::vector<RegionSpec> mix_regions(std::size_t batch_size);

// One loader body's working memory, grown once: the batch's dataset indices, the decoder and
// pixel buffer of a dataset decoded on demand, and the last sample's copy a mix reads.
struct LoaderScratch {
  std::vector<std::uint32_t> indices;
  SampleScratch sample;
  std::vector<std::byte> mix_last;
  std::vector<std::uint8_t> jittered; // a sample's pixels between its crop and its jitter
};

// Writes batch `global_batch` (epoch and position derived from the sampler) into `slot`. A dataset
// decoded on demand (an image folder) is decoded here, on the calling core, its crop placed at
// random when augmenting and centred otherwise. Mixed batches (AugmentConfig::mixes) are mixed
// last, over the batch's valid samples (regions.mix_labels and mix_lam must be there).
void fill_batch(const Dataset& dataset, const Sampler& sampler, const AugmentConfig& augment,
                std::uint64_t global_batch, const Slot& slot, const LoaderRegions& regions,
                LoaderScratch& scratch);

// `samples` C x H x W uint8 images to float32 (x / 255 - mean[c]) / std[c], computed exactly as the
// loader computes float32 slots, so that every consumer of uint8 slots sees the same values.
void normalize_images(const std::uint8_t* src, float* dst, std::size_t samples, int channels,
                      std::size_t plane, const AugmentConfig& augment);

// The whole dataset as float32 (x / 255 - mean[c]) / std[c], N x C x H x W: evaluation input.
std::vector<float> normalized_images(const Dataset& dataset, const AugmentConfig& augment);
// The same for samples [first, first + count) only (evaluation in bounded memory, a chunk at a
// time).
std::vector<float> normalized_images(const Dataset& dataset, const AugmentConfig& augment,
                                     std::size_t first, std::size_t count);
// The same into `out` ([count, C, H, W] float32), for samples first, first + stride, ... below
// first + count only (`offset` of `stride` workers filling one buffer together).
void normalize_samples(const Dataset& dataset, const AugmentConfig& augment, std::size_t first,
                       std::size_t count, std::size_t offset, std::size_t stride, float* out,
                       SampleScratch& scratch);

// Starts the loader stage in `arena`: `workers` bodies at once, each taking the next batch number,
// filling its slot and handing it on (`publish_to`: filled for the teacher, ready when no teacher
// runs), until ring batch `end` or close. Ring batch b holds the sampler's batch first_batch + b
// (a resumed run starts its ring at 0 mid-epoch). An exception fails the ring with stage "loader".
// ring, dataset, sampler and augment must outlive the returned stage (it waits when destroyed);
// regions are copied; `totals`, when given, accumulates the stage's figures (StageGraph).
std::unique_ptr<StageGraph> start_loaders(oneapi::tbb::task_arena& arena, int workers,
                                          SlotRing& ring, const Dataset& dataset,
                                          const Sampler& sampler, const AugmentConfig& augment,
                                          const LoaderRegions& regions, std::uint64_t first_batch,
                                          std::uint64_t end, SlotState publish_to,
                                          StageTotals* totals = nullptr);

} // namespace kdflow
