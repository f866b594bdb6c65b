// kdflow data sample (data_command.hpp): the run's datasets and augmentation as prepare_run builds
// them (no teacher, no plan), each asked-for sample drawn as the loader draws it for the epoch.
#include "data_command.hpp"

#include "data_config.hpp"
#include "run.hpp"

#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/config.hpp"
#include "kdflow/core/dataset.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/loader.hpp"
#include "kdflow/cpu_teacher/npy.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
namespace {

// --batch: batch `args.batch` of the epoch exactly as the loader writes it into a slot (its
// samples' draws, then the batch's mix), its float32 values taken back to the pixel scale.
int write_batch(const DataSampleArgs& args, const Config& config, const Dataset& data,
                AugmentConfig augment, std::uint64_t seed) {
  SamplerConfig sc = sampler_config(config);
  sc.shuffle = augment.augment;
  const Sampler sampler(data.size(), sc);
  const auto batches = sampler.batches_per_epoch();
  if (static_cast<std::uint64_t>(args.batch) >= batches)
    throw InputError(fmt::format("--batch {}: an epoch of {} has batches 0 to {} (data.batch_size "
                                 "= {})",
                                 args.batch, data.source(), batches - 1, sc.batch_size));
  augment.normalize = true;
  const SlotLayout layout =
      loader_layout(data, sc.batch_size, true,
                    augment.mixes() ? mix_regions(sc.batch_size) : std::vector<RegionSpec>{});
  std::vector<float> memory(layout.slot_bytes() / sizeof(float) + 1);
  const Slot slot(0, 0, reinterpret_cast<std::byte*>(memory.data()), &layout);
  const LoaderRegions regions = loader_regions(layout);
  LoaderScratch scratch;
  const std::uint64_t global =
      static_cast<std::uint64_t>(args.epoch) * batches + static_cast<std::uint64_t>(args.batch);
  fill_batch(data, sampler, augment, global, slot, regions, scratch);
  const std::size_t n = slot.header().samples;
  const std::size_t plane = static_cast<std::size_t>(data.height()) * data.width();
  auto inputs = slot.region<float>(regions.inputs);
  std::vector<float> pixels(n * data.sample_bytes());
  for (std::size_t i = 0; i < pixels.size(); ++i) {
    const std::size_t c = i / plane % static_cast<std::size_t>(data.channels());
    pixels[i] = (inputs[i] - channel_shift(augment, c)) / channel_scale(augment, c);
  }
  teacher::write_npy(args.out,
                     {static_cast<std::int64_t>(n), data.channels(), data.height(), data.width()},
                     pixels.data());
  const auto labels = slot.region<std::int64_t>(regions.labels);
  const auto ids = slot.region<std::int64_t>(regions.ids);
  nlohmann::json result = {
      {"data", data.source()},
      {"split", args.split},
      {"epoch", args.epoch},
      {"batch", args.batch},
      {"seed", seed},
      {"pixels", args.out},
      {"indices", std::vector<std::int64_t>(ids.begin(), ids.begin() + n)},
      {"labels", std::vector<std::int64_t>(labels.begin(), labels.begin() + n)}};
  const BatchMix m =
      draw_batch_mix(augment, seed, static_cast<std::uint64_t>(args.epoch),
                     static_cast<std::uint64_t>(args.batch), 0, data.height(), data.width());
  result["mix"] = {{"kind", mix_kind_name(m.kind)}};
  if (m.kind != BatchMix::Kind::none) {
    const auto partner = slot.region<std::int64_t>(*regions.mix_labels);
    const auto share = slot.region<float>(*regions.mix_lam);
    result["mix"]["lam"] = m.lam;
    result["mix"]["target_lam"] = m.target_lam;
    if (m.kind == BatchMix::Kind::cutmix) {
      result["mix"]["centre"] = {m.centre_y, m.centre_x};
      result["mix"]["box"] = {m.y1, m.x1, m.y2, m.x2};
    }
    result["mix_labels"] = std::vector<std::int64_t>(partner.begin(), partner.begin() + n);
    result["mix_lam"] = std::vector<float>(share.begin(), share.begin() + n);
  }
  fmt::print("{}\n", result.dump());
  return kExitOk;
}

} // namespace

int data_sample_command(const DataSampleArgs& args) {
  const Config config = resolve_config(args.config, args.sets);
  const Split split = args.split == "test" ? Split::test : Split::train;
  const ImageGeometry geometry = image_geometry(config);
  const Dataset data = Dataset::load(config.get_string("data.dataset"),
                                     config.get_string("data.path"), split, geometry);
  check_geometry(geometry, data);
  AugmentConfig augment = augment_config(config, data);
  augment.augment = split == Split::train;
  const auto seed = static_cast<std::uint64_t>(config.get_int("train.seed"));
  if (args.batch >= 0) return write_batch(args, config, data, augment, seed);
  SampleScratch scratch;
  std::vector<std::uint8_t> pixels(data.sample_bytes());
  std::vector<float> all;
  nlohmann::json samples = nlohmann::json::array();
  if (args.indices.empty()) throw InputError("kdflow data sample: give --index or --batch");
  for (const std::int64_t index : args.indices) {
    if (index < 0 || static_cast<std::uint64_t>(index) >= data.size())
      throw InputError(
          fmt::format("--index {}: {} has samples 0 to {}", index, data.source(), data.size() - 1));
    const auto i = static_cast<std::uint32_t>(index);
    const SampleDraw draw = draw_sample(augment, seed, static_cast<std::uint64_t>(args.epoch), i);
    const auto decoded = augmented_sample(data, i, draw, scratch, pixels.data());
    all.insert(all.end(), pixels.begin(), pixels.end());
    nlohmann::json s = {{"index", index},
                        {"label", data.label(i)},
                        {"flip", draw.flip},
                        {"shift", {draw.dy, draw.dx}}};
    if (draw.jitter.on) { // torchvision's ColorJitter draw: the order and the factors that apply
      const JitterDraw& j = draw.jitter;
      const float factor[4] = {j.brightness, j.contrast, j.saturation, j.hue};
      nlohmann::json order = nlohmann::json::array();
      for (const int op : j.order)
        if (j.applies[static_cast<std::size_t>(op)])
          order.push_back({{"op", op}, {"factor", static_cast<double>(factor[op])}});
      s["jitter"] = order;
    }
    if (data.decodes()) {
      s["file"] = data.file(i);
      s["image"] = {decoded.height, decoded.width};
      const CropBox& b = decoded.box;
      s["box"] = {b.top, b.left, b.height, b.width};
      if (augment.augment && geometry.random_resized) {
        std::vector<double> draws;
        (void)random_resized_crop_box(decoded.height, decoded.width, geometry.range, draw.crop.key,
                                      &draws);
        s["draws"] = draws;
      } else {
        s["crop_at"] = {draw.crop.y, draw.crop.x};
      }
    }
    samples.push_back(std::move(s));
  }
  teacher::write_npy(args.out,
                     {static_cast<std::int64_t>(args.indices.size()), data.channels(),
                      data.height(), data.width()},
                     all.data());
  const nlohmann::json result = {{"data", data.source()},
                                 {"split", args.split},
                                 {"epoch", args.epoch},
                                 {"seed", seed},
                                 {"random_resized_crop", geometry.random_resized},
                                 {"size", geometry.size},
                                 {"resize", geometry.resize},
                                 {"pixels", args.out},
                                 {"samples", samples}};
  fmt::print("{}\n", result.dump());
  return kExitOk;
}

} // namespace kdflow::app
